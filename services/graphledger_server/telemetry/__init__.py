"""OpenTelemetry of the services: traces, metrics and JSON logs (README, "Observability").

- `setup(service_name, settings)`: what each service's `main` calls (SDK providers, exporters from the
  `OTEL_*` variables, the Prometheus endpoint, JSON logs).
- `metrics`: the registry of every metric and its instrument.
- `projector`, `db`, `api`, `sweeper`, `replay`: the spans and measurements of each component.
- `graphledger.telemetry` (the client's): the names, propagation and client spans both sides share.

Nothing here records checkpoint or store content: spans, attributes, metric labels and log lines carry
positions, counts, names and types only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from graphledger.settings import Settings
    from graphledger_server.telemetry.sdk import Telemetry


def setup(service_name: str, settings: Settings) -> Telemetry:
    """Configure the process's OpenTelemetry SDK and JSON logs once; see `graphledger_server.telemetry.sdk`."""
    from graphledger_server.telemetry.sdk import setup as _setup

    return _setup(service_name, settings)


__all__ = ["setup"]
