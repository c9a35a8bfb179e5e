"""`setup(service_name, settings)`: OpenTelemetry SDK providers, exporters and JSON logs for a service.

Only services call this (projector, read API, sweeper, each in its `main`); the client library never
configures OpenTelemetry, the application that embeds it does.

Exporters are configuration, read from the standard variables:
- `OTEL_TRACES_EXPORTER` / `OTEL_METRICS_EXPORTER`: `otlp`, `console` or `none` (comma-separated).
  Unset, OTLP is used only when an OTLP endpoint is configured (`OTEL_EXPORTER_OTLP_ENDPOINT` or the
  signal's own), unlike the spec's default of always `otlp`: a service started without any telemetry
  configuration should not retry a collector on localhost forever.
- The OTLP exporter is `opentelemetry-exporter-otlp-proto-http` (http/protobuf), configured by its own
  `OTEL_EXPORTER_OTLP_*` variables (endpoint, headers, timeout, compression); batching by `OTEL_BSP_*`,
  sampling by `OTEL_TRACES_SAMPLER`, the metric export interval by `OTEL_METRIC_EXPORT_INTERVAL`.
- `OTEL_SERVICE_NAME` / `OTEL_RESOURCE_ATTRIBUTES` override the service name given here.
- `OTEL_SDK_DISABLED=true` turns all of it off (logs stay JSON).

A Prometheus text endpoint serves the same metrics on `GRAPHLEDGER_METRICS_HOST:GRAPHLEDGER_METRICS_PORT`
(`/metrics`, off when the port is unset or 0), for a Prometheus that scrapes the pods directly. Without
that setting, the spec's way works too: `OTEL_EXPORTER_PROMETHEUS_PORT` (and `_HOST`), or
`OTEL_METRICS_EXPORTER=prometheus` for its default `localhost:9464`.

Without a trace exporter no tracer provider is installed: spans would cost the projector about 0.2 ms
per batch for nothing (measured: an SDK span per statement plus the links), so the API's no-op tracer
stays, and log lines carry no trace ids. Likewise the meter provider exists only with a reader.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from importlib.metadata import version
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import OTELResourceDetector, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

from graphledger.settings import Settings
from graphledger_server.telemetry.logs import use_json_logs

log = logging.getLogger(__name__)

SERVICE_NAMESPACE = "graphledger"
_OTLP_PROTOCOL = "http/protobuf"


@dataclass
class Telemetry:
    """What `setup` installed; `shutdown` flushes and stops it (also done at interpreter exit)."""

    service_name: str
    tracer_provider: TracerProvider | None = None
    meter_provider: MeterProvider | None = None
    metrics_address: tuple[str, int] | None = None
    """Where the Prometheus endpoint listens, when it does."""
    trace_exporters: list[str] = field(default_factory=list)
    metric_exporters: list[str] = field(default_factory=list)
    _server: Any = None

    def shutdown(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self.tracer_provider is not None:
            self.tracer_provider.shutdown()
        if self.meter_provider is not None:
            self.meter_provider.shutdown()


_installed: Telemetry | None = None
_lock = threading.Lock()


def setup(service_name: str, settings: Settings) -> Telemetry:
    """Configure this process's telemetry once (JSON logs, tracer and meter providers, exporters).

    A second call returns what the first installed: OpenTelemetry's global providers can be set once.
    """
    global _installed
    with _lock:
        if _installed is not None:
            return _installed
        use_json_logs(service_name)
        if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
            log.info("OpenTelemetry SDK disabled (OTEL_SDK_DISABLED); logging only")
            _installed = Telemetry(service_name)
            return _installed
        resource = _resource(service_name)
        installed = Telemetry(service_name)
        tracer_provider = _tracer_provider(resource, installed)
        if installed.trace_exporters:
            installed.tracer_provider = tracer_provider
            trace.set_tracer_provider(tracer_provider)
        readers = _metric_readers(settings, installed)
        if readers:
            installed.meter_provider = MeterProvider(resource=resource, metric_readers=readers)
            metrics.set_meter_provider(installed.meter_provider)
        log.info(
            "telemetry: traces to %s, metrics to %s",
            ", ".join(installed.trace_exporters) or "nowhere (no exporter configured)",
            ", ".join(installed.metric_exporters) or "nowhere (no exporter or metrics port configured)",
        )
        _installed = installed
        return installed


def _resource(service_name: str) -> Resource:
    attributes: dict[str, str] = {"service.namespace": SERVICE_NAMESPACE, "service.version": version("graphledger")}
    if "service.name" not in OTELResourceDetector().detect().attributes:
        attributes["service.name"] = service_name
    return Resource.create(attributes)


def exporter_names(signal: str) -> list[str]:
    """The exporters `OTEL_<SIGNAL>_EXPORTER` asks for; unset: `otlp` only if an OTLP endpoint is set."""
    raw = os.environ.get(f"OTEL_{signal.upper()}_EXPORTER", "").strip()
    if not raw:
        endpoint = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get(
            f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT"
        )
        return ["otlp"] if endpoint else []
    chosen = [name.strip().lower() for name in raw.split(",") if name.strip()]
    return [] if "none" in chosen else chosen


def _check_protocol(signal: str) -> None:
    protocol = (
        os.environ.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_PROTOCOL")
        or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or _OTLP_PROTOCOL
    ).strip()
    if protocol != _OTLP_PROTOCOL:
        log.warning(
            "OTEL_EXPORTER_OTLP_PROTOCOL=%s: graphledger exports OTLP as %s only (the collector's port 4318); "
            "exporting %s with %s",
            protocol, _OTLP_PROTOCOL, signal, _OTLP_PROTOCOL,
        )  # fmt: skip


def _tracer_provider(resource: Resource, installed: Telemetry) -> TracerProvider:
    provider = TracerProvider(resource=resource)
    for name in exporter_names("traces"):
        exporter: SpanExporter
        if name == "otlp":
            _check_protocol("traces")
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter()
        elif name == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            exporter = ConsoleSpanExporter()
        else:
            log.warning("OTEL_TRACES_EXPORTER: unknown exporter %r ignored (otlp, console, none)", name)
            continue
        provider.add_span_processor(BatchSpanProcessor(exporter))
        installed.trace_exporters.append(name)
    return provider


def _metric_readers(settings: Settings, installed: Telemetry) -> list[MetricReader]:
    readers: list[MetricReader] = []
    for name in exporter_names("metrics"):
        if name == "otlp":
            _check_protocol("metrics")
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

            readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
        elif name == "console":
            from opentelemetry.sdk.metrics.export import ConsoleMetricExporter

            readers.append(PeriodicExportingMetricReader(ConsoleMetricExporter()))
        elif name == "prometheus":
            continue  # the endpoint below
        else:
            log.warning("OTEL_METRICS_EXPORTER: unknown exporter %r ignored (otlp, console, prometheus, none)", name)
            continue
        installed.metric_exporters.append(name)
    address = prometheus_address(settings)
    if address is not None:
        readers.append(_prometheus(*address, installed))
    return readers


def prometheus_address(settings: Settings) -> tuple[str, int] | None:
    """Where to serve `/metrics`: graphledger's setting, else the spec's `OTEL_EXPORTER_PROMETHEUS_*`."""
    if settings.metrics_port:
        return settings.metrics_host, settings.metrics_port
    port = os.environ.get("OTEL_EXPORTER_PROMETHEUS_PORT", "").strip()
    if not port and "prometheus" not in exporter_names("metrics"):
        return None
    host = os.environ.get("OTEL_EXPORTER_PROMETHEUS_HOST", "").strip() or "localhost"
    try:
        return host, int(port or 9464)
    except ValueError:
        log.warning("OTEL_EXPORTER_PROMETHEUS_PORT=%r is not a port; no /metrics endpoint", port)
        return None


def _prometheus(host: str, port: int, installed: Telemetry) -> MetricReader:
    """A Prometheus reader on its own registry (with the process and GC collectors), served over HTTP."""
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector, start_http_server

    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    reader = PrometheusMetricReader(registry=registry)
    server, _thread = start_http_server(port, host, registry=registry)
    installed._server = server
    installed.metrics_address = (host, server.server_port)
    installed.metric_exporters.append(f"prometheus http://{host}:{server.server_port}/metrics")
    return reader
