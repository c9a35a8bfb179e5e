"""OpenTelemetry for graphledger: traces, metrics and JSON logs (DESIGN invariant 8).

- `setup(service_name, settings)`: what each service's `main` calls (SDK providers, exporters from the
  `OTEL_*` variables, the Prometheus endpoint, JSON logs). The client library never calls it.
- `names`: tracer, meter and attribute names; `metrics`: the registry of every metric and its
  instrument; `propagation`: trace context across threads and Kafka headers.
- `client`, `projector`, `db`, `api`, `sweeper`: the spans and measurements of each component.

Nothing here records checkpoint or store content: spans, attributes, metric labels and log lines carry
positions, counts, names and types only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from graphledger.settings import Settings
    from graphledger.telemetry.sdk import Telemetry


def setup(service_name: str, settings: Settings) -> Telemetry:
    """Configure the process's OpenTelemetry SDK and JSON logs once; see `graphledger.telemetry.sdk`."""
    from graphledger.telemetry.sdk import setup as _setup

    return _setup(service_name, settings)


__all__ = ["setup"]
