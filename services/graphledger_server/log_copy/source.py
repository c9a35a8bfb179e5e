"""The source: whole events of every partition of one topic, merged in the order they were written."""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.structs import ConsumerRecord

from graphledger.erasure.sealing import SealedSubject
from graphledger.errors import InvalidEventError
from graphledger.events import Event
from graphledger.events.checkpoint import ThreadCopyBarrier
from graphledger.events.chunks import parse_header
from graphledger.events.envelope import HEADER_CHUNK, Envelope, append_time_ms, header
from graphledger.log.gaps import GapWatch

Position = tuple[int, int]
"""`(partition, offset)` in one topic."""
BUFFERED_RECORDS = 2_000
"""Records held per source partition for the merge; a partition holding more is paused."""
FETCH_WAIT_MS = 1_000


@dataclass(slots=True)
class SourceEvent:
    """One whole event of the source (reassembled when chunked), at its last record's position."""

    partition: int
    offset: int
    timestamp: int
    """Its time (`append_time_ms` of its last record): when it was first appended to a log, which its
    copy carries in `gl-appended-ms`, and the order the merge writes the partitions in."""
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]]
    """The record's headers, without `gl-chunk`."""
    envelope: Envelope | None = None
    event: Event | None = None
    """The typed event: of an event in the clear, or of a sealed barrier opened to be rewritten."""
    opened: SealedSubject | None = None
    """The subject of a sealed barrier opened with its data key."""
    key_id: str | None = None
    """The fresh key a sealed barrier names (`graphledger.erasure.fresh_keys`), kept when it is sealed again."""
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
                return _timed(SourceEvent(self.partition, r.offset, r.timestamp, r.key, r.value or b"", headers))
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
                return _timed(SourceEvent(self.partition, r.offset, r.timestamp, r.key, value, kept))
        return None


def _timed(event: SourceEvent) -> SourceEvent:
    """The event at its time (its last record's Kafka timestamp, or the time a copy of it carries); one
    without is left out, as the projector dead-letters it."""
    try:
        event.timestamp = append_time_ms(event.timestamp, event.headers)
    except InvalidEventError as exc:
        event.problem = str(exc)
    return event


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
        self._gaps = GapWatch()
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
            chosen = min(ready or heads, key=lambda f: (f.head.timestamp, f.partition))  # type: ignore[union-attr]  # heads only
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
                if r.offset > feed.position and not self._gaps.may_pass(tp, feed.position, r.offset):
                    self._consumer.seek(tp, feed.position)  # passed over (`log.gaps`): fetched again
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
