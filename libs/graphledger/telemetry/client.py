"""The client's spans: one producer span per published event, one HTTP client span per read API call; and
its one metric, how its reads of threads were answered (`count_thread_read`).

The client library never configures OpenTelemetry: it asks the global API for a tracer, so the spans
go wherever the application's tracer provider sends them, and cost next to nothing without one.
Both spans start under the caller's context (captured in the caller's thread, see `propagation`),
so they continue a LangGraph run the application traces. Their own context, not the caller's, is
what travels on: in the record's `traceparent` header, and in the HTTP request's headers.

Attributes follow the messaging (Kafka) and HTTP client semantic conventions. None carries event
content: a record key only on the checkpoint topic, where it is a thread id (its keyed hash when events
are sealed); store keys (namespace and key, which may name a user) are left out.
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping, Sequence
from contextlib import contextmanager
from urllib.parse import urlsplit, urlunsplit

from opentelemetry import metrics, propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from graphledger.telemetry import names

_tracer = trace.get_tracer(names.CLIENT_SCOPE)
_thread_reads = metrics.get_meter(names.CLIENT_SCOPE).create_counter(
    names.CLIENT_THREAD_READS,
    "{read}",
    "Reads of threads, by how the client answered them and why it went to the read API.",
)


def count_thread_read(answered: str, fell_back: str | None) -> None:
    """One read of a thread (`ThreadReads`): `answered` held, folded, new or read_api; `fell_back`, why it
    went to the read API."""
    _thread_reads.add(1, {names.GRAPHLEDGER_READ_ANSWERED: answered, names.GRAPHLEDGER_READ_FELL_BACK: fell_back or ""})


def start_send_span(
    topic: str, event_type: str, event_id: str, size: int, key: str | None, context: Context | None
) -> Span:
    """A producer span for one event (one record, or the chunks of one large event)."""
    attributes: dict[str, str | int] = {
        names.MESSAGING_SYSTEM: names.MESSAGING_SYSTEM_KAFKA,
        names.MESSAGING_DESTINATION_NAME: topic,
        names.MESSAGING_OPERATION_TYPE: "send",
        names.MESSAGING_OPERATION_NAME: "send",
        names.MESSAGING_MESSAGE_ID: event_id,
        names.MESSAGING_MESSAGE_BODY_SIZE: size,
        names.EVENT_TYPE: event_type,
    }
    if key is not None:
        attributes[names.MESSAGING_KAFKA_MESSAGE_KEY] = key
    return _tracer.start_span(f"send {topic}", context, SpanKind.PRODUCER, attributes)


def end_send_span(span: Span, acked: Sequence[tuple[str, int, int]]) -> None:
    """Record where the event landed (its first record, and the record count when chunked)."""
    if span.is_recording() and acked:
        _topic, partition, offset = acked[0]
        span.set_attribute(names.MESSAGING_DESTINATION_PARTITION_ID, str(partition))
        span.set_attribute(names.MESSAGING_KAFKA_OFFSET, offset)
        if len(acked) > 1:
            span.set_attribute(names.MESSAGING_BATCH_MESSAGE_COUNT, len(acked))
    span.end()


def fail_span(span: Span, exc: BaseException) -> None:
    """Mark `span` failed with the exception's class (its message may quote input: not recorded)."""
    if span.is_recording():
        span.set_attribute(names.ERROR_TYPE, type(exc).__qualname__)
        span.set_status(Status(StatusCode.ERROR))
    span.end()


def redact_url(url: str) -> str:
    """`url` without user info, query or fragment: what `url.full` may show of the read API's address."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))


class HttpClientSpan:
    """The span of one read API call; `status` records the answer."""

    def __init__(self, span: Span) -> None:
        self.span = span
        self.failed = False

    def status(self, code: int) -> None:
        if self.span.is_recording():
            self.span.set_attribute(names.HTTP_RESPONSE_STATUS_CODE, code)
            if code >= 400:
                self.failed = True
                self.span.set_attribute(names.ERROR_TYPE, str(code))
                self.span.set_status(Status(StatusCode.ERROR))


@contextmanager
def http_client_span(
    base_url: str, method: str, path: str, headers: MutableMapping[str, str], context: Context | None
) -> Iterator[HttpClientSpan]:
    """An HTTP client span around one call; its context is injected into `headers`.

    `base_url` must already be redacted (`redact_url`); `path` is one of the read API's fixed paths, so
    it is also the URL template.
    """
    parts = urlsplit(base_url)
    attributes: dict[str, str | int] = {
        names.HTTP_REQUEST_METHOD: method,
        names.URL_FULL: base_url + path,
        names.URL_TEMPLATE: path,
        names.SERVER_ADDRESS: parts.hostname or "",
    }
    if parts.port is not None:
        attributes[names.SERVER_PORT] = parts.port
    span = _tracer.start_span(f"{method} {path}", context, SpanKind.CLIENT, attributes)
    # Without an SDK the span is invalid: the caller's context (maybe a remote one) travels on instead.
    propagate.inject(headers, context=trace.set_span_in_context(span, context) if span.get_span_context().is_valid
                     else context)  # fmt: skip
    call = HttpClientSpan(span)
    try:
        yield call
    except BaseException as exc:
        if span.is_recording() and not call.failed:
            # The transport's own error (aiohttp.ClientConnectorError...) when graphledger's wraps one.
            span.set_attribute(names.ERROR_TYPE, type(exc.__cause__ or exc).__qualname__)
            span.set_status(Status(StatusCode.ERROR))
        raise
    finally:
        span.end()
