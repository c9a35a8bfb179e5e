"""Copying a log written in the clear into sealed topics (`graphledger encrypt-log --to-prefix NEW`).

A deployment that ran with `GRAPHLEDGER_ENCRYPT_EVENTS` off has events whose payloads are in the clear
and whose record keys are thread ids and store keys, which no erasure can reach. This copies the
checkpoint and store topics of `GRAPHLEDGER_TOPIC_PREFIX` into `NEW.checkpoints` and `NEW.store`,
each event sealed with its subject's data key and keyed by its keyed hash, as a client with encryption
on would have written it (`EventSealer` on the key store, as `graphledger import` seals). Writers must
be stopped for the copy; the operator then switches to the new topics (docs/operations.md).

The rules it keeps:
- Each event keeps its envelope: type, event id and producer time (store items' timestamps come from
  it), only its payload is sealed. Events already sealed (written by clients with encryption on) are
  copied as they are. An event of an erased subject is left out: nothing of it may be written again.
  A record that does not decode or validate (the projector dead-lettered it) is left out and listed,
  since its payload may hold anything in the clear, and so are chunks of an event whose other chunks
  the log lacks.
- Order. A record goes to the partition the producers' partitioner gives its new key (murmur2 of the
  key modulo the new topic's partitions), where a client's later writes of the same thread or item go:
  never the source partition, whose number means nothing for a hashed key. Each source partition is
  read in offset order, chunked events reassembled (an event sits at its last chunk, where the
  projector applies it) and re-framed, and the partitions are merged by record time, the smaller
  partition first on a tie. So one thread's (one item's) events keep their log order, and a thread
  whose events sit on two source partitions (in the clear, then sealed by clients that turned
  encryption on before this copy) keeps them in the order they were written.
- `thread.copy.barrier` names the position of its copy's record in the source topic. The copy is
  merged before its barrier (a barrier waits in the merge until its copy's partition has passed that
  position: the copy was acknowledged before the barrier was written, so this never deadlocks on a
  consistent log), and the barrier is rewritten, sealed again if it was sealed, to the copy's
  position in the new topic as the broker acknowledged it. A barrier naming no copy is left out.
- Keyless events (`runs.delete`, `namespace.erase`, `tenant.erase`) were written to every partition,
  each copy applying to the threads or items of its own partition. Each source copy is written to every
  new partition at its place in the merge: the threads of its source partition are spread over all
  the new ones, and its place among each new partition's records is after their earlier events and
  before their later ones, as it was in its source partition.
- The copy reads each source partition up to its end as of the start (the high watermark of a fetch,
  as the read API learns it: tansu's ListOffsets runs low). Every record written carries `gl-copy-of:
  <source partition>:<source offset>`, so a second run reads the new topics first and writes only what
  is missing: each new partition holds a prefix of what the merge, which is the same on every run,
  sends to it, and a run that finds anything else refuses. A finished copy run again writes nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import uuid
from array import array
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.partitioner import murmur2
from aiokafka.structs import ConsumerRecord, RecordMetadata

from graphledger.errors import GraphledgerError, InvalidEventError, SubjectErasedError, UnknownEventVersionError
from graphledger.event_sealer import EventSealer
from graphledger.events import Event, checkpoint_event, store_event
from graphledger.events.checkpoint import ThreadCopy, ThreadCopyBarrier
from graphledger.events.chunks import frame, parse_header
from graphledger.events.envelope import (
    HEADER_CHUNK,
    HEADER_TRACEPARENT,
    HEADER_TYPE,
    Envelope,
    decode,
    encode,
    header,
    headers_for,
)
from graphledger.log_tail import LogTail
from graphledger.sealing import ERASED, SealedSubject, seal, sealed_ref, unseal
from graphledger.settings import DEFAULT_ERASURE_NAMESPACE_DEPTH, Settings
from graphledger.subjects import LABEL_SEPARATOR, subject_of
from graphledger.tenancy import THREAD_SEPARATOR, check_tenant_name
from graphledger_server.log.clients import new_consumer, new_producer
from graphledger_server.log.topics import ensure_topics, source_topics
from graphledger_server.replay.preflight import inspect_sources, refuse_losses

if TYPE_CHECKING:
    from graphledger_server.keys.lookup import DataKeyCache

log = logging.getLogger(__name__)

HEADER_COPY_OF = "gl-copy-of"
"""On every record this command writes: `<partition>:<offset>` of the event's (last) record in the
source topic of the same name, which tells a later run what is copied already."""
WINDOW_EVENTS = 512
"""Events sealed together (their keys fetched in one request), written in order, then acknowledged."""
PROGRESS_EVENTS = 50_000
"""How often (in events) the copy logs its progress."""
BUFFERED_RECORDS = 2_000
"""Records held per source partition for the merge; a partition holding more is paused."""
FETCH_BYTES = 8 * 1024 * 1024
FETCH_WAIT_MS = 1_000
SHOWN_LEFT_OUT = 20
"""Left-out events listed one by one in the output; the rest are counted."""
TOPIC_PREFIX = re.compile(r"^[A-Za-z0-9._-]{1,200}$")

Position = tuple[int, int]
"""`(partition, offset)` in one topic."""


# -- the report ------------------------------------------------------------------------------------


@dataclass
class TopicReport:
    source: str
    target: str
    partitions: int
    events: int = 0
    """Events met in the source up to its end as of the start."""
    sealed: int = 0
    """Written sealed (they were in the clear)."""
    kept: int = 0
    """Written as they were: sealed already, or naming no one (keyless events)."""
    barriers: int = 0
    """Copy barriers pointed at their copy's new position."""
    broadcasts: int = 0
    """Keyless events written to every new partition."""
    earlier: int = 0
    """Copied by an earlier run."""
    erased: int = 0
    """Left out: their subject or tenant is erased."""
    left_out: list[str] = field(default_factory=list)
    """Left out, `partition@offset: why`: undecodable, invalid, incomplete, a barrier naming no copy."""
    records: int = 0
    """Records written by this run."""

    def describe(self) -> list[str]:
        lines = [
            f"{self.source} -> {self.target}: {self.events} events (up to the end as of the start): {self.sealed} "
            f"sealed, {self.kept} copied as they were, {self.barriers} copy barriers repositioned, {self.broadcasts} "
            f"written to all {self.partitions} partitions, {self.earlier} copied by an earlier run, {self.erased} "
            f"left out as erased, {len(self.left_out)} left out as unusable; {self.records} records written"
        ]
        lines += [f"  left out {self.source}:{why}" for why in self.left_out[:SHOWN_LEFT_OUT]]
        if len(self.left_out) > SHOWN_LEFT_OUT:
            lines.append(f"  ... and {len(self.left_out) - SHOWN_LEFT_OUT} more (the log at INFO lists them all)")
        return lines

    def leave_out(self, position: Position, why: str) -> None:
        self.left_out.append(f"{position[0]}@{position[1]}: {why}")
        log.info("left out %s:%d@%d: %s", self.source, *position, why)


# -- the command -----------------------------------------------------------------------------------


async def encrypt_log(
    settings: Settings, to_prefix: str, *, extra_tenants: Iterable[str] = (), accept_loss: bool = False
) -> list[TopicReport]:
    """Copy both source topics into `to_prefix`'s, sealed; see the module docstring."""
    import asyncpg

    if not TOPIC_PREFIX.match(to_prefix):
        raise GraphledgerError(f"--to-prefix {to_prefix!r} is not a topic prefix (1-200 of A-Z a-z 0-9 . _ -)")
    if to_prefix == settings.topic_prefix:
        raise GraphledgerError(
            f"--to-prefix {to_prefix!r} is GRAPHLEDGER_TOPIC_PREFIX, the source: the copy goes to new topics"
        )
    refuse_losses(await inspect_sources(settings), accept_loss=accept_loss)
    target = settings.model_copy(update={"topic_prefix": to_prefix})
    pool = await asyncpg.create_pool(settings.postgres_dsn, min_size=0, max_size=2)
    tail = LogTail(settings)
    consumer = new_consumer(settings, fetch_bytes=FETCH_BYTES)
    producer: AIOKafkaProducer | None = None
    try:
        sealing = _sealing(settings, pool, extra_tenants)
        await tail.start()
        await consumer.start()
        await consumer.topics()
        counts = {t: _partition_count(consumer, t) for t in source_topics(settings)}
        ends = await _ends(tail, counts, settings)
        await ensure_topics(target.model_copy(update={"topic_partitions": counts[settings.checkpoint_topic]}))
        producer = new_producer(target)
        await producer.start()
        reports = []
        for source_topic, target_topic in zip(source_topics(settings), source_topics(target), strict=True):
            partitions = sorted(await producer.partitions_for(target_topic))
            copied = await Copied.read(consumer, tail, target_topic, partitions, ends[source_topic], settings)
            report = TopicReport(source_topic, target_topic, len(partitions))
            copier = Copier(report, producer, sealing, copied, settings)
            await _copy_topic(Merge(consumer, source_topic, ends[source_topic], copier.classify), copier, report)
            reports.append(report)
        await _refuse_growth(tail, counts, ends, settings, reports)
        return reports
    finally:
        if producer is not None:
            await producer.stop()
        await consumer.stop()
        await tail.stop()
        await pool.close()


@dataclass(frozen=True, slots=True)
class Sealing:
    """What sealing an event in the clear takes: its subject's keys, and the tenants names can carry."""

    sealer: EventSealer
    keys: DataKeyCache
    """Data keys by reference, to open a sealed barrier and seal it again."""
    tenants: frozenset[str]


def _sealing(settings: Settings, pool: Any, extra_tenants: Iterable[str]) -> Sealing:
    from graphledger_server.api.auth import token_entries
    from graphledger_server.keys.lookup import DataKeyCache
    from graphledger_server.keys.source import StoreKeySource
    from graphledger_server.keys.store import key_store_for

    key_store = key_store_for(settings, pool)
    if key_store is None:
        raise GraphledgerError(
            "encrypt-log seals with the key store: set GRAPHLEDGER_KEY_ENCRYPTION_KEYS (the services' key-encryption "
            "keys) and the key store's database (GRAPHLEDGER_POSTGRES_DSN)"
        )
    tenants = frozenset(check_tenant_name(t) for t in extra_tenants) | {
        e.tenant.name for e in token_entries(settings) or () if e.tenant.name
    }
    sealer = EventSealer(StoreKeySource(key_store, settings), settings.key_cache_ttl_s)
    return Sealing(sealer, DataKeyCache(key_store), tenants)


async def _copy_topic(merge: Merge, copier: Copier, report: TopicReport) -> None:
    """Copy the merged events a window at a time, then count the chunked events the source lacks parts of."""
    window: list[SourceEvent] = []
    async for event in merge.events():
        window.append(event)
        if len(window) >= WINDOW_EVENTS:
            await copier.copy(window)
            window = []
            if report.events % PROGRESS_EVENTS < WINDOW_EVENTS:
                log.info("%s: %d events copied, %d records written", report.source, report.events, report.records)
    await copier.copy(window)
    for position, why in merge.incomplete():
        report.events += 1
        report.leave_out(position, why)


async def _refuse_growth(
    tail: LogTail,
    counts: dict[str, int],
    ends: dict[str, dict[int, int]],
    settings: Settings,
    reports: list[TopicReport],
) -> None:
    """Fail when the source grew during the copy: a writer still runs, and its writes are not copied."""
    now = await _ends(tail, counts, settings)
    grown = {f"{t}:{p}": end - ends[t][p] for t, of in now.items() for p, end in of.items() if end > ends[t][p]}
    if grown:
        for report in reports:
            for line in report.describe():
                log.warning("%s", line)
        raise GraphledgerError(
            f"the source grew while it was copied ({', '.join(f'{tp} by {n}' for tp, n in sorted(grown.items()))}): "
            "writers are still running, and what they wrote is not copied. Stop them and run encrypt-log again: it "
            "writes only what is missing"
        )


def _partition_count(consumer: AIOKafkaConsumer, topic: str) -> int:
    partitions = consumer.partitions_for_topic(topic)
    if not partitions:
        raise GraphledgerError(f"source topic {topic} does not exist: is GRAPHLEDGER_TOPIC_PREFIX the log to copy?")
    return len(partitions)


async def _ends(tail: LogTail, counts: dict[str, int], settings: Settings) -> dict[str, dict[int, int]]:
    """Each partition's high watermark, from fetches (tansu's ListOffsets answers low)."""
    starts = {TopicPartition(t, p): 0 for t, n in counts.items() for p in range(n)}
    found = await tail.ends(starts, settings.consistency_timeout_s)
    ends: dict[str, dict[int, int]] = {t: {} for t in counts}
    for tp, end in found.items():
        ends[tp.topic][tp.partition] = end
    return ends


def partition_of(key: bytes, partitions: int) -> int:
    """The partition the producers' default partitioner gives `key` (murmur2, positive, modulo)."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def tenant_of(event: Event, tenants: frozenset[str]) -> str:
    """The tenant whose prefix the event's subject carries ("" for the unnamed tenant or no subject)."""
    subject = subject_of(event, "", DEFAULT_ERASURE_NAMESPACE_DEPTH)  # the first label: any depth
    if subject is None or not tenants:
        return ""
    separator = THREAD_SEPARATOR if subject.kind == "thread" else LABEL_SEPARATOR
    first, found, _ = subject.name.partition(separator)
    return first if found and first in tenants else ""


# -- the source: whole events of every partition, merged -------------------------------------------


@dataclass(slots=True)
class SourceEvent:
    """One whole event of the source (reassembled when chunked), at its last record's position."""

    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]]
    """The record's headers, without `gl-chunk`."""
    envelope: Envelope | None = None
    event: Event | None = None
    """The typed event: of an event in the clear, or of a sealed barrier opened to be rewritten."""
    opened: SealedSubject | None = None
    """The subject of a sealed barrier opened with its data key."""
    problem: str | None = None
    """Why it cannot be copied (it is left out)."""

    @property
    def position(self) -> Position:
        return self.partition, self.offset


@dataclass(slots=True)
class _Parts:
    count: int
    first_offset: int
    parts: dict[int, bytes] = field(default_factory=dict)


class Feed:
    """One source partition up to its end as of the start: fetched records turned into whole events."""

    def __init__(self, partition: int, end: int) -> None:
        self.partition = partition
        self.end = end
        self.position = 0
        """The next offset to fetch."""
        self.records: deque[ConsumerRecord[bytes, bytes]] = deque()
        self.chunks: dict[str, _Parts] = {}
        self.head: SourceEvent | None = None
        self.taken = -1
        """The offset of the last event the merge took from this partition."""
        self.paused = False

    @property
    def fetched_all(self) -> bool:
        return self.position >= self.end

    @property
    def done(self) -> bool:
        return self.fetched_all and not self.records and self.head is None

    def next_event(self) -> SourceEvent | None:
        """The next whole event of the fetched records, or None when more must be fetched first."""
        while self.records:
            r = self.records.popleft()
            headers = list(r.headers or ())
            chunk_header = header(headers, HEADER_CHUNK)
            if chunk_header is None:
                return SourceEvent(self.partition, r.offset, r.timestamp, r.key, r.value or b"", headers)
            try:
                ref = parse_header(chunk_header)
            except InvalidEventError as exc:
                return SourceEvent(self.partition, r.offset, r.timestamp, r.key, b"", headers, problem=str(exc))
            parts = self.chunks.setdefault(ref.event_id, _Parts(ref.count, r.offset))
            if ref.count != parts.count:
                why = f"chunk {ref.index} of event {ref.event_id} says {ref.count} chunks, an earlier one {parts.count}"
                return SourceEvent(self.partition, r.offset, r.timestamp, r.key, b"", headers, problem=why)
            parts.parts.setdefault(ref.index, r.value or b"")  # a producer retry's second copy is dropped
            if len(parts.parts) == parts.count:
                del self.chunks[ref.event_id]
                value = b"".join(parts.parts[i] for i in range(parts.count))
                kept = [h for h in headers if h[0] != HEADER_CHUNK]
                return SourceEvent(self.partition, r.offset, r.timestamp, r.key, value, kept)
        return None


class Merge:
    """The events of every partition of one source topic, each partition in offset order, merged by
    record time (then partition), a copy barrier held back until its copy's partition has passed it."""

    def __init__(
        self,
        consumer: AIOKafkaConsumer,
        topic: str,
        ends: dict[int, int],
        classify: Callable[[SourceEvent], Awaitable[SourceEvent]],
    ) -> None:
        self._consumer = consumer
        self._topic = topic
        self._classify = classify
        self.feeds = {p: Feed(p, end) for p, end in sorted(ends.items())}

    async def events(self) -> AsyncIterator[SourceEvent]:
        tps = [TopicPartition(self._topic, p) for p in self.feeds]
        self._consumer.assign(tps)
        await self._consumer.seek_to_beginning(*tps)
        for tp in tps:
            feed = self.feeds[tp.partition]
            feed.position = await self._consumer.position(tp)
            if feed.fetched_all:
                self._pause(feed)
        while True:
            await self._fill_heads()
            heads = [f for f in self.feeds.values() if f.head is not None]
            if not heads:
                return
            ready = [f for f in heads if not self._waits(f)]
            chosen = min(ready or heads, key=lambda f: (f.head.timestamp, f.partition))  # type: ignore[union-attr]
            event = chosen.head
            assert event is not None
            chosen.head, chosen.taken = None, event.offset
            if not ready:  # every head is a barrier waiting for a copy that cannot come before it
                barrier = event.event
                assert isinstance(barrier, ThreadCopyBarrier)
                event.problem = (
                    f"copy barrier naming {barrier.source_partition}@{barrier.source_offset}, which the merge cannot "
                    "reach before it"
                )
            yield event

    def incomplete(self) -> list[tuple[Position, str]]:
        """Chunked events whose other chunks the source lacks (a writer stopped mid-event)."""
        return [
            ((feed.partition, parts.first_offset), f"event {event_id}: {len(parts.parts)} of its {parts.count} chunks")
            for feed in self.feeds.values()
            for event_id, parts in feed.chunks.items()
        ]

    def _waits(self, feed: Feed) -> bool:
        """Whether the feed's head is a barrier whose copy the merge has not passed yet but still may."""
        barrier = feed.head.event if feed.head is not None else None
        if not isinstance(barrier, ThreadCopyBarrier):
            return False
        source = self.feeds.get(barrier.source_partition)
        return source is not None and source.taken < barrier.source_offset and not source.done

    async def _fill_heads(self) -> None:
        while True:
            starving = []
            for feed in self.feeds.values():
                while feed.head is None and (event := feed.next_event()) is not None:
                    feed.head = await self._classify(event)
                if feed.head is None and not feed.fetched_all:
                    starving.append(feed)
            if not starving:
                return
            await self._fetch(starving)

    async def _fetch(self, starving: list[Feed]) -> None:
        for feed in starving:
            if feed.paused:
                self._consumer.resume(TopicPartition(self._topic, feed.partition))
                feed.paused = False
        fetched = await self._consumer.getmany(timeout_ms=FETCH_WAIT_MS)
        for tp, records in fetched.items():
            feed = self.feeds[tp.partition]
            for r in records:
                if r.offset >= feed.end:
                    feed.position = feed.end
                    break
                feed.records.append(r)
                feed.position = r.offset + 1
        for feed in starving:
            if not feed.records and not feed.fetched_all:  # offsets without records (compaction, markers)
                tp = TopicPartition(self._topic, feed.partition)
                feed.position = max(feed.position, await self._consumer.position(tp))
        for feed in self.feeds.values():
            if feed.fetched_all or len(feed.records) >= BUFFERED_RECORDS:
                self._pause(feed)

    def _pause(self, feed: Feed) -> None:
        if not feed.paused:
            self._consumer.pause(TopicPartition(self._topic, feed.partition))
            feed.paused = True


# -- the target: what earlier runs wrote -----------------------------------------------------------


@dataclass(slots=True)
class _Written:
    copy_of: Position
    count: int
    indexes: set[int]
    key: bytes | None
    event_type: bytes | None
    last: Position


class Copied:
    """What earlier runs wrote to one target topic, from its records' `gl-copy-of` headers."""

    def __init__(self, ends: dict[int, int]) -> None:
        self._ends = ends
        self._keyed = {p: array("H", bytes(2 * end)) for p, end in ends.items()}
        """Per source partition and offset: 1 + the target partition holding the keyed event there, whole
        (0: none). Two bytes per source record."""
        self.broadcasts: dict[Position, set[int]] = {}
        """Keyless events: the target partitions holding each."""
        self.torn: set[Position] = set()
        """Events only some of whose chunks are in the target: written again under a new chunk id."""
        self.copies: dict[Position, Position] = {}
        """Where each `thread.copy` was written: source position -> target position of its last record."""

    def keyed_in(self, source: Position) -> int | None:
        """The target partition holding the keyed event at `source`, whole; None when it is not there."""
        p, o = source
        q = self._keyed[p][o] - 1 if p in self._keyed and 0 <= o < len(self._keyed[p]) else -1
        return None if q < 0 else q

    def _mark(self, source: Position, target: Position, key: bytes | None, event_type: bytes | None) -> None:
        p, o = source
        if not 0 <= o < self._ends.get(p, 0):
            raise GraphledgerError(
                f"the target holds a copy of source position {p}@{o}, which the source does not hold: "
                "it is the copy of another log; choose another --to-prefix"
            )
        if key is None:
            self.broadcasts.setdefault(source, set()).add(target[0])
        else:
            self._keyed[p][o] = target[0] + 1
        if event_type == ThreadCopy.TYPE.encode():
            self.copies[source] = target

    @classmethod
    async def read(
        cls,
        consumer: AIOKafkaConsumer,
        tail: LogTail,
        topic: str,
        partitions: list[int],
        source_ends: dict[int, int],
        settings: Settings,
    ) -> Copied:
        """Read `topic` (the target) to its end; refuses a record this command did not write."""
        copied = cls(source_ends)
        ends = await tail.ends({TopicPartition(topic, p): 0 for p in partitions}, settings.consistency_timeout_s)
        wanted = {tp: end for tp, end in ends.items() if end > 0}
        if not wanted:
            return copied
        consumer.assign(list(wanted))
        await consumer.seek_to_beginning(*wanted)
        chunked: dict[tuple[int, str], _Written] = {}
        left = dict(wanted)
        while left:
            fetched = await consumer.getmany(*left, timeout_ms=FETCH_WAIT_MS)
            for tp, records in fetched.items():
                for r in records:
                    if r.offset < wanted[tp]:
                        copied._add(r, chunked)
            for tp in list(left):
                if await consumer.position(tp) >= wanted[tp]:
                    del left[tp]
        partial = []
        for written in chunked.values():
            if len(written.indexes) == written.count:
                copied._mark(written.copy_of, written.last, written.key, written.event_type)
            else:
                partial.append(written.copy_of)
        # An event a later run wrote whole, after an earlier one wrote some of its chunks, is copied.
        copied.torn = {s for s in partial if copied.keyed_in(s) is None and s not in copied.broadcasts}
        log.info("%s holds %d records of an earlier run", topic, sum(wanted.values()))
        return copied

    def _add(self, r: ConsumerRecord[bytes, bytes], chunked: dict[tuple[int, str], _Written]) -> None:
        headers = list(r.headers or ())
        raw = header(headers, HEADER_COPY_OF)
        try:
            p, o = (int(part) for part in (raw or b"").decode().split(":"))
        except ValueError:
            raise GraphledgerError(
                f"{r.topic}:{r.partition}@{r.offset} holds a record encrypt-log did not write (no {HEADER_COPY_OF} "
                "header): the target topics are in use; choose another --to-prefix"
            ) from None
        event_type = header(headers, HEADER_TYPE)
        chunk_header = header(headers, HEADER_CHUNK)
        if chunk_header is None:
            self._mark((p, o), (r.partition, r.offset), r.key, event_type)
            return
        ref = parse_header(chunk_header)
        written = chunked.setdefault(
            (r.partition, ref.event_id), _Written((p, o), ref.count, set(), r.key, event_type, (r.partition, r.offset))
        )
        written.indexes.add(ref.index)
        written.last = (r.partition, r.offset)


# -- sealing and writing ---------------------------------------------------------------------------


@dataclass(slots=True)
class Outgoing:
    """What one source event becomes: a key, a value and headers to write (a barrier: still to point)."""

    key: bytes | None
    envelope: Envelope
    value: bytes | None
    """The value to write as it is; None: encode `envelope`."""
    headers: list[tuple[str, bytes]]
    sealed: bool
    """Sealed here (it was in the clear)."""
    tenant: str = ""


class Copier:
    """Seals a window of merged events concurrently, then writes them in merge order."""

    def __init__(
        self, report: TopicReport, producer: AIOKafkaProducer, sealing: Sealing, copied: Copied, settings: Settings
    ) -> None:
        self._source = report.source
        self._target = report.target
        self._partitions = report.partitions
        self._report = report
        self._producer = producer
        self._sealer = sealing.sealer
        self._keys = sealing.keys
        self._tenants = sealing.tenants
        self._copied = copied
        self._max_message_bytes = settings.max_message_bytes
        self._to_event = checkpoint_event if report.source == settings.checkpoint_topic else store_event
        self._written_to: set[int] = set()
        """Target partitions this run wrote to: any later event found there already means a gap."""
        self._copies: dict[Position, Position | asyncio.Future[RecordMetadata]] = dict(copied.copies)
        """Where each `thread.copy` went: known, or its last record's acknowledgement still to come."""
        self._pending: list[asyncio.Future[RecordMetadata]] = []
        self._pending_copies: list[Position] = []

    async def classify(self, event: SourceEvent) -> SourceEvent:
        """Decode the event as the merge needs it: typed when in the clear, opened when a sealed barrier."""
        if event.problem is not None:
            return event
        try:
            envelope = event.envelope = decode(event.value)
            ref = sealed_ref(envelope)
            if ref is None:
                event.event = self._to_event(envelope)
            elif envelope.type == ThreadCopyBarrier.TYPE:
                await self._keys.load([ref])
                key = self._keys.get(ref)
                if key is None:
                    raise GraphledgerError(
                        f"{self._source}:{event.partition}@{event.offset} is sealed for subject {ref}, which the key "
                        "store does not know: run encrypt-log with the key store the writers used"
                    )
                if key is not ERASED:
                    opened, event.opened = unseal(envelope, key)  # type: ignore[arg-type]
                    event.event = self._to_event(opened)
        except UnknownEventVersionError as exc:
            raise GraphledgerError(
                f"{self._source}:{event.partition}@{event.offset}: {exc}; run encrypt-log of that version"
            ) from exc
        except InvalidEventError as exc:
            event.problem = str(exc)
        return event

    async def copy(self, events: list[SourceEvent]) -> None:
        """Seal and write `events` in their order (skipping what earlier runs wrote), then wait for the
        broker's acknowledgement of all."""
        self._report.events += len(events)
        written_before = [self._written_before(e) for e in events]
        missing = [e for e, there in zip(events, written_before, strict=True) if there is None]
        prepared = iter(await asyncio.gather(*(self._prepare(e) for e in missing)))
        for event, there in zip(events, written_before, strict=True):
            if there is None:
                out = next(prepared)
                if out is not None:
                    await self._write(event, out)
                continue
            for q in there:
                self._refuse_gap(q, event)
            self._report.earlier += 1
        await self._settle()

    def _written_before(self, event: SourceEvent) -> set[int] | None:
        """The target partitions where an earlier run wrote the whole event (every one, if keyless), or
        None when it is to be written (or to be left out)."""
        if event.position in self._copied.torn:
            return None
        if event.key is None:
            there = self._copied.broadcasts.get(event.position, set())
            return there if len(there) == self._partitions else None
        q = self._copied.keyed_in(event.position)
        return None if q is None else {q}

    def _refuse_gap(self, q: int, event: SourceEvent) -> None:
        """Each target partition holds a prefix of what the merge sends it: nothing this run wrote there
        may come before an event an earlier run wrote there."""
        if q in self._written_to:
            raise GraphledgerError(
                f"{self._target}:{q} holds the copy of {self._source}:{event.partition}@{event.offset}, but not every "
                "event the copy writes there before it: it was not written by this command over this source; delete "
                "the target topics and run again"
            )

    async def _prepare(self, event: SourceEvent) -> Outgoing | None:
        if event.problem is not None:
            self._report.leave_out(event.position, event.problem)
            return None
        envelope = event.envelope
        assert envelope is not None
        if event.event is None or event.opened is not None:  # sealed already: copied as it is, or re-pointed
            headers = [h for h in event.headers if h[0] != HEADER_COPY_OF]
            return Outgoing(event.key, envelope, event.value, headers, sealed=False)
        tenant = tenant_of(event.event, self._tenants)
        if isinstance(event.event, ThreadCopyBarrier):
            return Outgoing(None, envelope, None, [], sealed=True, tenant=tenant)  # sealed once re-pointed
        try:
            key, sealed = await self._sealer.seal(event.event, tenant, envelope)
        except SubjectErasedError:
            self._report.erased += 1
            return None
        key_bytes = None if key is None else key.encode()
        headers = headers_for(sealed, _traceparent(event))
        return Outgoing(key_bytes, sealed, None, headers, sealed=sealed is not envelope, tenant=tenant)

    async def _write(self, event: SourceEvent, out: Outgoing) -> None:
        if isinstance(event.event, ThreadCopyBarrier):
            pointed = await self._point(event, event.event, out)
            if pointed is None:
                return
            out = pointed
        broadcast = out.key is None
        targets = list(range(self._partitions)) if out.key is None else [partition_of(out.key, self._partitions)]
        value = encode(out.envelope) if out.value is None else out.value
        headers = [*out.headers, (HEADER_COPY_OF, f"{event.partition}:{event.offset}".encode())]
        chunk_id = str(uuid.uuid4()) if event.position in self._copied.torn else out.envelope.event_id
        there = self._copied.broadcasts.get(event.position, set()) if broadcast else set()  # some, of a keyless one
        for q in targets:
            if q in there:
                self._refuse_gap(q, event)
                continue
            self._written_to.add(q)
            records = frame(value, headers, self._max_message_bytes, chunk_id)
            for r in records:
                sent = await self._producer.send(self._target, r.value, key=out.key, headers=r.headers, partition=q)
                self._pending.append(sent)
            if out.envelope.type == ThreadCopy.TYPE:
                self._copies[event.position] = sent
                self._pending_copies.append(event.position)
            self._report.records += len(records)
        if broadcast:
            self._report.broadcasts += 1
        elif out.sealed:
            self._report.sealed += 1
        else:
            self._report.kept += 1

    async def _point(self, event: SourceEvent, barrier: ThreadCopyBarrier, out: Outgoing) -> Outgoing | None:
        """The barrier naming its copy's position in the target, sealed; None when it is left out."""
        position = await self._copy_position((barrier.source_partition, barrier.source_offset))
        if position is None:
            why = (
                f"copy barrier naming {barrier.source_partition}@{barrier.source_offset}, where no thread.copy was "
                "copied (none there, or its subject is erased)"
            )
            self._report.leave_out(event.position, why)
            return None
        pointed = dataclasses.replace(barrier, source_partition=position[0], source_offset=position[1])
        envelope = dataclasses.replace(out.envelope, payload=pointed.to_payload())
        if event.opened is not None:
            cipher = self._keys.get(event.opened.ref)
            assert cipher is not None and cipher is not ERASED, "opened with this key in classify"
            sealed = seal(envelope, event.opened, cipher)  # type: ignore[arg-type]
            pointed_out = Outgoing(event.key, sealed, None, headers_for(sealed, _traceparent(event)), sealed=False)
        else:
            try:
                key, sealed = await self._sealer.seal(pointed, out.tenant, envelope)
            except SubjectErasedError:
                self._report.erased += 1
                return None
            assert key is not None, "a barrier is keyed by its target thread"
            pointed_out = Outgoing(key.encode(), sealed, None, headers_for(sealed, _traceparent(event)), sealed=True)
        self._report.barriers += 1
        return pointed_out

    async def _copy_position(self, source: Position) -> Position | None:
        found = self._copies.get(source)
        if isinstance(found, asyncio.Future):
            metadata = await found
            found = self._copies[source] = (metadata.partition, metadata.offset)
        return found

    async def _settle(self) -> None:
        """Wait until the broker acknowledged every record written (a failure is raised here)."""
        pending, self._pending = self._pending, []
        await asyncio.gather(*pending)
        for source in self._pending_copies:
            await self._copy_position(source)
        self._pending_copies.clear()


def _traceparent(event: SourceEvent) -> str | None:
    raw = header(event.headers, HEADER_TRACEPARENT)
    return raw.decode(errors="replace") if raw else None
