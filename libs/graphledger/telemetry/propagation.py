"""W3C trace context across the hops graphledger adds: caller thread -> client loop -> Kafka -> projector.

The client captures the caller's OpenTelemetry `Context` in the caller's thread (the background loop
runs in another thread, where the caller's context is not current) and starts its spans under it.
Kafka headers carry `traceparent` formatted here directly, whatever propagators the application
configured: the header is part of graphledger's event format (docs/architecture.md, "Topics"). The projector
parses it back into a `SpanContext` for its span links; a malformed header (records are untrusted
input) yields no link rather than an error.
"""

from __future__ import annotations

import re

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanContext, TraceFlags

_TRACEPARENT = re.compile(rb"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(?:-.*)?$")


def caller_context() -> Context:
    """The calling thread's current context, to carry to the thread that does the work."""
    return otel_context.get_current()


def traceparent(span: Span, parent: Context | None = None) -> str | None:
    """The `traceparent` value for `span`, or for `parent`'s span when `span` is invalid.

    Without an SDK the tracer returns an invalid span; the caller's context (maybe a remote one the
    application extracted) is then what travels on, as it did before graphledger had spans.
    """
    ctx = span.get_span_context()
    if not ctx.is_valid and parent is not None:
        ctx = trace.get_current_span(parent).get_span_context()
    if not ctx.is_valid:
        return None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def span_context_of(header: bytes | None) -> SpanContext | None:
    """The remote `SpanContext` in a `traceparent` header value, or None when absent or malformed."""
    if not header or len(header) > 512:
        return None
    match = _TRACEPARENT.match(header)
    if match is None or match.group(1) == b"ff":
        return None
    trace_id, span_id = int(match.group(2), 16), int(match.group(3), 16)
    if not trace_id or not span_id:
        return None
    return SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(int(match.group(4), 16) & 0x01))
