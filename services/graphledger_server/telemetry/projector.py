"""The projector's spans and metrics: one consumer span per batch, one client span per statement.

Telemetry observes the batch, it does not drive it: the worker applies each batch inside
`ProjectorTelemetry.batch(conn, records)`, which opens the consumer span, hands over the connection
to apply on (traced when the span is recorded), and records the batch's metrics from the result the
worker puts on it, or its failure.

Per batch, never per event: the apply path is benchmarked, and a span or histogram observation per
event would cost it several microseconds each. The batch's `SpanKind.CONSUMER` span links to the
producer span of every event in it (from each record's `traceparent` header), so a trace of an
agent's step leads to the transaction that made its checkpoint visible; the statement spans under it
(`telemetry.db`) show where that transaction spent its time.

Lag is observed, not recorded: the worker hands over the broker's high watermarks after each fetch
(the fetch response's, which tansu reports correctly where its ListOffsets answer runs low) and its
committed next offsets after each batch, and the gauge's callback reads the resulting snapshot when a
reader collects. A snapshot dict is replaced, never mutated, so the exporter thread reads it safely.
"""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from graphledger import ownership
from graphledger.events.checkpoint import CHECKPOINT_EVENT_TYPES
from graphledger.events.envelope import HEADER_TRACEPARENT, header
from graphledger.events.store import STORE_EVENT_TYPES
from graphledger.telemetry import names
from graphledger.telemetry.propagation import span_context_of
from graphledger_server.telemetry import metrics
from graphledger_server.telemetry.db import TracedConnection, db_namespace

if TYPE_CHECKING:
    from graphledger.log.records import LogRecord
    from graphledger.settings import Settings
    from graphledger_server.projection.batch import BatchResult

_tracer = trace.get_tracer(names.PROJECTOR_SCOPE)

KNOWN_EVENT_TYPES = frozenset(CHECKPOINT_EVENT_TYPES) | frozenset(STORE_EVENT_TYPES)
"""Event types reported as themselves; any other (a typo, a newer client, garbage) is `other`, which
bounds the metric's label values whatever the records say."""
DEFAULT_LINK_LIMIT = 128
"""The SDK's default `OTEL_SPAN_LINK_COUNT_LIMIT`; links past the limit are counted, not parsed."""

TopicPartition = tuple[str, int]

_batch_size = metrics.instrument(metrics.PROJECTOR_BATCH_SIZE)
_apply_duration = metrics.instrument(metrics.PROJECTOR_APPLY_DURATION)
_freshness = metrics.instrument(metrics.PROJECTOR_FRESHNESS)
_applied = metrics.instrument(metrics.PROJECTOR_EVENTS_APPLIED)
_dead_lettered = metrics.instrument(metrics.PROJECTOR_EVENTS_DEAD_LETTERED)
_skipped = metrics.instrument(metrics.PROJECTOR_EVENTS_SKIPPED)
_failures = metrics.instrument(metrics.PROJECTOR_BATCH_FAILURES)
_forks = metrics.instrument(metrics.PROJECTOR_FORKS)
_refused = metrics.instrument(metrics.PROJECTOR_WRITES_REFUSED)
_erased = metrics.instrument(metrics.PROJECTOR_ERASED_RECORDS)
_offset_commit_failures = metrics.instrument(metrics.PROJECTOR_OFFSET_COMMIT_FAILURES)
_log_gaps = metrics.instrument(metrics.PROJECTOR_LOG_GAPS)

_workers: weakref.WeakSet[ProjectorTelemetry] = weakref.WeakSet()


def event_type_label(event_type: str | None) -> str:
    """The `graphledger.event.type` value for an event type: itself if known, else `other`."""
    return event_type if event_type in KNOWN_EVENT_TYPES else names.OTHER


def offset_commit_failed(exc: BaseException) -> None:
    """A commit of applied offsets to the consumer group in Kafka failed (monitoring only)."""
    _offset_commit_failures.add(1, {names.ERROR_TYPE: type(exc).__qualname__})


def log_gap(read_past: bool) -> None:
    """The projector met offsets a fetch passed over (`log.gaps.GapWatch.on_gap`)."""
    _log_gaps.add(1, {names.GRAPHLEDGER_GAP_OUTCOME: "read_past" if read_past else "fetched_again"})


def _observe_lag() -> Iterator[tuple[float, dict[str, Any]]]:
    for worker in list(_workers):
        for (topic, partition), lag in worker.lag.items():
            yield (
                lag,
                {
                    names.MESSAGING_DESTINATION_NAME: topic,
                    names.MESSAGING_DESTINATION_PARTITION_ID: str(partition),
                    names.MESSAGING_CONSUMER_GROUP_NAME: worker.group,
                },
            )


def _observe_stopped() -> Iterator[tuple[float, dict[str, Any]]]:
    for worker in list(_workers):
        for topic, partition in worker.lost_log:
            yield (
                1,
                {
                    names.MESSAGING_DESTINATION_NAME: topic,
                    names.MESSAGING_DESTINATION_PARTITION_ID: str(partition),
                    names.MESSAGING_CONSUMER_GROUP_NAME: worker.group,
                    names.GRAPHLEDGER_STOP_REASON: "lost_log",
                },
            )


def _observe_parked() -> Iterator[tuple[float, dict[str, Any]]]:
    counts: dict[tuple[str, str], int] = {}
    for worker in list(_workers):  # workers of one process count the same table: one value per series
        for key, count in worker.parked.items():
            counts[key] = max(count, counts.get(key, 0))
    for (topic, cause), count in counts.items():
        yield count, {names.MESSAGING_DESTINATION_NAME: topic, names.GRAPHLEDGER_PARK_CAUSE: cause}


def _observe_dead_letters() -> Iterator[tuple[float, dict[str, Any]]]:
    counts: dict[str, int] = {}
    for worker in list(_workers):  # workers of one process count the same table: one value per topic
        for topic, count in worker.outstanding_dead_letters.items():
            counts[topic] = max(count, counts.get(topic, 0))
    for topic, count in counts.items():
        yield count, {names.MESSAGING_DESTINATION_NAME: topic}


def _link_limit() -> int | None:
    raw = os.environ.get("OTEL_SPAN_LINK_COUNT_LIMIT", "").strip().lower()
    if raw == "unset":
        return None
    try:
        return max(0, int(raw)) if raw else DEFAULT_LINK_LIMIT
    except ValueError:
        return DEFAULT_LINK_LIMIT


class ObservedBatch:
    """One batch under observation: the connection to apply it on, and its result once applied."""

    __slots__ = ("conn", "result")

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.result: BatchResult | None = None


class ProjectorTelemetry:
    """Spans and metrics of one projector worker (one consumer-group member)."""

    def __init__(self, settings: Settings) -> None:
        self.group = settings.projector_group_id
        self.namespace = db_namespace(settings.postgres_dsn, settings.postgres_schema)
        self.lag: Mapping[TopicPartition, int] = {}
        """Records behind per assigned partition, as of the last fetch or commit (a snapshot)."""
        self.lost_log: frozenset[TopicPartition] = frozenset()
        """Partitions stopped on a lost log (a snapshot, replaced by the worker)."""
        self.outstanding_dead_letters: Mapping[str, int] = {}
        """Dead letters not replayed yet per source topic, as last counted (a snapshot)."""
        self.parked: Mapping[tuple[str, str], int] = {}
        """Parked subjects per (topic, cause), as last counted (a snapshot); every cause of every topic the
        worker consumes has a series, 0 when none is parked."""
        self._committed: dict[TopicPartition, int] = {}
        self._consumer: Any = None
        _workers.add(self)
        _skipped.add(0)  # reported from the start, so a panel or alert on redeliveries has a series before one
        for kind in ("fork", "branch"):  # likewise for forks and branches
            _forks.add(0, {names.GRAPHLEDGER_FORK_KIND: kind})
        for cause in (ownership.SUPERSEDED, ownership.THREAD_CHANGED):  # and for refusals
            _refused.add(0, {names.GRAPHLEDGER_REFUSAL_CAUSE: cause})
        metrics.observe(metrics.PROJECTOR_LAG, _observe_lag)
        metrics.observe(metrics.PROJECTOR_PARTITIONS_STOPPED, _observe_stopped)
        metrics.observe(metrics.DEAD_LETTERS_OUTSTANDING, _observe_dead_letters)
        metrics.observe(metrics.PROJECTOR_SUBJECTS_PARKED, _observe_parked)

    # -- positions, for the lag gauge -------------------------------------------------------------------

    def assigned(self, next_offsets: Mapping[TopicPartition, int]) -> None:
        """The stored next offsets of newly assigned partitions (0 for a partition never applied)."""
        self._committed.update(next_offsets)
        self._refresh()

    def fetched(self, consumer: Any) -> None:
        """After a fetch: the consumer's high watermarks and assignment are current."""
        self._consumer = consumer
        self._refresh()

    def _refresh(self) -> None:
        consumer = self._consumer
        if consumer is None:
            return
        lag: dict[TopicPartition, int] = {}
        for tp in consumer.assignment():
            key = (tp.topic, tp.partition)
            high = consumer.highwater(tp)
            committed = self._committed.get(key)
            if high is not None and committed is not None:
                lag[key] = max(0, high - committed)
        self.lag = lag

    # -- batches ------------------------------------------------------------------------------------------

    @contextmanager
    def batch(self, conn: Any, records: Sequence[LogRecord]) -> Iterator[ObservedBatch]:
        """The batch's consumer span, linked to its producers; apply on `.conn` and set `.result`.

        Statements on `.conn` get client spans under the batch span. On exit the span gets the
        result's counts and the metrics record the batch; a failure is counted by its SQLSTATE or
        class (a cancellation on stop is not a failure) and re-raised.
        """
        topics = {r.topic for r in records}
        topic = next(iter(topics)) if len(topics) == 1 else None
        attributes: dict[str, str | int] = {
            names.MESSAGING_SYSTEM: names.MESSAGING_SYSTEM_KAFKA,
            names.MESSAGING_OPERATION_TYPE: "process",
            names.MESSAGING_OPERATION_NAME: "apply",
            names.MESSAGING_CONSUMER_GROUP_NAME: self.group,
            names.MESSAGING_BATCH_MESSAGE_COUNT: len(records),
        }
        if topic is not None:
            attributes[names.MESSAGING_DESTINATION_NAME] = topic
        with _tracer.start_as_current_span(
            f"apply {topic}" if topic else "apply",
            kind=SpanKind.CONSUMER,
            attributes=attributes,
            record_exception=False,  # exception messages may quote values (Postgres DETAIL lines)
            set_status_on_exception=False,
        ) as span:
            recording = span.is_recording()
            if recording:
                _link_producers(span, records)
            # Statement spans only under a recorded batch span (no SDK, or sampled out: none at all).
            observed = ObservedBatch(TracedConnection(conn, self.namespace) if recording else conn)
            started = time.perf_counter()
            try:
                yield observed
            except BaseException as exc:
                error = getattr(exc, "sqlstate", None) or type(exc).__qualname__
                if isinstance(exc, Exception):  # not a cancellation on stop
                    _failures.add(1, {names.ERROR_TYPE: error})
                if recording:
                    span.set_attribute(names.ERROR_TYPE, error)
                    span.set_status(Status(StatusCode.ERROR))
                raise
            elapsed = time.perf_counter() - started
            committed_ms = time.time() * 1000
            result = observed.result
            if result is None:
                raise RuntimeError("a batch observed by ProjectorTelemetry.batch ended without its result")
            if recording:
                span.set_attribute(names.BATCH_APPLIED, result.applied)
                span.set_attribute(names.BATCH_DEAD_LETTERS, result.dead_letters)
                span.set_attribute(names.BATCH_SKIPPED, result.skipped)
                if result.isolated:
                    span.set_attribute(names.BATCH_ISOLATED, True)
        self._record(records, result, elapsed, committed_ms)

    def _record(self, records: Sequence[LogRecord], result: BatchResult, elapsed: float, committed_ms: float) -> None:
        _batch_size.record(len(records))
        _apply_duration.record(elapsed)
        for topic, ts in _oldest_timestamps(records).items():
            _freshness.record(max(0.0, committed_ms - ts) / 1000, {names.MESSAGING_DESTINATION_NAME: topic})
        for event_type, count in result.applied_by_type.items():
            if count:
                _applied.add(count, {names.EVENT_TYPE: event_type_label(event_type)})
        for event_type, count in result.dead_letters_by_type.items():
            _dead_lettered.add(count, {names.EVENT_TYPE: event_type_label(event_type)})
        if result.skipped:
            _skipped.add(result.skipped)
        if result.forks:
            _forks.add(result.forks, {names.GRAPHLEDGER_FORK_KIND: "fork"})
        if result.branches:
            _forks.add(result.branches, {names.GRAPHLEDGER_FORK_KIND: "branch"})
        for cause, count in result.refusals.items():
            _refused.add(count, {names.GRAPHLEDGER_REFUSAL_CAUSE: cause})
        for event_type, count in result.erased_by_type.items():
            _erased.add(count, {names.EVENT_TYPE: event_type_label(event_type)})
        if result.next_offsets:
            self._committed.update(result.next_offsets)
            self._refresh()


def _oldest_timestamps(records: Sequence[LogRecord]) -> dict[str, int]:
    """The smallest known record timestamp per topic (one pass; one topic is the common case)."""
    first = records[0].topic if records else ""
    if all(r.topic == first for r in records):
        known = [r.timestamp for r in records if r.timestamp >= 0]
        return {first: min(known)} if known else {}
    oldest: dict[str, int] = {}
    for r in records:
        if r.timestamp >= 0 and r.timestamp < oldest.get(r.topic, r.timestamp + 1):
            oldest[r.topic] = r.timestamp
    return oldest


def _link_producers(span: Span, records: Sequence[LogRecord]) -> None:
    """Link `span` to each distinct producer span of `records`, up to the SDK's link limit."""
    limit = _link_limit()
    seen: set[bytes] = set()
    linked = 0
    for record in records:
        value = header(record.headers, HEADER_TRACEPARENT)
        if value is None or value in seen:
            continue
        seen.add(value)
        if limit is not None and linked >= limit:
            continue
        context = span_context_of(value)
        if context is not None:
            span.add_link(context)
            linked += 1
    if limit is not None and len(seen) > limit:
        span.set_attribute(names.BATCH_LINKS_DROPPED, len(seen) - limit)
