"""A real OTLP/HTTP receiver for tests: decodes what exporters POST to /v1/traces and /v1/metrics.

An in-process `ThreadingHTTPServer` on a free loopback port, speaking http/protobuf as the collector
does (200 with an empty `Export*ServiceResponse`). It keeps every request body as received, so a test
can search the raw bytes for strings that must never be exported, and the decoded spans and metrics,
flattened with their resource's `service.name`. `wait_for` blocks on a condition variable that each
request notifies: no polling, no sleeps.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

# opentelemetry.proto.trace.v1.Span.SpanKind
KIND_INTERNAL, KIND_SERVER, KIND_CLIENT, KIND_PRODUCER, KIND_CONSUMER = 1, 2, 3, 4, 5


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return [_value(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    return getattr(value, which) if which else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in pairs if isinstance(kv, KeyValue)}


@dataclass(frozen=True)
class Link:
    trace_id: str
    span_id: str


@dataclass(frozen=True)
class ReceivedSpan:
    """One exported span, ids as lower-case hex, with its resource's service name."""

    service: str
    scope: str
    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: int
    attributes: dict[str, Any]
    links: tuple[Link, ...]
    status_code: int
    dropped_links: int


@dataclass(frozen=True)
class ReceivedMetric:
    service: str
    name: str
    unit: str
    points: list[tuple[dict[str, Any], Any]] = field(default_factory=list)
    """(attributes, value) per data point: a number, or (count, sum) for a histogram."""


class OtlpReceiver:
    """Collects OTLP/HTTP exports; use as a context manager, point exporters at `endpoint`."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.spans: list[ReceivedSpan] = []
        self.metrics: list[ReceivedMetric] = []
        self._changed = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path == "/v1/traces":
                    answer = ExportTraceServiceResponse()
                    receiver._traces(ExportTraceServiceRequest.FromString(body), body)
                elif self.path == "/v1/metrics":
                    answer = ExportMetricsServiceResponse()
                    receiver._metrics(ExportMetricsServiceRequest.FromString(body), body)
                else:
                    self.send_error(404)
                    return
                data = answer.SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-receiver", daemon=True)

    @property
    def endpoint(self) -> str:
        """The base URL for `OTEL_EXPORTER_OTLP_ENDPOINT` (exporters append `/v1/traces` and so on)."""
        return f"http://127.0.0.1:{self._server.server_port}"

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._server.shutdown()
        self._server.server_close()

    def wait_for(self, condition: Callable[[], Any], timeout: float) -> Any:
        """Block until `condition()` is truthy (re-checked on every export); return it, or raise on timeout."""
        with self._changed:
            result = self._changed.wait_for(condition, timeout)
        if not result:
            raise TimeoutError(f"no export satisfied the condition within {timeout}s")
        return result

    # -- decoding, on the server's threads ---------------------------------------------------------

    def _traces(self, request: ExportTraceServiceRequest, body: bytes) -> None:
        decoded = []
        for resource_spans in request.resource_spans:
            service = str(_attributes(resource_spans.resource.attributes).get("service.name", ""))
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    decoded.append(
                        ReceivedSpan(
                            service=service,
                            scope=scope_spans.scope.name,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            name=span.name,
                            kind=span.kind,
                            attributes=_attributes(span.attributes),
                            links=tuple(Link(link.trace_id.hex(), link.span_id.hex()) for link in span.links),
                            status_code=span.status.code,
                            dropped_links=span.dropped_links_count,
                        )
                    )
        with self._changed:
            self.bodies.append(body)
            self.spans.extend(decoded)
            self._changed.notify_all()

    def _metrics(self, request: ExportMetricsServiceRequest, body: bytes) -> None:
        decoded = []
        for resource_metrics in request.resource_metrics:
            service = str(_attributes(resource_metrics.resource.attributes).get("service.name", ""))
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    points: list[tuple[dict[str, Any], Any]] = []
                    kind = metric.WhichOneof("data")
                    for point in getattr(metric, kind).data_points if kind else ():
                        if kind == "histogram":
                            points.append((_attributes(point.attributes), (point.count, point.sum)))
                        else:
                            number = point.as_int if point.WhichOneof("value") == "as_int" else point.as_double
                            points.append((_attributes(point.attributes), number))
                    decoded.append(ReceivedMetric(service, metric.name, metric.unit, points))
        with self._changed:
            self.bodies.append(body)
            self.metrics.extend(decoded)
            self._changed.notify_all()
