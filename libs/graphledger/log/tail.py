"""Where a partition's log ends right now, and its records past a given offset.

Used by the read API before every read (`pages`: whole records, which it folds), and by a client
before it answers a read of its own thread from what it holds (`tails`: keys). A consistent read
(docs/architecture.md, "Consistency") must reflect every write acknowledged before it began. With
`acks=all` the leader acknowledges a record only once the partition's high watermark has passed it, so
the high watermark in the answer to a fetch *sent after the read began* bounds every such write. One
fetch also brings the records between a given position and that end.

A fetch from a position below the log's end is answered at once. Kafka answers one positioned at the
end at once too (`min_bytes` is 0), while tansu holds a fetch that finds no records for its whole
`max_wait`, and answers a wait of 0 with no partition at all. Both kinds are wanted: a read of a
thread's tail most often finds nothing past its position, and a fetch there must come back fast. So
where the end is all a fetch needs, or what it expects to find (`ends`; `tails` from a position at or
past the end this process last saw, `note_end`), it waits `END_MAX_WAIT_MS` and also asks for the
layout partition from its first record (`BEACON_BYTES`; `log.layout`: it always holds records,
and every process may read it): a fetch that finds records is answered at once by every broker, so
tansu answers it as Kafka does, with the other partitions' high watermarks read when it was handled
(2.3 ms p50 without it, 0.25 ms with it, on tansu 0.6). Where a fetch needs records it knows are
there, it starts one record back with `FETCH_MAX_WAIT_MS`, which tansu also spends scanning its
in-memory log for the position (with a 1 ms wait it answers a long partition with no records, the
high watermark still right). At most one shared fetch per broker and
lane is in flight: the reads arriving meanwhile join the next one, sent when it is answered (after all
of them began), so concurrent reads share fetches. A round fetches each partition from the lowest
position asked, so the reads of whole records from where the read API has read (`pages`) have a lane
of their own, apart from the fetches from the projection's positions (`ends`, `tails`).

Each fetch names the partition's leader epoch, learned with its leader from a Metadata request of our
own (`log/requests.py`: aiokafka's carry no epochs), so that a deposed leader answers with an error
instead of its stale high watermark. An answer saying the leader moved or the epoch is not the
replica's (NOT_LEADER, FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH, ...) refreshes the leaders and asks
again, within the read's deadline.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import cast

from aiokafka import TopicPartition
from aiokafka.client import AIOKafkaClient
from aiokafka.errors import (
    KafkaError,
    NotLeaderForPartitionError,
    OffsetOutOfRangeError,
    UnknownTopicOrPartitionError,
    UnsupportedCodecError,
)
from aiokafka.record.memory_records import MemoryRecords

from graphledger.errors import LogUnavailableError
from graphledger.log.compressed_batches import UnreadableBatchError, bound_decompression
from graphledger.log.gaps import GapWatch
from graphledger.log.layout import LAYOUT_PARTITION, PartitionLayout, key_hash
from graphledger.log.records import LogRecord, Tail
from graphledger.log.requests import (
    NO_EPOCH,
    EpochFetchRequest,
    EpochListOffsetsRequest,
    FetchPosition,
    Leader,
    LeaderMetadataRequest,
    error_for,
    fetched_partitions,
    listed_offset,
    read_metadata,
)
from graphledger.settings import Settings

log = logging.getLogger(__name__)

READ_UNCOMMITTED = 0
"""graphledger's producers use no transactions, so the last stable offset is the high watermark."""
FETCH_MAX_WAIT_MS = 100
"""The wait of a fetch for records: Kafka answers one that finds data at once, whatever its wait; tansu
spends at most the wait scanning its in-memory log for the position."""
END_MAX_WAIT_MS = 1
"""The wait of a fetch that wants the log's end, or expects to find nothing past its position (the
beacon makes tansu answer it at once; 0 is no good: tansu then answers with no partitions at all)."""
BEACON_BYTES = 1
"""What a fetch asks of the layout partition it carries as a beacon: any record makes it found data."""
PAGE_BYTES = 1024 * 1024
"""Bytes one fetch brings per partition (Kafka answers at least one whole batch however large)."""
END_BYTES = 1
"""Bytes asked per partition when only its end matters (Kafka still answers one whole batch)."""
SCAN_MAX_BYTES = 8 * 1024 * 1024
"""Most bytes scanned for one partition per read; a tail longer than that is reported incomplete
(the read then waits for the projection to reach the log's end instead of looking at keys)."""
LATEST = -1
"""ListOffsets' timestamp for the end of the log."""
UNKNOWN_TOPIC = UnknownTopicOrPartitionError.errno
RETRY_S = 0.05
"""Pause before asking again after a leader moved or the metadata was stale."""
LEADERS_MAX_AGE_S = 5.0
"""Age at which a topic's leaders and epochs are asked for again before a fetch: after an election, a
deposed leader not yet told it lost the partition answers an epoch it still holds with its stale end,
so this bounds how long after an election a read can be sent to it (docs/architecture.md)."""
TAILS_LANE = "tails"
"""The rounds of fetches from the projection's positions (`ends`, `tails`)."""
EMPTY_ANSWERS_S = 1.0
"""How long `pages` asks again for a position the log goes on past while answers bring nothing from it
(tansu answers a fetch whose scan of a long in-memory partition outlasts its wait with no records); then
the position is taken as unreadable. Kafka answers a fetch below the high watermark with records."""
ASK_AGAIN_S = 0.01
"""Pause before `pages` asks for a position again after the first time: an answer passed over it (until the
broker has it readable, or the gap has lasted `gaps.CONFIRM_S` and is read past, a read's deadline
permitting), or answers brought nothing from it (for `EMPTY_ANSWERS_S`)."""
PAGES_LANE = "pages"
"""The rounds of fetches of whole records from where the read API has read (`pages`), often far ahead."""


@dataclass(frozen=True, slots=True)
class Page:
    """Records of one partition from a position (as many as one fetch brought), and where its log ends."""

    end: int
    records: tuple[LogRecord, ...]


@dataclass(slots=True)
class _Page:
    end: int
    records: list[LogRecord]
    size: int
    gap: bool = False
    """The answer passed over the offsets after `records` (`log.gaps`): they are to be asked for again."""


_Answer = _Page | BaseException | None


@dataclass(slots=True)
class _Round:
    """The fetch one broker gets in one lane for the reads that join it."""

    done: asyncio.Future[dict[TopicPartition, _Answer]]
    positions: dict[TopicPartition, tuple[int, int]] = field(default_factory=dict)
    """Per partition: where to fetch from and how many bytes (the most any of its readers wants)."""
    wait_ms: int = END_MAX_WAIT_MS
    """The longest any of its readers wants the broker to look for records."""


class LogTail:
    """A window on the log: an aiokafka client (its own, or a producer's), no consumer group, no offsets."""

    def __init__(self, settings: Settings, client: AIOKafkaClient | None = None) -> None:
        bound_decompression(settings.max_decompressed_batch_bytes)
        self._settings = settings
        self._client = client
        """Given: a started client someone else owns (a producer's)."""
        self._owned = client is None
        self._bootstrapped = client is not None
        self._bootstrap_lock = asyncio.Lock()
        self._rounds: dict[tuple[int, str], _Round] = {}
        """Per broker and lane, the round reads join: sent once the one in flight there has its answer."""
        self._in_flight: dict[tuple[int, str], asyncio.Task[dict[TopicPartition, _Answer]]] = {}
        self._leaders: dict[TopicPartition, Leader] = {}
        """Each partition's leader and leader epoch, from our own Metadata requests."""
        self._asking: dict[str, asyncio.Future[None]] = {}
        """The Metadata request in flight per topic, which every read needing it waits for."""
        self._asked_at: dict[str, float] = {}
        self._clock = time.monotonic
        self._layout = PartitionLayout(settings)
        """The source topics' recorded partition counts, which `partition_count` checks the broker's against."""
        self._seen_ends: dict[TopicPartition, int] = {}
        """The furthest end of each partition this process saw: a fetch's high watermark, an acknowledged
        write (`note_end`). A tail from before it has records to find."""
        self._beacon = TopicPartition(settings.layout_topic, LAYOUT_PARTITION)
        self._gaps = GapWatch()

    async def start(self) -> None:
        if not self._owned:
            return
        self._client = AIOKafkaClient(
            **self._settings.kafka_client_options(),
            client_id="graphledger-read-api",
            request_timeout_ms=int(self._settings.consistency_timeout_s * 1000),
        )
        try:
            await self._ready()
        except LogUnavailableError as exc:
            # The API still starts: reads that need the log answer 503 until the broker is back.
            log.warning("%s", exc)

    async def stop(self) -> None:
        """Cancel the fetches in flight, then close the client: a fetch it closed under would fail a
        round that no read awaits any more (its error never retrieved, logged at exit)."""
        for round_ in self._rounds.values():
            round_.done.cancel()
        self._rounds.clear()
        in_flight = list(self._in_flight.values())
        for task in in_flight:
            task.cancel()
        await asyncio.gather(*in_flight, return_exceptions=True)
        self._in_flight.clear()
        if self._client is not None and self._owned:
            await self._client.close()
        self._client = None

    async def partition_count(self, topic: str) -> int:
        """How many partitions `topic` has (from the broker's metadata, refreshed as aiokafka does); for a
        source topic, PartitionCountChangedError when that is not the count its layout records."""
        client = await self._ready()
        partitions = client.cluster.partitions_for_topic(topic)
        try:
            if partitions is None:
                partitions = await client._wait_on_metadata(topic)
            await self._layout.load(client)
        except (KafkaError, OSError) as exc:
            raise LogUnavailableError(f"Kafka did not describe topic {topic}: {exc or type(exc).__name__}") from exc
        self._layout.check(topic, len(partitions))
        return len(partitions)

    async def partition_of(self, topic: str, key: bytes) -> int:
        """The partition a record keyed `key` goes to: aiokafka's default partitioner, as the client's
        producer and Kafka's Java clients choose it (murmur2 of the key, positive, modulo the count)."""
        return key_hash(key) % await self.partition_count(topic)

    def note_end(self, tp: TopicPartition, end: int) -> None:
        """The log of `tp` reaches `end` at least (a write this process had acknowledged below it)."""
        if end > self._seen_ends.get(tp, 0):
            self._seen_ends[tp] = end

    async def tails(self, starts: Mapping[TopicPartition, int], timeout_s: float) -> dict[TopicPartition, Tail]:
        """The tail of each partition from its start offset, read by fetches sent after this call."""
        try:
            async with asyncio.timeout(timeout_s):
                return dict(zip(starts, await asyncio.gather(*(self._tail(tp, s) for tp, s in starts.items())),
                                strict=True))  # fmt: skip
        except TimeoutError:
            raise LogUnavailableError(f"Kafka did not answer a fetch within {timeout_s:g}s; retry") from None

    async def ends(self, starts: Mapping[TopicPartition, int], timeout_s: float) -> dict[TopicPartition, int]:
        """The end (high watermark) of each partition, by fetches sent after this call; `starts` are
        offsets known to be in the log or at its end (the projection's positions)."""
        try:
            async with asyncio.timeout(timeout_s):
                pages = await self._shared_ends(starts)
                return {
                    tp: page.end if page is not None else await self._list_end(tp)
                    for tp, page in zip(starts, pages, strict=True)
                }
        except TimeoutError:
            raise LogUnavailableError(f"Kafka did not answer a fetch within {timeout_s:g}s; retry") from None

    async def pages(
        self, positions: Mapping[TopicPartition, int], timeout_s: float, *, below_end: bool = False
    ) -> dict[TopicPartition, Page]:
        """The records of each partition from its position (one fetch's worth, whole values) and the
        log's end, by fetches sent after this call (shared with concurrent reads).

        A position at or past the end this process last saw is most likely the end: it is asked there
        with a 1 ms wait and the beacon, so tansu answers at once without listing the partition's
        batches (which it does for every fetch that finds records, at a cost that grows with the log);
        when that answer holds no records but the log goes on (tansu's listing ran out of the 1 ms), the
        position is asked again as one below the end is: from one record back with the long wait (tansu
        answers a fetch that finds records at once).
        An answer that passed over the records at a position (`log.gaps`) is asked again every
        `ASK_AGAIN_S` until they are readable or the gap is read past.
        `below_end`: every position is known to be below its log's end, so the fetch starts at it, not
        one record back (a broker may answer a fetch with the one batch that holds its first record)."""
        back = 0 if below_end else 1
        try:
            async with asyncio.timeout(timeout_s):
                found = await asyncio.gather(*(self._from(tp, position, back) for tp, position in positions.items()))
        except TimeoutError:
            raise LogUnavailableError(f"Kafka did not answer a fetch within {timeout_s:g}s; retry") from None
        return dict(zip(positions, found, strict=True))

    async def _from(self, tp: TopicPartition, position: int, back: int) -> Page:
        page: _Page | None = None
        if back and position >= self._seen_ends.get(tp, 0):
            page = await self._shared_page(tp, position, PAGE_BYTES, END_MAX_WAIT_MS, PAGES_LANE)
        give_up = time.monotonic() + EMPTY_ANSWERS_S
        asked = 0
        while page is None or not (page.end <= position or any(r.offset >= position for r in page.records)):
            # Not asked at the end, or the log went on past it and tansu found no records within the wait
            # (asked again for `EMPTY_ANSWERS_S`), or the answer passed over the records at the position
            # (asked again until they are readable or the gap is read past).
            if page is not None and not page.gap and time.monotonic() >= give_up:
                break
            if asked:
                await asyncio.sleep(ASK_AGAIN_S)
            page = await self._shared_page(tp, max(position - back, 0), PAGE_BYTES, FETCH_MAX_WAIT_MS, PAGES_LANE)
            asked += 1
            if page is None:
                break
        if page is None:  # the log ends before `position - 1` (Kafka: out of range)
            return Page(await self._list_end(tp), ())
        return Page(page.end, tuple(r for r in page.records if r.offset >= position))

    async def _tail(self, tp: TopicPartition, start: int) -> Tail:
        if start < self._seen_ends.get(tp, 0):  # records to find: at once, from one record back
            page = await self._shared_page(tp, max(start - 1, 0), PAGE_BYTES, FETCH_MAX_WAIT_MS)
        else:  # most likely the end
            page = await self._shared_page(tp, start, PAGE_BYTES, END_MAX_WAIT_MS)
        if page is None:  # the log ends before the position (Kafka: out of range)
            end = await self._list_end(tp)
            return Tail(start, end, (), complete=end <= start)
        records = [r for r in page.records if r.offset >= start]
        scanned = page.size
        position = max(page.records[-1].offset + 1 if page.records else start, start)
        # More than one page behind, or a fetch that expected the end and found more: read on from where
        # the page stopped, up to the bound. Each fetch starts one record back (one at the position waits
        # when it finds nothing), and a batch comes whole: records before the position are dropped.
        while position < page.end and scanned < SCAN_MAX_BYTES:
            more = await self._page(tp, max(position - 1, 0))
            if more is None:
                break
            found = [r for r in more.records if r.offset >= position]
            if not found:
                break
            records.extend(found)
            scanned += more.size
            position = found[-1].offset + 1
        return Tail(start, page.end, tuple(records), complete=position >= page.end)

    # -- fetches, shared by the reads of one loop turn -------------------------------------------------

    async def _shared_ends(self, starts: Mapping[TopicPartition, int]) -> list[_Page | None]:
        """`_shared_page` of each partition at its start for its end, joining each leader's next round once
        for all of them (one wait per round, not a task per partition: this runs before every read of the
        read API). A partition whose leader is to be asked for, or whose answer is an error to recover
        from, goes the way of `_shared_page`."""
        rounds: dict[TopicPartition, _Round] = {}
        for tp, start in starts.items():
            node = self._fresh_leader(tp)
            if node is not None:
                rounds[tp] = self._join(node, TAILS_LANE, tp, start, END_BYTES, END_MAX_WAIT_MS)
        answers: dict[asyncio.Future[dict[TopicPartition, _Answer]], dict[TopicPartition, _Answer]] = {}
        for round_ in rounds.values():
            if round_.done not in answers:
                answers[round_.done] = await asyncio.shield(round_.done)
        pages = {tp: answers[round_.done].get(tp) for tp, round_ in rounds.items()}
        again = [tp for tp in starts if tp not in pages or not (isinstance(pages[tp], _Page) or pages[tp] is None)]
        if again:
            found = await asyncio.gather(*(self._end_again(tp, starts[tp], pages.get(tp)) for tp in again))
            pages.update(zip(again, found, strict=True))
        return [cast(_Page | None, pages[tp]) for tp in starts]

    async def _end_again(self, tp: TopicPartition, start: int, failure: _Answer) -> _Page | None:
        """`_shared_page` of `tp` for its end, after recovering from the failure of a first fetch, if any."""
        if failure is not None:
            await self._recover(tp, cast(BaseException, failure))
        return await self._shared_page(tp, start, END_BYTES, END_MAX_WAIT_MS)

    def _join(self, node: int, lane: str, tp: TopicPartition, position: int, max_bytes: int, wait_ms: int) -> _Round:
        """The next round to `node` in `lane`, asking for `tp` from `position` (sent once the round in flight
        there, if any, has its answer)."""
        round_ = self._rounds.get((node, lane))
        if round_ is None:
            loop = asyncio.get_running_loop()
            round_ = self._rounds[(node, lane)] = _Round(loop.create_future())
            in_flight = self._in_flight.get((node, lane))
            if in_flight is None or in_flight.done():
                loop.call_soon(self._send_round, (node, lane))
            else:
                in_flight.add_done_callback(functools.partial(self._send_round_after, (node, lane)))
        earlier, most = round_.positions.get(tp, (position, max_bytes))
        round_.positions[tp] = (min(position, earlier), max(max_bytes, most))
        round_.wait_ms = max(round_.wait_ms, wait_ms)
        return round_

    async def _shared_page(
        self, tp: TopicPartition, position: int, max_bytes: int, wait_ms: int, lane: str = TAILS_LANE
    ) -> _Page | None:
        """A page of `tp` from `position`, fetched in the next round for its leader and `lane`: every read
        that arrives while a round is in flight there joins the one after it (sent after all of them
        began), so many concurrent reads cost a fetch or two, not one each.

        A round fetches each partition from the lowest position asked, waiting the longest any read
        asked: reads of whole records from where the read API has read (`pages`) have a lane of their
        own, so that a scan from the projection's position, far behind it, never takes the page they need."""
        while True:
            round_ = self._join(await self._leader(tp), lane, tp, position, max_bytes, wait_ms)
            answer = (await asyncio.shield(round_.done)).get(tp)
            if isinstance(answer, _Page) or answer is None:
                return answer
            await self._recover(tp, answer)

    def _send_round_after(self, key: tuple[int, str], _: object) -> None:
        self._send_round(key)

    def _send_round(self, key: tuple[int, str]) -> None:
        round_ = self._rounds.pop(key, None)
        if round_ is None:
            return  # `stop` dropped it (and cancelled the fetch it waited behind)
        fetch = self._fetch(key[0], round_.positions, round_.wait_ms)
        task = self._in_flight[key] = asyncio.get_running_loop().create_task(fetch)

        def settle(finished: asyncio.Task[dict[TopicPartition, _Answer]]) -> None:
            if round_.done.cancelled():
                return
            if finished.cancelled():
                round_.done.cancel()
            elif (exc := finished.exception()) is not None:
                round_.done.set_exception(exc)
            else:
                round_.done.set_result(finished.result())

        task.add_done_callback(settle)

    async def _page(self, tp: TopicPartition, position: int) -> _Page | None:
        """A page of `tp` from `position`, fetched on its own (the reader is more than a page behind)."""
        while True:
            answer = (await self._fetch(await self._leader(tp), {tp: (position, PAGE_BYTES)}, FETCH_MAX_WAIT_MS))[tp]
            if isinstance(answer, _Page) or answer is None:
                return answer
            await self._recover(tp, answer)

    async def _fetch(
        self, node: int, positions: Mapping[TopicPartition, tuple[int, int]], wait_ms: int
    ) -> dict[TopicPartition, _Answer]:
        """One fetch from `node`, naming each partition's leader epoch: per partition a page, None when
        the position is past the log's end (Kafka's OFFSET_OUT_OF_RANGE), or the error to recover from.
        At offset 0 (an empty partition, or one read from its start) it never waits long."""
        if not all(position for position, _ in positions.values()):
            wait_ms = END_MAX_WAIT_MS
        at = {tp: FetchPosition(offset, max_bytes, self._epoch(tp)) for tp, (offset, max_bytes) in positions.items()}
        if wait_ms <= END_MAX_WAIT_MS and self._beacon not in at and self._beacon_led_by(node):
            at[self._beacon] = FetchPosition(0, BEACON_BYTES, NO_EPOCH)
        total = sum(position.max_bytes for position in at.values())
        request = EpochFetchRequest(wait_ms, 0, total, READ_UNCOMMITTED, at)
        try:
            response = await (await self._ready()).send(node, request)
        except (KafkaError, OSError) as exc:
            failure = LogUnavailableError(f"a fetch from Kafka node {node} failed: {exc or type(exc).__name__}")
            return dict.fromkeys(positions, failure)
        answers: dict[TopicPartition, _Answer] = {}
        for tp, error_code, high_watermark, raw in fetched_partitions(response):
            if tp not in positions:
                continue  # the beacon: what it holds, or any error about it, tells nothing of the read
            error = error_for(error_code)
            if error is OffsetOutOfRangeError:
                answers[tp] = None
            elif error_code:
                answers[tp] = error(f"Kafka node {node} answered a fetch of {tp.topic}:{tp.partition} {error.message}")
            else:
                records, size = _records(tp, raw)
                readable = self._contiguous(tp, positions[tp][0], records)
                answers[tp] = _Page(high_watermark, readable, size, gap=len(readable) < len(records))
                self.note_end(tp, high_watermark)
        for tp in positions:  # a broker that left a partition out of its answer: ask again
            answers.setdefault(tp, NotLeaderForPartitionError(f"Kafka node {node} did not answer for {tp}"))
        return answers

    def _contiguous(self, tp: TopicPartition, position: int, records: list[LogRecord]) -> list[LogRecord]:
        """`records` of a fetch from `position`, up to the first offset the answer passed over
        (`log.gaps`): a page ends there, and the next fetch asks for it again."""
        expected = position
        for i, record in enumerate(records):
            if record.offset > expected and not self._gaps.may_pass(tp, expected, record.offset):
                return records[:i]
            expected = max(expected, record.offset + 1)
        return records

    def _beacon_led_by(self, node: int) -> bool:
        """Whether `node` leads the layout partition (only a partition's leader answers for it), as the
        Metadata answer that named the fetched partitions' leaders said."""
        leader = self._leaders.get(self._beacon)
        return leader is not None and leader.node == node

    async def _list_end(self, tp: TopicPartition) -> int:
        """The end offset by ListOffsets, for a partition whose log is shorter than the projection's
        position (a broker that lost records); tansu never gets here (it answers such a fetch empty)."""
        while True:
            node = await self._leader(tp)
            request = EpochListOffsetsRequest(tp, LATEST, self._epoch(tp), READ_UNCOMMITTED)
            try:
                response = await (await self._ready()).send(node, request)
            except (KafkaError, OSError) as exc:
                raise LogUnavailableError(f"Kafka did not tell the end of {tp.topic}:{tp.partition}: {exc}") from exc
            error_code, end = listed_offset(response, tp)
            if end is not None:
                return int(end)
            error = error_for(error_code)
            await self._recover(tp, error(f"Kafka node {node} answered ListOffsets of {tp} {error.message}"))

    async def _leader(self, tp: TopicPartition) -> int:
        """The node leading `tp`, as our last Metadata answer named it (asked again when it named none or
        is older than `LEADERS_MAX_AGE_S`); a partition in an election is asked about again until it has a
        leader (the read's deadline)."""
        node = self._fresh_leader(tp)
        if node is not None:
            return node
        leader = self._leaders.get(tp)
        if leader is not None and self._clock() - self._asked_at.get(tp.topic, 0.0) > LEADERS_MAX_AGE_S:
            try:
                await self._ask_leaders(tp.topic)
            except LogUnavailableError as exc:  # the fetch, to the leader we know, tells whether it still is
                log.info("%s", exc)
            leader = self._leaders.get(tp)
        while leader is None or leader.node < 0:
            try:
                await self._ask_leaders(tp.topic)
            except LogUnavailableError as exc:
                cause = exc.__cause__
                if not isinstance(cause, KafkaError) or not cause.retriable or cause.errno == UNKNOWN_TOPIC:
                    raise
                await asyncio.sleep(RETRY_S)  # LEADER_NOT_AVAILABLE and the like: a topic being created, or moving
                continue
            leader = self._leaders.get(tp)
            if leader is None:
                raise LogUnavailableError(f"Kafka names no partition {tp.partition} of {tp.topic}")
            if leader.node < 0:
                await asyncio.sleep(RETRY_S)
        return leader.node

    def _fresh_leader(self, tp: TopicPartition) -> int | None:
        """The node leading `tp` as our last Metadata answer named it, unless it named none or is older than
        `LEADERS_MAX_AGE_S` (then `_leader` asks again)."""
        leader = self._leaders.get(tp)
        if leader is None or leader.node < 0 or self._clock() - self._asked_at.get(tp.topic, 0.0) > LEADERS_MAX_AGE_S:
            return None
        return leader.node

    def _epoch(self, tp: TopicPartition) -> int:
        leader = self._leaders.get(tp)
        return leader.epoch if leader is not None else NO_EPOCH

    async def _ask_leaders(self, topic: str) -> None:
        """Learn the leader and leader epoch of each partition of `topic`; reads asking at once share one
        request."""
        asking = self._asking.get(topic)
        if asking is None:
            asking = self._asking[topic] = asyncio.ensure_future(self._metadata(topic))
            asking.add_done_callback(lambda done: self._asking.pop(topic, None))
            asking.add_done_callback(lambda done: done.cancelled() or done.exception())  # read by a waiter, or not
        await asyncio.shield(asking)

    async def _metadata(self, topic: str) -> None:
        """Ask for the leaders of `topic`'s partitions, and of the beacon's (a fetch carries it to a node
        that leads it; a beacon the broker does not describe is left out)."""
        client = await self._ready()
        asked = list(dict.fromkeys((topic, self._beacon.topic)))
        try:
            response = await client.send(client.get_random_node(), LeaderMetadataRequest(asked))
        except (KafkaError, OSError) as exc:
            raise LogUnavailableError(f"Kafka did not describe topic {topic}: {exc or type(exc).__name__}") from exc
        topics, leaders = read_metadata(response)
        beacon = topics.get(self._beacon.topic)
        if topic != self._beacon.topic:
            self._leaders.pop(self._beacon, None)
            if beacon is not None and not beacon.error_code and self._beacon in leaders:
                self._leaders[self._beacon] = leaders[self._beacon]
            leaders = {tp: leader for tp, leader in leaders.items() if tp.topic == topic}
        found = topics.get(topic)
        if found is None or found.error_code:
            error = error_for(found.error_code if found is not None else UNKNOWN_TOPIC)
            # The cause is the broker's error: a client denied the topic reads through the read API instead.
            raise LogUnavailableError(f"Kafka did not describe topic {topic}: {error.message}") from error()
        for tp in [tp for tp in self._leaders if tp.topic == topic]:
            del self._leaders[tp]
        self._leaders.update(leaders)
        self._asked_at[topic] = self._clock()
        if any(client.cluster.broker_metadata(leader.node) is None for leader in leaders.values() if leader.node >= 0):
            await client.force_metadata_update()  # a broker aiokafka does not know yet: learn its address

    async def _recover(self, tp: TopicPartition, failure: BaseException) -> None:
        """After a failed fetch of `tp`: ask for its leader again when the error says ours is stale (a
        moved leader, a fenced or unknown epoch), else give up."""
        if isinstance(failure, KafkaError) and failure.retriable:
            log.info("a fetch of %s:%d failed (%s); asking for its leader again", tp.topic, tp.partition, failure)
            await asyncio.sleep(RETRY_S)
            await self._ask_leaders(tp.topic)
            return
        if isinstance(failure, LogUnavailableError):
            raise failure
        raise LogUnavailableError(f"a fetch of {tp.topic}:{tp.partition} failed: {failure!r}") from failure

    async def _ready(self) -> AIOKafkaClient:
        """The client, bootstrapped (again, after a broker that was away at start); else LogUnavailableError."""
        if self._client is None:
            raise LogUnavailableError("the read API's Kafka client is not started")
        if not self._bootstrapped:
            async with self._bootstrap_lock:
                if not self._bootstrapped:
                    try:
                        await self._client.bootstrap()
                    except (KafkaError, OSError) as exc:
                        where = self._settings.kafka_bootstrap_servers
                        raise LogUnavailableError(
                            f"cannot reach Kafka at {where}: {exc or type(exc).__name__}"
                        ) from exc
                    self._bootstrapped = True
        return self._client


def _records(tp: TopicPartition, raw: bytes | None) -> tuple[list[LogRecord], int]:
    """The data records in a fetched record set, up to its first unreadable batch (a compressed one
    beyond the bound), and its size in bytes."""
    if not raw:
        return [], 0
    out: list[LogRecord] = []
    records = MemoryRecords(raw)
    while records.has_next():
        batch = records.next_batch()
        if batch is None:
            break
        if getattr(batch, "is_control_batch", False):
            continue
        try:
            at = (tp.topic, tp.partition)
            out.extend(LogRecord(*at, r.offset, r.key, r.value, tuple(r.headers), r.timestamp) for r in batch)
        except (UnreadableBatchError, UnsupportedCodecError) as exc:
            log.warning("a record batch at offset %d is unreadable (%s); the scan ends there", batch.base_offset, exc)
            break
    return out, len(raw)
