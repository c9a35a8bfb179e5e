"""The rebuild's consumer and applier: the live projector's projections, into another schema.

It reads every partition of the source topics (no consumer group: plain assignment, from the offsets
stored in the rebuild schema, or the beginning), and applies batches with the same `BatchApplier`
and projections as the live projector, so the rebuild is the projector's own code on the same log.

The rebuild never passes the live projector: each partition is capped at the live schema's
`next_offset` (`set_caps`), and paused when it reaches it. So every event it applies was applied to
the live schema first, and the dead letters it meets were already produced to the dead-letter topic
by the live projector: here they are only recorded in the rebuild's `graphledger_dead_letters`.
The offset rows carry the live projector's consumer group, so after the switch it continues from them.
A record no version of this code can apply parks its subject here as it did there (`projection/parking.py`);
what the live projector decided that the log alone cannot tell (a barrier found beyond its log, a record an
operator dropped) is carried over before each catch-up (`log/parked.carry_verdicts`, in `replay/run.py`).

Batches are pipelined over `LANES` connections: the partitions are split between the lanes, each
fetched batch is split by lane, and each lane's part applies while the next batch is fetched and
decoded here (and planned for the other lane). Within a lane, batches commit one after the other,
so each partition's events apply in log order; lanes share no partition, as two projector replicas
share none. Order across partitions is not defined by the log, and the live projector's replicas do
not keep one either.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

import asyncpg
from aiokafka import AIOKafkaConsumer, TopicPartition

from graphledger.log.gaps import GapWatch
from graphledger.log.records import LogRecord
from graphledger.log.tail import LogTail
from graphledger.opening.records import Classified, DeadLetter
from graphledger.retry import Backoff, retried
from graphledger.settings import Settings
from graphledger.telemetry import names
from graphledger_server.driver_errors import Verdict, verdict_of
from graphledger_server.keys.key_store import key_store_for
from graphledger_server.keys.lookup import DataKeyCache
from graphledger_server.log.clients import new_consumer
from graphledger_server.log.ends import log_ends
from graphledger_server.log.offsets import OffsetStatements, stored_offsets
from graphledger_server.log.topics import source_topics
from graphledger_server.projection.batch import BatchApplier, BatchResult
from graphledger_server.projector.worker import BACKOFF_INITIAL_S, projections_for
from graphledger_server.replay.shares import Share
from graphledger_server.telemetry import replay as telemetry

log = logging.getLogger(__name__)

TP = tuple[str, int]
IDLE_POLL_MS = 200
FILL_WAIT_MS = 50
"""How long a batch waits to fill after its first records (a backlog fills it at once)."""
FETCH_BYTES = 8 * 1024 * 1024
LANES = 2
"""Connections applying at once; measured on 2 cores, two keep Postgres busy while Python decodes."""


async def _already_dead_lettered(letters: Sequence[DeadLetter]) -> None:
    """The live projector produced these when it met them (the rebuild never passes it)."""
    log.info("rebuild met %d dead letters the live projector already produced", len(letters))


class Rebuilder:
    """Applies the source topics into `schema` as far as the caps allow."""

    def __init__(self, settings: Settings, schema: str, share: Share | None = None) -> None:
        self.settings = settings
        self.schema = schema
        self.share = share
        """The partitions this process applies (`replay/shares.py`); None: every one."""
        self.group = settings.projector_group_id
        self.projections = projections_for(settings.model_copy(update={"postgres_schema": schema}))
        # The live projector's reassembly budget: a batch loads at most batch_max_bytes of stored chunks.
        self.applier = BatchApplier(
            schema,
            self.group,
            self.projections,
            _already_dead_lettered,
            reassembly_max_bytes=settings.batch_max_bytes,
            clear_refused=settings.clear_events_refused,
        )
        self.positions: dict[TP, int] = {}
        """The rebuild schema's next offset per partition (what is applied)."""
        self.caps: dict[TP, int] = {}
        self.records = 0
        """Records this process applied (or skipped as applied before), for the rate."""
        self.parked = 0
        """Subjects this process parked (`graphledger parked list` shows them once switched)."""
        self._deferred: dict[TP, int] = {}
        """Partitions a batch cut short (chunk reassembly over its budget) and where to fetch them again."""
        self._fetched: dict[TP, int] = {}
        self._gaps = GapWatch()
        """Offsets a fetch passed over (`log.gaps`): fetched again, not skipped."""
        self._paused: set[TP] = set()
        self._pool: asyncpg.Pool | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._tail = LogTail(settings)
        """Where the logs of copy barriers' copies end."""
        self._lanes: dict[TP, int] = {}
        self._inflight: dict[int, asyncio.Task[None]] = {}

    async def start(self) -> None:
        s = self.settings
        # Without waiting for the WAL flush at commit: a crash loses the last batches with their offsets
        # (one transaction), and the rebuild resumes before them.
        self._pool = await asyncpg.create_pool(
            s.postgres_dsn, min_size=1, max_size=LANES, server_settings={"synchronous_commit": "off"}
        )
        self.applier.keys = DataKeyCache(key_store_for(s, self._pool))
        statements = OffsetStatements(self.schema)
        async with self._pool.acquire() as conn:
            for projection in self.projections.values():
                await projection.prepare(conn)
            stored = {t: await stored_offsets(conn, statements, self.group, t) for t in source_topics(s)}
        self._consumer = new_consumer(s, fetch_bytes=FETCH_BYTES)
        await self._consumer.start()
        await self._tail.start()
        self.applier.log_ends = self._log_ends
        await self._consumer.topics()  # metadata of every topic, for partitions_for_topic
        every = [(t, p) for t in source_topics(s) for p in sorted(self._consumer.partitions_for_topic(t) or ())]
        assigned = [TopicPartition(*tp) for tp in (every if self.share is None else self.share.of(every))]
        self._consumer.assign(assigned)
        for tp in assigned:
            offset = stored[tp.topic].get(tp.partition)
            if offset is None:
                await self._consumer.seek_to_beginning(tp)
            else:
                self._consumer.seek(tp, offset)
            self.positions[(tp.topic, tp.partition)] = offset or 0
            self._lanes[(tp.topic, tp.partition)] = len(self._lanes) % LANES
            self._fetched[(tp.topic, tp.partition)] = offset or 0
        which = "" if self.share is None else f" (share {self.share.label})"
        starts = ", ".join(f"{t}:{p}@{o}" for (t, p), o in sorted(self.positions.items()))
        log.info("rebuilding into schema %s%s from %s", self.schema, which, starts)

    async def close(self) -> None:
        inflight = list(self._inflight.values())
        for task in inflight:
            task.cancel()
        await asyncio.gather(*inflight, return_exceptions=True)  # batches stopped half way: abandoned
        try:
            await self._tail.stop()
            if self._consumer is not None:
                await self._consumer.stop()
        finally:
            if self._pool is not None:
                await self._pool.close()

    async def _log_ends(self, partitions: set[TP]) -> dict[TP, int]:
        return await log_ends(self._tail, partitions, self.settings.consistency_timeout_s)

    # -- caps ---------------------------------------------------------------------------------------

    def set_caps(self, targets: dict[TP, int]) -> None:
        """Allow each partition up to `targets` (the live schema's next offsets; absent: 0)."""
        assert self._consumer is not None
        self.caps = {tp: targets.get(tp, 0) for tp in self.positions}
        for tp in list(self._paused):
            if self._fetched[tp] < self.caps[tp]:
                self._consumer.resume(TopicPartition(*tp))
                self._paused.discard(tp)
        for tp, cap in self.caps.items():
            if self._fetched[tp] >= cap and tp not in self._paused:
                self._pause(tp, cap)

    def _pause(self, tp: TP, at: int) -> None:
        assert self._consumer is not None
        partition = TopicPartition(*tp)
        self._consumer.seek(partition, at)  # drops what was prefetched beyond
        self._fetched[tp] = at
        self._consumer.pause(partition)
        self._paused.add(tp)

    def lag(self) -> int:
        """Records the rebuild still has to apply to reach the caps (a batch in flight counts as not applied)."""
        return sum(max(0, self.caps.get(tp, 0) - pos) for tp, pos in self.positions.items())

    # -- batches ------------------------------------------------------------------------------------

    async def step(self) -> int:
        """Fetch and decode one batch below the caps, and start applying each lane's part of it once
        that lane's previous part committed; returns how many records it holds (0: none came, and
        nothing is in flight)."""
        self._rewind_deferred()
        records = await self._fetch()
        if not records:
            await self.flush()
            return 0
        classified = await self.applier.classify(records)
        parts: dict[int, tuple[list[LogRecord], list[Classified]]] = {}
        for record, c in zip(records, classified, strict=True):
            part = parts.setdefault(self._lanes[(record.topic, record.partition)], ([], []))
            part[0].append(record)
            part[1].append(c)
        past_cut: set[TP] = set()
        for lane, (lane_records, lane_classified) in sorted(parts.items()):
            previous = self._inflight.pop(lane, None)
            if previous is not None:
                await previous
            # A batch of either lane that finished since the fetch may have cut partitions short: what
            # this batch holds of them is past the cut; drop it, the rewind fetches it again. Collected
            # over the lanes, as a rewind for one lane's partition may come while awaiting the other's.
            past_cut |= self._rewind_deferred()
            if past_cut:
                kept = [(r, c) for r, c in zip(lane_records, lane_classified, strict=True)
                        if (r.topic, r.partition) not in past_cut]  # fmt: skip
                lane_records, lane_classified = [r for r, _ in kept], [c for _, c in kept]
            if lane_records:
                self._inflight[lane] = asyncio.create_task(self._apply_batch(lane_records, lane_classified))
        return len(records)

    async def flush(self) -> None:
        """Wait for every batch in flight (a failure is raised here)."""
        while self._inflight:
            await self._inflight.pop(min(self._inflight))
        self._rewind_deferred()

    def _rewind_deferred(self) -> set[TP]:
        """Fetch again from where a batch deferred a partition (chunks beyond its reassembly budget);
        returns the partitions sought back."""
        assert self._consumer is not None
        rewound = set(self._deferred)
        for tp, offset in self._deferred.items():
            self._consumer.seek(TopicPartition(*tp), offset)
            self._fetched[tp] = offset
            if tp in self._paused and offset < self.caps.get(tp, 0):
                self._consumer.resume(TopicPartition(*tp))
                self._paused.discard(tp)
        self._deferred.clear()
        return rewound

    async def _apply_batch(self, records: list[LogRecord], classified: list[Classified]) -> None:
        with telemetry.span("replay.apply", **{names.MESSAGING_BATCH_MESSAGE_COUNT: len(records)}):
            result = await self._apply(records, classified)
        self.records += len(records)
        self.positions.update(result.next_offsets)
        self._deferred.update(result.deferred)
        self._deferred.update(result.paused)  # fetched again at once: the other lane is applying meanwhile
        self.parked += len(result.parked)

    async def _fetch(self) -> list[LogRecord]:
        """Records below the caps, up to `replay_batch_max_events` / `batch_max_bytes`; a partition cut short
        by the byte bound is sought back to its first record left out."""
        assert self._consumer is not None
        most, most_bytes = self.settings.replay_batch_max_events, self.settings.batch_max_bytes
        records: list[LogRecord] = []
        size = 0
        full = False
        deadline: float | None = None
        while not full and len(records) < most and len(self._paused) < len(self.positions):
            if deadline is None:
                timeout_ms = IDLE_POLL_MS
            else:
                timeout_ms = max(0, int((deadline - time.monotonic()) * 1000))
            fetched = await self._consumer.getmany(timeout_ms=timeout_ms, max_records=most - len(records))
            for partition, messages in fetched.items():
                tp = (partition.topic, partition.partition)
                cap = self.caps.get(tp, 0)
                for m in messages:
                    if m.offset >= cap:
                        self._pause(tp, cap)
                        break
                    if m.offset > self._fetched[tp] and not self._gaps.may_pass(tp, self._fetched[tp], m.offset):
                        self._consumer.seek(partition, self._fetched[tp])  # passed over: fetched again
                        break
                    record = LogRecord.consumed(m)
                    if full or (records and size + record.size > most_bytes):
                        full = True
                        self._consumer.seek(partition, m.offset)  # the rest waits for the next batch
                        self._fetched[tp] = m.offset
                        break
                    records.append(record)
                    size += record.size
                    self._fetched[tp] = m.offset + 1
                if self._fetched[tp] >= cap and tp not in self._paused:
                    self._pause(tp, cap)
            if not records and not fetched:
                break  # idle: let the caller read new caps
            if deadline is None and records:
                deadline = time.monotonic() + FILL_WAIT_MS / 1000
            if deadline is not None and time.monotonic() >= deadline:
                break
        return records

    async def _apply(self, records: list[LogRecord], classified: list[Classified]) -> BatchResult:
        pool = self._pool
        assert pool is not None

        async def attempt() -> BatchResult:
            async with pool.acquire() as conn:
                result: BatchResult = await self.applier.apply(conn, records, classified)
                return result

        def told(exc: Exception, delay: float) -> None:
            log.warning("rebuild batch of %d records failed (%s); retrying in %.1fs", len(records), exc, delay)

        return await retried(
            attempt,
            Backoff(BACKOFF_INITIAL_S, self.settings.projector_retry_max_s),
            retry_if=lambda exc: verdict_of(exc) is Verdict.RETRY,
            on_retry=told,
        )
