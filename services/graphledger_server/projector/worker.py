"""The projector's consumer loop: fetch a batch, apply it in one transaction, repeat.

Progress lives in Postgres (`graphledger_offsets`, written with the rows): on every assignment the
consumer pauses the new partitions, seeks them to the stored offsets, and only then resumes them. The
same offsets are also committed to the consumer group in Kafka after each batch, for Kafka's lag tools
only (`group_offsets`); nothing reads them back. A batch that fails on an error
`driver_errors.verdict_of` calls `RETRY` (connection lost, serialization failure, deadlock, Kafka
unreachable for a dead letter) is rolled back and retried as is, after a capped backoff; it is never
skipped. A partition whose log lost records the projection
applied is stopped, not reset (`log_guard`). A record no version of this projector can apply parks its
subject and the partition moves on (`projection/parking.py`); every `PARKED_CHECK_S` the worker counts the
parked subjects for their gauge and releases, on its partitions, those it may apply now (an event of a
version it reads, a copy barrier whose copy has applied). The loop reports its steps to `health`
(`/livez`, `/readyz`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import asyncpg
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import NoOffsetForPartitionError, OffsetOutOfRangeError
from aiokafka.structs import ConsumerRecord

from graphledger.errors import ParkedSubjectError
from graphledger.events import envelope
from graphledger.log.gaps import GapWatch
from graphledger.log.layout import PartitionCheckedProducer
from graphledger.log.records import LogRecord
from graphledger.log.tail import LogTail
from graphledger.opening.records import Classified, DeadLetter
from graphledger.retry import Backoff, retried
from graphledger.settings import Settings
from graphledger.tasks import set_within
from graphledger_server.driver_errors import Verdict, verdict_of
from graphledger_server.health.state import WorkerHealth, caught_up
from graphledger_server.keys.key_store import key_store_for
from graphledger_server.keys.lookup import DataKeyCache
from graphledger_server.log import parked
from graphledger_server.log.clients import new_consumer, new_producer
from graphledger_server.log.ends import log_ends
from graphledger_server.log.offsets import OffsetStatements, next_offsets, stored_offsets
from graphledger_server.log.parked import Cause, ParkedStatements, ParkedSubject
from graphledger_server.projection.batch import BatchApplier, BatchResult, TopicProjection
from graphledger_server.projection.checkpoints import CheckpointProjection
from graphledger_server.projection.dead_letters import outstanding, produce_dead_letters
from graphledger_server.projection.parked_release import release_parked
from graphledger_server.projection.parking import releasable
from graphledger_server.projection.store import StoreProjection
from graphledger_server.projector.group_offsets import GroupOffsetMirror
from graphledger_server.projector.log_guard import LogGuard
from graphledger_server.telemetry.projector import ProjectorTelemetry, log_gap

log = logging.getLogger(__name__)

T = TypeVar("T")
BACKOFF_INITIAL_S = 0.1
IDLE_POLL_MS = 200
"""How long one empty fetch waits: also the longest a stop request waits for an idle worker."""
DEAD_LETTER_COUNT_INTERVAL_S = 30.0
"""How often the outstanding dead-letter gauge is recounted (`graphledger dlq replay` changes it)."""
REVOKE_WAIT_S = 10.0
"""How long a rebalance waits for the in-flight batch before giving the partitions up anyway."""
PAUSE_RETRY_S = 0.05
"""How long a partition held at an event waits before it is fetched again (`BatchResult.paused`)."""
RESET_POLL_S = 1.0
"""How often a worker with stopped partitions looks for an operator's `graphledger offsets reset`."""
PARKED_CHECK_S = 2.0
"""How often a worker counts the parked subjects and releases those it may (`check_parked`)."""


def projections_for(settings: Settings) -> dict[str, TopicProjection]:
    """The topics the projector consumes and each one's projection."""
    return {
        settings.checkpoint_topic: CheckpointProjection(settings.postgres_schema),
        settings.store_topic: StoreProjection(settings.postgres_schema, settings.erasure_namespace_depth),
    }


LOG_APPEND_TIME = 1
"""A record batch's timestamp type when the broker stamped it (`message.timestamp.type=LogAppendTime`)."""


def _warn_of_create_time(record: ConsumerRecord[bytes, bytes], warned: set[str]) -> None:
    """Once per topic: its records carry their producers' time, so a writer's clock dates its events."""
    if record.timestamp_type != LOG_APPEND_TIME and record.topic not in warned:
        warned.add(record.topic)
        log.warning(
            "records of %s carry their producer's time (CreateTime), not the broker's: store expiry and thread "
            "idle times follow the writers' clocks. Set message.timestamp.type=LogAppendTime on it (`graphledger "
            "topics ensure` does on the topics it creates; tansu keeps CreateTime whatever the topic says)",
            record.topic,
        )


class _SeekToStored(ConsumerRebalanceListener):  # type: ignore[misc]  # aiokafka ships no types
    """Seeks newly assigned partitions to their stored offsets; lets a revoke wait for the batch."""

    def __init__(self, worker: ProjectorWorker) -> None:
        self.worker = worker

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self.worker.forget(revoked)
        # Finishing the in-flight batch first spares the next owner re-reading it; correctness does
        # not depend on it (the offset row lock fences a late commit).
        try:
            await asyncio.wait_for(self.worker.batch_lock.acquire(), REVOKE_WAIT_S)
        except TimeoutError:
            log.warning("rebalance did not wait for the in-flight batch after %.0fs", REVOKE_WAIT_S)
            return
        self.worker.batch_lock.release()

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        # Paused before the first await: the fetcher would otherwise start from the offsets committed
        # to Kafka (monitoring only) while the stored ones are being read.
        self.worker.consumer.pause(*assigned)  # type: ignore[union-attr]  # assigned: the consumer runs
        try:
            await self.worker.check_partition_counts()
            await self.worker.seek_to_stored(assigned)
        except BaseException as exc:
            self.worker.assignment_failed = exc  # aiokafka only logs a listener's error: the loop raises it
            raise


class ProjectorWorker:
    """One consumer-group member: an aiokafka consumer, a dead-letter producer and an asyncpg pool."""

    def __init__(self, settings: Settings, projections: dict[str, TopicProjection] | None = None) -> None:
        self.settings = settings
        self.projections = projections or projections_for(settings)
        self.topics = list(self.projections)
        self.applier = BatchApplier(
            settings.postgres_schema,
            settings.projector_group_id,
            self.projections,
            self._produce_dead_letters,
            # What a batch holds: at most batch_max_bytes of records plus as much of stored chunks.
            reassembly_max_bytes=settings.batch_max_bytes,
            clear_refused=settings.clear_events_refused,
        )
        self.batch_lock = asyncio.Lock()
        self.pool: asyncpg.Pool | None = None
        self.consumer: AIOKafkaConsumer | None = None
        self.producer: PartitionCheckedProducer | None = None
        self.log_tail: LogTail | None = None
        """Where the logs of copy barriers' copies end, on the dead-letter producer's client (made when a
        barrier is first met)."""
        self._offsets = OffsetStatements(settings.postgres_schema)
        self._parked = ParkedStatements(settings.postgres_schema)
        self._parked_checked = -PARKED_CHECK_S
        self._stop = asyncio.Event()
        self.guard = LogGuard()
        self.gaps = GapWatch(on_gap=log_gap)
        """Offsets a fetch passed over (`log.gaps`): fetched again from the first, not skipped."""
        self._reset_checked = 0.0
        self._paused: dict[TopicPartition, float] = {}
        """Partitions paused at an event that waits for another partition, and when to fetch them again."""
        self.batches = 0
        self.events = 0
        self.telemetry = ProjectorTelemetry(settings)
        self._dead_letters_counted = -DEAD_LETTER_COUNT_INTERVAL_S
        self.health = WorkerHealth(settings.health_deadline_s, not_ready_reason="waiting for a partition assignment")
        self.group_offsets: GroupOffsetMirror | None = None
        self.assignment_failed: BaseException | None = None
        self._create_time_topics: set[str] = set()
        """Topics whose records were met stamped with their producer's time (warned of once)."""

    # -- lifecycle -----------------------------------------------------------------------------------

    async def start(self) -> None:
        s = self.settings
        self.pool = await asyncpg.create_pool(s.postgres_dsn, min_size=1, max_size=2, reset=_session_kept)
        self.applier.keys = DataKeyCache(key_store_for(s, self.pool))
        async with self.pool.acquire() as conn:
            for projection in self.projections.values():
                await projection.prepare(conn)  # before classifying events (the store's vector dims)
        self.producer = new_producer(s)
        await self.producer.start()
        # Never reset silently: an offset the log no longer has stops the partition (log_guard).
        self.consumer = new_consumer(s, group_id=s.projector_group_id, auto_offset_reset="none")
        self.applier.log_ends = self._log_ends
        self.group_offsets = GroupOffsetMirror(self.consumer)
        self.consumer.subscribe(self.topics, listener=_SeekToStored(self))
        await self.consumer.start()
        log.info("projector consuming %s as group %s into schema %s", self.topics, s.projector_group_id,
                 s.postgres_schema)  # fmt: skip

    async def close(self) -> None:
        """Leave the group (its partitions go to the other workers now), then close the rest."""
        self.telemetry.parked = {}  # the workers still running count them
        try:
            if self.group_offsets is not None:
                await self.group_offsets.close()
            if self.consumer is not None:
                await self.consumer.stop()
        finally:
            try:
                if self.producer is not None:
                    await self.producer.stop()
            finally:
                if self.pool is not None:
                    await self.pool.close()

    async def run(self, stop: asyncio.Event) -> None:
        """Apply batches until `stop` is set; the batch in flight then finishes (or, if it is
        waiting to retry, is abandoned uncommitted).

        Fetching the next batch while the previous one applies was tried and measured no faster on
        two cores (the broker, Postgres and this process already share them), so batches go in turn.
        """
        self._stop = stop
        while not stop.is_set():
            if time.monotonic() - self._dead_letters_counted >= DEAD_LETTER_COUNT_INTERVAL_S:
                await self.count_dead_letters()
            records = await self.next_batch(stop)
            if records and not stop.is_set():  # on stop, a batch not started is left to the next worker
                result = await self.apply_with_retry(records, stop)
                if result is not None:
                    self.commit_to_kafka(result.next_offsets)
                if result is not None and result.dead_letters:
                    await self.count_dead_letters()
                if result is not None and result.parked:
                    self._parked_checked = -PARKED_CHECK_S  # counted at once, for the alert

    def commit_to_kafka(self, next_offsets: dict[tuple[str, int], int]) -> None:
        """Mirror offsets Postgres committed into the group in Kafka, for lag tools (`group_offsets`)."""
        if self.group_offsets is not None:
            self.group_offsets.submit(next_offsets)

    async def count_dead_letters(self) -> None:
        """Recount the outstanding dead letters for their gauge; a failure only delays the gauge."""
        assert self.pool is not None
        self._dead_letters_counted = time.monotonic()
        try:
            async with self.pool.acquire() as conn:
                counts = await outstanding(conn, self.settings.postgres_schema, self.topics)
        except Exception as exc:
            if verdict_of(exc) is not Verdict.RETRY:
                raise
            log.warning("cannot count dead letters (%s); the gauge keeps its last value", exc)
            return
        self.telemetry.outstanding_dead_letters = counts

    async def _log_ends(self, partitions: set[tuple[str, int]]) -> dict[tuple[str, int], int]:
        assert self.producer is not None
        if self.log_tail is None:
            self.log_tail = LogTail(self.settings, self.producer.client)
        return await log_ends(self.log_tail, partitions, self.settings.consistency_timeout_s)

    async def check_parked(self) -> None:
        """Count the parked subjects for their gauge, and release those of this worker's partitions it may
        apply now (`parking.releasable`); a failure only delays both."""
        assert self.pool is not None and self.consumer is not None
        self._parked_checked = time.monotonic()
        try:
            async with self.pool.acquire() as conn:
                found = await parked.subjects(conn, self._parked)
                applied = await self._copies_applied(conn, found)
        except Exception as exc:
            if verdict_of(exc) is not Verdict.RETRY:
                raise
            log.warning("cannot read the parked subjects (%s); their gauge keeps its last value", exc)
            return
        counts = {(topic, str(cause)): 0 for topic in self.topics for cause in Cause}
        for subject in found:
            counts[(subject.topic, str(subject.cause))] = counts.get((subject.topic, str(subject.cause)), 0) + 1
        self.telemetry.parked = counts
        mine = {(tp.topic, tp.partition) for tp in self.consumer.assignment()}
        for subject in found:
            if subject.tp in mine and releasable(subject, envelope.SCHEMA_VERSION, subject in applied):
                await self._release(subject)
                self._parked_checked = -PARKED_CHECK_S  # counted again at once

    async def _copies_applied(self, conn: asyncpg.Connection, found: list[ParkedSubject]) -> set[ParkedSubject]:
        """The `copy_parked` subjects of `found` whose copy has applied: its partition passed it and no
        parked subject holds it."""
        waiting = {s: (s.topic, *s.waits_for) for s in found if s.waits_for is not None}
        if not waiting:
            return set()
        passed = await next_offsets(conn, self._offsets, self.settings.projector_group_id,
                                    {(t, p) for t, p, _ in waiting.values()})  # fmt: skip
        held = await parked.parked_positions(conn, self._parked, set(waiting.values()))
        return {s for s, (t, p, o) in waiting.items() if passed.get((t, p), 0) > o and (t, p, o) not in held}

    async def _release(self, subject: ParkedSubject) -> None:
        assert self.pool is not None
        try:
            async with self.batch_lock, self.pool.acquire() as conn:
                await release_parked(self.applier, conn, (subject.topic, subject.partition, subject.first_offset))
        except ParkedSubjectError:
            pass  # an operator released or dropped it meanwhile
        except Exception as exc:
            if verdict_of(exc) is not Verdict.RETRY:
                raise
            log.warning("cannot release subject %s now (%s); the next check tries again", subject.name, exc)

    # -- assignment ----------------------------------------------------------------------------------

    async def check_partition_counts(self) -> None:
        """Stop (PartitionCountChangedError) when a topic has another partition count than its layout
        records: its threads' records may sit on two partitions, which this worker would apply apart.
        Every count change reaches here: the group rebalances when a subscribed topic's count changes."""
        assert self.consumer is not None and self.producer is not None
        layout, client = self.producer.layout, self.producer.client
        await self._retried("read the partition layout", lambda: layout.load(client))
        for topic in self.topics:
            layout.check(topic, len(self.consumer.partitions_for_topic(topic) or ()))

    def forget(self, partitions: set[TopicPartition]) -> None:
        self.guard.forget(partitions)
        for tp in partitions:
            self.gaps.forget(tp)
            self._paused.pop(tp, None)
        if self.group_offsets is not None:
            self.group_offsets.forget(partitions)
        self.telemetry.lost_log = frozenset((tp.topic, tp.partition) for tp in self.guard.stopped)

    async def _retried(self, what: str, attempt: Callable[[], Awaitable[T]]) -> T:
        """`attempt()`, again with capped backoff while it fails for a passing reason (`verdict_of`: a broker
        or Postgres away) and the worker is not stopping: a rebalance listener that raised would stop it."""

        def told(exc: Exception, delay: float) -> None:
            log.warning("cannot %s (%s); retrying in %.1fs", what, exc, delay)

        return await retried(
            attempt,
            Backoff(BACKOFF_INITIAL_S, self.settings.projector_retry_max_s),
            retry_if=lambda exc: verdict_of(exc) is Verdict.RETRY and not self._stop.is_set(),
            on_retry=told,
            wait=lambda delay: set_within(self._stop, delay),
        )

    async def seek_to_stored(self, assigned: set[TopicPartition]) -> None:
        """Seek each assigned partition to its stored next offset, or to the beginning without one."""
        assert self.consumer is not None and self.pool is not None
        if not assigned:
            return
        self.forget(assigned)
        pool, group = self.pool, self.settings.projector_group_id

        async def read_stored() -> dict[str, dict[int, int]]:
            async with pool.acquire() as conn:
                return {
                    topic: await stored_offsets(conn, self._offsets, group, topic)
                    for topic in {tp.topic for tp in assigned}
                }

        stored = await self._retried("read stored offsets", read_stored)
        beginning = []
        for tp in sorted(assigned):
            offset = stored[tp.topic].get(tp.partition)
            if offset is None:
                beginning.append(tp)
            else:
                self.consumer.seek(tp, offset)
                self.guard.positions[tp] = offset
        if beginning:
            await self.consumer.seek_to_beginning(*beginning)
        self.consumer.resume(*assigned)
        self.health.set_not_ready("assigned; nothing applied yet")
        self.commit_to_kafka(
            {(tp.topic, tp.partition): o for tp in assigned if (o := stored[tp.topic].get(tp.partition)) is not None}
        )
        self.telemetry.assigned({(tp.topic, tp.partition): stored[tp.topic].get(tp.partition, 0) for tp in assigned})
        positions = (f"{tp.topic}:{tp.partition}@{stored[tp.topic].get(tp.partition, 0)}" for tp in sorted(assigned))
        log.info("assigned %s", ", ".join(positions))

    # -- batches -------------------------------------------------------------------------------------

    async def next_batch(self, stop: asyncio.Event) -> list[LogRecord]:
        """Records up to `batch_max_events` / `batch_max_bytes`, waiting at most `batch_max_wait_ms`
        after the first arrives. A partition cut short by the byte bound is sought back to its first
        record left out, so nothing is skipped."""
        assert self.consumer is not None
        s = self.settings
        records: list[LogRecord] = []
        size = 0
        deadline: float | None = None
        full = False
        while not full and not stop.is_set():
            self._resume_paused()
            if deadline is None:
                timeout_ms = IDLE_POLL_MS
                if self.guard.stopped and time.monotonic() - self._reset_checked >= RESET_POLL_S:
                    await self.resume_reset_partitions()
                if time.monotonic() - self._parked_checked >= PARKED_CHECK_S:
                    await self.check_parked()
            else:
                timeout_ms = max(0, int((deadline - time.monotonic()) * 1000))
            try:
                fetched = await self.consumer.getmany(
                    timeout_ms=timeout_ms, max_records=s.batch_max_events - len(records)
                )
            except OffsetOutOfRangeError as exc:  # Kafka: the log ends (or starts) elsewhere now
                for tp, offset in exc.args[0].items():
                    self.stop_partition(tp, offset, f"the broker answered OFFSET_OUT_OF_RANGE for offset {offset}")
                continue
            except NoOffsetForPartitionError as exc:
                # A fetch raced the assignment's seek to the stored offsets; seek (again) and go on.
                await self.seek_to_stored({tp for tp in exc.args if isinstance(tp, TopicPartition)})
                continue
            if self.assignment_failed is not None:
                raise self.assignment_failed
            self.telemetry.fetched(self.consumer)  # high watermarks, for the lag gauge
            self.health.progressed()
            if not fetched and caught_up(self.consumer.assignment(), self.consumer.paused(), self.telemetry.lag):
                self.health.set_ready()
            for tp, (position, high) in self.guard.beyond_end(self.consumer).items():
                self.stop_partition(tp, position, f"the log of the partition now ends at offset {high}")
            if deadline is None and fetched:
                deadline = time.monotonic() + s.batch_max_wait_ms / 1000
            for tp, messages in fetched.items():
                for message in messages:
                    expected = self.guard.positions.get(tp, message.offset)
                    if message.offset > expected and not self.gaps.may_pass(tp, expected, message.offset):
                        self.consumer.seek(tp, expected)  # the offsets passed over are fetched again
                        break
                    _warn_of_create_time(message, self._create_time_topics)
                    record = LogRecord.consumed(message)
                    if full or (records and size + record.size > s.batch_max_bytes):
                        self.consumer.seek(tp, message.offset)
                        self.guard.positions[tp] = message.offset
                        full = True
                        break
                    records.append(record)
                    size += record.size
                    self.guard.positions[tp] = message.offset + 1
            if len(records) >= s.batch_max_events:
                full = True
            if deadline is not None and time.monotonic() >= deadline:
                break
        return records

    async def apply_with_retry(self, records: Sequence[LogRecord], stop: asyncio.Event) -> BatchResult | None:
        """Apply one batch, retrying retryable failures with a capped backoff; None if abandoned on stop."""
        assert self.pool is not None
        pool = self.pool
        classified: list[Classified] | None = None  # once: a retry re-runs only the transaction
        started = time.perf_counter()

        async def attempt() -> BatchResult:
            nonlocal classified, started
            if classified is None:
                classified = await self.applier.classify(records)  # the key store may be down
            async with self.batch_lock, pool.acquire() as conn:
                started = time.perf_counter()
                with self.telemetry.batch(conn, records) as observed:  # spans, metrics
                    result: BatchResult = await self.applier.apply(observed.conn, records, classified)
                    observed.result = result
            return result

        async def failed(exc: Exception, delay: float) -> None:
            self.health.progressed()
            self.health.set_not_ready(f"a batch keeps failing: {type(exc).__name__}")
            log.warning("batch of %d records failed (%s: %s); retrying in %.1fs", len(records),
                        type(exc).__name__, exc, delay)  # fmt: skip
            await pool.expire_connections()  # the retry gets a fresh connection, not a broken one

        try:
            result = await retried(
                attempt,
                Backoff(BACKOFF_INITIAL_S, self.settings.projector_retry_max_s),
                retry_if=lambda exc: verdict_of(exc) is Verdict.RETRY and not stop.is_set(),
                on_retry=failed,
                wait=lambda delay: set_within(stop, delay),
            )
        except Exception as exc:
            if verdict_of(exc) is not Verdict.RETRY:
                raise
            self.health.progressed()
            self.health.set_not_ready(f"a batch keeps failing: {type(exc).__name__}")
            log.warning("abandoning a batch of %d records on stop after: %s", len(records), exc)
            return None
        self.health.progressed()
        self.health.set_ready()
        self.batches += 1
        self.events += result.applied
        for (topic, partition), offset in result.deferred.items():
            assert self.consumer is not None
            self.consumer.seek(TopicPartition(topic, partition), offset)  # the next batch starts there
            self.guard.positions[TopicPartition(topic, partition)] = offset
        for (topic, partition), offset in result.paused.items():
            assert self.consumer is not None
            tp = TopicPartition(topic, partition)
            self.consumer.seek(tp, offset)
            self.guard.positions[tp] = offset
            self.consumer.pause(tp)
            self._paused[tp] = time.monotonic() + PAUSE_RETRY_S
        log.debug("applied %d events (%d dead letters, %d skipped) in %.1f ms", result.applied,
                  result.dead_letters, result.skipped, (time.perf_counter() - started) * 1000)  # fmt: skip
        return result

    def _resume_paused(self) -> None:
        """Fetch held partitions again once their pause is over (their requirement may be met by now)."""
        now = time.monotonic()
        for tp, until in list(self._paused.items()):
            if until <= now:
                del self._paused[tp]
                assert self.consumer is not None
                if tp in self.consumer.assignment() and tp not in self.guard.stopped:
                    self.consumer.resume(tp)

    # -- lost logs -----------------------------------------------------------------------------------

    def stop_partition(self, tp: TopicPartition, position: int, evidence: str) -> None:
        """Stop fetching `tp` (its log lost applied records) until an operator resets its offset."""
        assert self.consumer is not None
        if tp not in self.consumer.assignment():
            return
        self.consumer.pause(tp)
        self.guard.stop(tp, position, evidence, self.settings.projector_group_id)
        self.telemetry.lost_log = frozenset((t.topic, t.partition) for t in self.guard.stopped)

    async def resume_reset_partitions(self) -> None:
        """Resume stopped partitions whose stored offset changed (`graphledger offsets reset`)."""
        assert self.consumer is not None and self.pool is not None
        self._reset_checked = time.monotonic()
        try:
            async with self.pool.acquire() as conn:
                stored = {
                    TopicPartition(topic, partition): offset
                    for topic in {tp.topic for tp in self.guard.stopped}
                    for partition, offset in (
                        await stored_offsets(conn, self._offsets, self.settings.projector_group_id, topic)
                    ).items()
                }
        except Exception as exc:
            if verdict_of(exc) is not Verdict.RETRY:
                raise
            log.warning("cannot read stored offsets to look for a reset (%s)", exc)
            return
        for tp, offset in self.guard.reset(stored).items():
            self.consumer.seek(tp, offset)
            self.consumer.resume(tp)
            log.warning("partition %s:%d was reset to offset %d; resuming it", tp.topic, tp.partition, offset)
        self.telemetry.lost_log = frozenset((t.topic, t.partition) for t in self.guard.stopped)

    async def _produce_dead_letters(self, letters: Sequence[DeadLetter]) -> None:
        """Produce to the dead-letter topic and wait for every acknowledgement (inside the batch
        transaction, before it commits)."""
        assert self.producer is not None
        await produce_dead_letters(self.producer, self.settings, letters)


async def _session_kept(conn: asyncpg.Connection) -> None:
    """A released connection's reset: nothing beyond asyncpg's own (it rolls back a transaction left
    open and drops listeners). The projector's connections hold no session state (its advisory locks
    are transaction-scoped, it listens on none and sets nothing), so asyncpg's default reset statement
    (unlock all, close cursors, unlisten, reset settings) would be one more round trip per batch."""
