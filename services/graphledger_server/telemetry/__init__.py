"""OpenTelemetry of the services: traces, metrics and JSON logs (docs/observability.md).

- `setup(service_name, settings)`: what each service's `main` calls (SDK providers, exporters from the
  `OTEL_*` variables, the Prometheus endpoint, JSON logs).
- `metrics`: the registry of every metric and its instrument.
- `projector`, `db`, `api`, `sweeper`, `replay`: the spans and measurements of each component.
- `graphledger.telemetry` (the client's): the names, propagation and client spans both sides share.

Nothing here records checkpoint or store content: spans, attributes, metric labels and log lines carry
positions, counts, names and types only.
"""

from __future__ import annotations

import logging

from graphledger.settings import Settings


def setup(service_name: str, settings: Settings | None = None) -> Settings:
    """Configure the process's OpenTelemetry SDK and JSON logs once (`graphledger_server.telemetry.sdk`);
    returns the settings. Without `settings`, the service was started as a module (`python -m
    graphledger_server.projector`): they come from `GRAPHLEDGER_*` variables, and it logs at INFO, as
    the `graphledger` command does by default."""
    from graphledger_server.telemetry.sdk import setup as _setup

    if settings is None:
        logging.getLogger().setLevel(logging.INFO)
        settings = Settings()
    _setup(service_name, settings)
    return settings


__all__ = ["setup"]
