"""The test process as an application that traces: one SDK tracer provider, and gated span capture.

OpenTelemetry's global tracer provider can be set once per process, and graphledger's client and
projector code take their tracers from it (as they would from an application's). Tests that look at
spans share this one provider and attach a processor for their own duration only (`Gate`): closed,
it forwards nothing, so later tests' spans go nowhere.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

AGENT_SERVICE = "test-agent"


def sdk_tracer_provider() -> TracerProvider:
    """The process's SDK tracer provider (service `test-agent`), installed on first use."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        trace.set_tracer_provider(TracerProvider(resource=Resource.create({"service.name": AGENT_SERVICE})))
        provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider), "the global tracer provider is not an SDK one"
    return provider


class Gate(SpanProcessor):
    """Forwards ended spans to `inner` while open."""

    def __init__(self, inner: SpanProcessor) -> None:
        self.inner = inner
        self.open = True

    def on_end(self, span: ReadableSpan) -> None:
        if self.open:
            self.inner.on_end(span)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)

    def close(self) -> None:
        self.open = False
        self.inner.shutdown()


@contextmanager
def gated(processor: SpanProcessor) -> Iterator[None]:
    """`processor` receives the spans that end inside the `with` block."""
    gate = Gate(processor)
    sdk_tracer_provider().add_span_processor(gate)
    try:
        yield
    finally:
        gate.close()


@contextmanager
def captured_spans() -> Iterator[InMemorySpanExporter]:
    """The spans that end inside the `with` block, in memory."""
    exporter = InMemorySpanExporter()
    with gated(SimpleSpanProcessor(exporter)):
        yield exporter
