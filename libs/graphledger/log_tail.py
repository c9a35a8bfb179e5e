"""Where a partition's log ends right now, and its records past a given offset.

Used by the read API before every read (`pages`: whole records, which it folds), and by a client
before it answers a read of its own thread from what it holds (`tails`: keys). A consistent read
(docs/architecture.md, "Consistency") must reflect every write acknowledged before it began. With
`acks=all` the leader acknowledges a record only once the partition's high watermark has passed it, so
the high watermark in the answer to a fetch *sent after the read began* bounds every such write. One
fetch also brings the records between a given position and that end.

Every fetch starts one record before the first offset asked about: a fetch that finds data is answered
at once, while one positioned at the end of the log is held for its whole `max_wait` (tansu holds it
even when the wait is 0, and answers a wait of 0 with no partitions at all). The record before is
dropped from the answer. Reads that ask in the same turn of the event loop share one fetch per broker
and lane (a round fetches each partition from the lowest position asked, so `pages` has a lane of its own).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from aiokafka import TopicPartition
from aiokafka.client import AIOKafkaClient
from aiokafka.errors import KafkaError, NotLeaderForPartitionError, OffsetOutOfRangeError, for_code
from aiokafka.partitioner import murmur2
from aiokafka.protocol.fetch import FetchRequest
from aiokafka.protocol.offset import OffsetRequest
from aiokafka.record.memory_records import MemoryRecords

from graphledger.errors import LogUnavailableError
from graphledger.settings import Settings

log = logging.getLogger(__name__)

READ_UNCOMMITTED = 0
"""graphledger's producers use no transactions, so the last stable offset is the high watermark."""
FETCH_MAX_WAIT_MS = 100
"""A fetch that finds data is answered at once by Kafka, whatever its wait; tansu spends at most the
wait scanning its in-memory log for the position, and answers a large partition empty under a
millisecond. Every fetch here starts one record back, so it finds data, but at offset 0 of an empty
partition: that one waits `EMPTY_MAX_WAIT_MS`."""
EMPTY_MAX_WAIT_MS = 1
PAGE_BYTES = 1024 * 1024
"""Bytes one fetch brings per partition (Kafka answers at least one whole batch however large)."""
END_BYTES = 1
"""Bytes asked per partition when only its end matters (Kafka still answers one whole batch)."""
SCAN_MAX_BYTES = 8 * 1024 * 1024
"""Most bytes scanned for one partition per read; a tail longer than that is reported incomplete
(the read then waits for the projection to reach the log's end instead of looking at keys)."""
LATEST = -1
"""ListOffsets' timestamp for the end of the log."""
RETRY_S = 0.05
"""Pause before asking again after a leader moved or the metadata was stale."""
TAILS_LANE = "tails"
"""The round of fetches from the projection's positions (`ends`, `tails`)."""
PAGES_LANE = "pages"
"""The round of fetches of whole records from where the read API has read (`pages`), often far ahead."""


@dataclass(frozen=True, slots=True)
class Tail:
    """What the log of one partition holds from `start` to its end, `end` (the high watermark)."""

    start: int
    end: int
    keys: tuple[tuple[int, bytes | None], ...]
    """`(offset, key)` of each record in `[start, end)` that the scan reached, in offset order."""
    complete: bool
    """Whether `keys` covers all of `[start, end)`."""


@dataclass(frozen=True, slots=True)
class LogRecord:
    """One record as a fetch brought it."""

    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    timestamp: int
    """Kafka's timestamp in ms (-1: none)."""


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


_Answer = _Page | BaseException | None


@dataclass(slots=True)
class _Round:
    """The fetch one broker gets for the reads asking in one turn of the event loop."""

    done: asyncio.Future[dict[TopicPartition, _Answer]]
    positions: dict[TopicPartition, tuple[int, int]] = field(default_factory=dict)
    """Per partition: where to fetch from and how many bytes (the most any of its readers wants)."""


class LogTail:
    """A window on the log: an aiokafka client (its own, or a producer's), no consumer group, no offsets."""

    def __init__(self, settings: Settings, client: AIOKafkaClient | None = None) -> None:
        self._settings = settings
        self._client = client
        """Given: a started client someone else owns (a producer's)."""
        self._owned = client is None
        self._bootstrapped = client is not None
        self._bootstrap_lock = asyncio.Lock()
        self._rounds: dict[tuple[int, str], _Round] = {}
        """Per leader and lane, the round of this loop turn."""

    async def start(self) -> None:
        if not self._owned:
            return
        self._client = AIOKafkaClient(
            **self._settings.kafka_client_options(),  # type: ignore[arg-type]
            client_id="graphledger-read-api",
            request_timeout_ms=int(self._settings.consistency_timeout_s * 1000),
        )
        try:
            await self._ready()
        except LogUnavailableError as exc:
            # The API still starts: reads that need the log answer 503 until the broker is back.
            log.warning("%s", exc)

    async def stop(self) -> None:
        if self._client is not None and self._owned:
            await self._client.close()
        self._client = None

    async def partition_count(self, topic: str) -> int:
        """How many partitions `topic` has (from the broker's metadata, refreshed as aiokafka does)."""
        client = await self._ready()
        partitions = client.cluster.partitions_for_topic(topic)
        if partitions is None:
            try:
                partitions = await client._wait_on_metadata(topic)
            except (KafkaError, OSError) as exc:
                raise LogUnavailableError(f"Kafka did not describe topic {topic}: {exc or type(exc).__name__}") from exc
        return len(partitions)

    async def partition_of(self, topic: str, key: bytes) -> int:
        """The partition a record keyed `key` goes to: aiokafka's default partitioner, as the client's
        producer and Kafka's Java clients choose it (murmur2 of the key, positive, modulo the count)."""
        return (murmur2(key) & 0x7FFFFFFF) % await self.partition_count(topic)

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
                pages = await asyncio.gather(
                    *(self._shared_page(tp, max(start - 1, 0), END_BYTES) for tp, start in starts.items())
                )
        except TimeoutError:
            raise LogUnavailableError(f"Kafka did not answer a fetch within {timeout_s:g}s; retry") from None
        return {
            tp: page.end if page is not None else await self._list_end(tp)
            for tp, page in zip(starts, pages, strict=True)
        }

    async def pages(
        self, positions: Mapping[TopicPartition, int], timeout_s: float, *, below_end: bool = False
    ) -> dict[TopicPartition, Page]:
        """The records of each partition from its position (one fetch's worth, whole values) and the
        log's end, by fetches sent after this call (shared with the other reads of this loop turn).
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
        page = await self._shared_page(tp, max(position - back, 0), PAGE_BYTES, lane=PAGES_LANE)
        if page is None:  # the log ends before `position - 1` (Kafka: out of range)
            return Page(await self._list_end(tp), ())
        return Page(page.end, tuple(r for r in page.records if r.offset >= position))

    async def _tail(self, tp: TopicPartition, start: int) -> Tail:
        page = await self._shared_page(tp, max(start - 1, 0), PAGE_BYTES)
        if page is None:  # the log ends before `start - 1` (Kafka: out of range)
            end = await self._list_end(tp)
            return Tail(start, end, (), complete=end <= start)
        records = [(r.offset, r.key) for r in page.records if r.offset >= start]
        scanned = page.size
        position = max(page.records[-1].offset + 1 if page.records else start, start)
        # More than one page behind: read on from where the page stopped, up to the bound. Each fetch
        # starts one record back too (one at the position can come back empty), and a batch comes whole:
        # records before the position are dropped.
        while position < page.end and scanned < SCAN_MAX_BYTES:
            more = await self._page(tp, position - 1)
            found = [(r.offset, r.key) for r in more.records if r.offset >= position] if more is not None else []
            if not found:
                break
            records.extend(found)
            scanned += more.size
            position = found[-1][0] + 1
        return Tail(start, page.end, tuple(records), complete=position >= page.end)

    # -- fetches, shared by the reads of one loop turn -------------------------------------------------

    async def _shared_page(
        self, tp: TopicPartition, position: int, max_bytes: int, lane: str = TAILS_LANE
    ) -> _Page | None:
        """A page of `tp` from `position`, fetched in this loop turn's round for its leader and `lane`.

        A round fetches each partition from the lowest position asked: reads of whole records from
        where the read API has read (`pages`) have a lane of their own, so that a scan from the
        projection's position, far behind it, never takes the page they need."""
        while True:
            node = await self._leader(tp)
            round_ = self._rounds.get((node, lane))
            if round_ is None:
                round_ = self._rounds[(node, lane)] = _Round(asyncio.get_running_loop().create_future())
                asyncio.get_running_loop().call_soon(self._send_round, (node, lane))
            earlier, most = round_.positions.get(tp, (position, max_bytes))
            round_.positions[tp] = (min(position, earlier), max(max_bytes, most))
            answer = (await asyncio.shield(round_.done)).get(tp)
            if isinstance(answer, _Page) or answer is None:
                return answer
            await self._recover(tp, answer)

    def _send_round(self, key: tuple[int, str]) -> None:
        round_ = self._rounds.pop(key)
        task = asyncio.get_running_loop().create_task(self._fetch(key[0], round_.positions))

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
            answer = (await self._fetch(await self._leader(tp), {tp: (position, PAGE_BYTES)}))[tp]
            if isinstance(answer, _Page) or answer is None:
                return answer
            await self._recover(tp, answer)

    async def _fetch(
        self, node: int, positions: Mapping[TopicPartition, tuple[int, int]]
    ) -> dict[TopicPartition, _Answer]:
        """One fetch from `node`: per partition a page, None when the position is past the log's end
        (Kafka's OFFSET_OUT_OF_RANGE), or the error to recover from."""
        by_topic: dict[str, list[tuple[int, int, int]]] = {}
        for tp, (position, max_bytes) in positions.items():
            by_topic.setdefault(tp.topic, []).append((tp.partition, position, max_bytes))
        total = sum(max_bytes for _, max_bytes in positions.values())
        wait_ms = FETCH_MAX_WAIT_MS if all(position for position, _ in positions.values()) else EMPTY_MAX_WAIT_MS
        request = FetchRequest(wait_ms, 0, total, READ_UNCOMMITTED, list(by_topic.items()))
        try:
            response = await (await self._ready()).send(node, request)
        except (KafkaError, OSError) as exc:
            failure = LogUnavailableError(f"a fetch from Kafka node {node} failed: {exc or type(exc).__name__}")
            return dict.fromkeys(positions, failure)
        answers: dict[TopicPartition, _Answer] = {}
        for topic, partitions in response.topics:
            for partition, error_code, high_watermark, *rest in partitions:
                tp = TopicPartition(topic, partition)
                error = for_code(error_code)
                if error is OffsetOutOfRangeError:
                    answers[tp] = None
                elif error_code:
                    answers[tp] = error()
                else:
                    records, size = _records(rest[-1])
                    answers[tp] = _Page(high_watermark, records, size)
        for tp in positions:  # a broker that left a partition out of its answer: ask again
            answers.setdefault(tp, NotLeaderForPartitionError(f"Kafka node {node} did not answer for {tp}"))
        return answers

    async def _list_end(self, tp: TopicPartition) -> int:
        """The end offset by ListOffsets, for a partition whose log is shorter than the projection's
        position (a broker that lost records); tansu never gets here (it answers such a fetch empty)."""
        request = OffsetRequest(-1, READ_UNCOMMITTED, [(tp.topic, [(tp.partition, LATEST)])])
        try:
            response = await (await self._ready()).send(await self._leader(tp), request)
        except (KafkaError, OSError) as exc:
            raise LogUnavailableError(f"Kafka did not tell the end of {tp.topic}:{tp.partition}: {exc}") from exc
        for _topic, partitions in response.topics:
            for partition, error_code, *rest in partitions:
                if partition == tp.partition and not error_code:
                    return int(rest[-1])
        raise LogUnavailableError(f"Kafka did not tell the end of {tp.topic}:{tp.partition}; retry")

    async def _leader(self, tp: TopicPartition) -> int:
        client = await self._ready()
        node = client.cluster.leader_for_partition(tp)
        if node is None or node < 0:
            await self.partition_count(tp.topic)
            await client.force_metadata_update()
            node = client.cluster.leader_for_partition(tp)
            if node is None or node < 0:
                raise LogUnavailableError(f"Kafka names no leader for {tp.topic}:{tp.partition}; retry")
        return node

    async def _recover(self, tp: TopicPartition, failure: BaseException) -> None:
        """After a failed fetch of `tp`: refresh the metadata when the error says it is stale, else give up."""
        if isinstance(failure, KafkaError) and failure.retriable:
            log.info("a fetch of %s:%d failed (%s); refreshing metadata", tp.topic, tp.partition, failure)
            await (await self._ready()).force_metadata_update()
            await asyncio.sleep(RETRY_S)
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


def _records(raw: bytes | None) -> tuple[list[LogRecord], int]:
    """The data records in a fetched record set, and its size in bytes."""
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
        out.extend(LogRecord(r.offset, r.key, r.value, tuple(r.headers), r.timestamp) for r in batch)
    return out, len(raw)
