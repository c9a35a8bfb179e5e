"""The partition count each source topic was created with, recorded in Kafka, and the check that every
writer and reader makes against it.

A record's partition is `murmur2(key) % partitions`, in the producers and in every reader that finds a
thread's partition (the read API, the client's log reads). Adding partitions to a source topic moves
most threads, and metadata is refreshed at different moments in different processes: one thread's
records would land on two partitions, which the projector applies independently and a replay interleaves
differently (a delete and a put reordered, forks that never happened). Kafka cannot remove partitions,
so the only way to change the count is to copy the log into new topics (docs/operations.md, "Changing
the partition count").

So `topics ensure` records each source topic's count in `<prefix>.layout` (one partition, compacted: a
record keyed by the topic's name whose value is `{"partitions": N}`), which every process can read
with the Kafka access it already has (no Postgres). A process reads it once, at its first write or its
first partition lookup, and checks the count the broker reports against it at every routing decision,
so at every metadata refresh too: the producers when they pick a record's partition
(`PartitionCheckedProducer`, what `client/producer.new_producer` builds), the log tail when it tells a
key's partition, the projector at every assignment. A count that differs stops them with
`PartitionCountChangedError` before anything is written. Without a layout record (topics created before
it existed, or by hand without `topics ensure`) the count first seen is kept for the process's life
and a warning says to run `graphledger topics ensure`, which records the count the topics have.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import random
from collections.abc import Sequence
from typing import Any

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.client import AIOKafkaClient
from aiokafka.errors import (
    KafkaError,
    KafkaTimeoutError,
    NotLeaderForPartitionError,
    TopicAuthorizationFailedError,
    UnknownTopicOrPartitionError,
)
from aiokafka.partitioner import murmur2
from aiokafka.record.memory_records import MemoryRecords

from graphledger.errors import PartitionCountChangedError
from graphledger.log.requests import (
    EpochFetchRequest,
    FetchPosition,
    LeaderMetadataRequest,
    error_for,
    fetched_partitions,
    read_metadata,
)
from graphledger.settings import Settings

log = logging.getLogger(__name__)

LAYOUT_PARTITION = 0
FETCH_BYTES = 1024 * 1024
"""One fetch of the layout topic: it holds a record per source topic and per `topics ensure` that changed one."""
LOAD_TIMEOUT_S = 10.0
FETCH_WAIT_MS = 1
"""A fetch only ever asks where records are, but the first one finds none in an empty layout topic: it
is held this long (tansu answers a wait of 0 with no partition at all)."""


@functools.lru_cache(maxsize=65536)
def key_hash(key: bytes) -> int:
    """`murmur2(key)`, positive: a record's partition is this modulo the count, as Kafka's Java clients and
    aiokafka's default partitioner choose it. Cached: every record of a thread has the same key, and the
    pure-Python murmur2 of a 64-byte key takes about 12 us, on each write and each partition lookup."""
    hashed: int = murmur2(key)
    return hashed & 0x7FFFFFFF


def key_partitioner(key: bytes | None, all_partitions: Sequence[int], available: Sequence[int]) -> int:
    """aiokafka's `DefaultPartitioner`, with the key's hash cached (`key_hash`)."""
    if key is None:
        return random.choice(available or all_partitions)
    return all_partitions[key_hash(key) % len(all_partitions)]


def layout_record(topic: str, partitions: int) -> tuple[bytes, bytes]:
    """The key and value that record `topic`'s partition count."""
    return topic.encode(), json.dumps({"partitions": partitions}, separators=(",", ":")).encode()


def parse_record(key: bytes | None, value: bytes | None) -> tuple[str, int] | None:
    """The topic and count a layout record names; None for a record that names none (skipped)."""
    if key is None or value is None:
        return None
    try:
        partitions = json.loads(value)["partitions"]
    except (ValueError, KeyError, TypeError):
        return None
    return (key.decode(errors="replace"), partitions) if isinstance(partitions, int) and partitions > 0 else None


async def read_layout(client: AIOKafkaClient, layout_topic: str, timeout_s: float) -> dict[str, int] | None:
    """Every source topic's recorded partition count (the last record of each wins); None when the layout
    topic does not exist or this Kafka user may not read it. An answer Kafka calls retriable (a leader
    moving, a partition its leader does not serve yet) is asked again after the client's backoff, as
    aiokafka retries its own requests; raises a KafkaError when Kafka does not answer in time."""
    last: KafkaError | None = None
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                try:
                    return await _read(client, layout_topic)
                except KafkaError as exc:
                    if not exc.retriable:
                        raise
                    last = exc
                await asyncio.sleep(client._retry_backoff)
    except TimeoutError:
        raise KafkaTimeoutError(
            f"Kafka did not serve {layout_topic} within {timeout_s:g}s" + (f": {last}" if last else "")
        ) from None


async def _read(client: AIOKafkaClient, layout_topic: str) -> dict[str, int] | None:
    tp = TopicPartition(layout_topic, LAYOUT_PARTITION)
    topics, leaders = read_metadata(await client.send(client.get_random_node(), LeaderMetadataRequest([layout_topic])))
    found = topics.get(layout_topic)
    if found is None or found.error_code == UnknownTopicOrPartitionError.errno:
        return None
    if found.error_code == TopicAuthorizationFailedError.errno:
        _not_allowed(layout_topic)
        return None
    leader = leaders.get(tp)
    if found.error_code or leader is None or leader.node < 0:
        error = error_for(found.error_code)
        raise error(f"Kafka cannot serve {layout_topic} now ({error.message}, leader {leader}); retry")
    if client.cluster.broker_metadata(leader.node) is None:
        await client.force_metadata_update()
    counts: dict[str, int] = {}
    position, end = 0, None
    while end is None or position < end:
        at = {tp: FetchPosition(position, FETCH_BYTES, leader.epoch)}
        answer = list(
            fetched_partitions(await client.send(leader.node, EpochFetchRequest(FETCH_WAIT_MS, 0, FETCH_BYTES, 0, at)))
        )
        if not answer:
            raise NotLeaderForPartitionError(f"Kafka node {leader.node} did not answer for {layout_topic}; retry")
        [(_, error_code, high_watermark, raw)] = answer
        if error_code == TopicAuthorizationFailedError.errno:
            _not_allowed(layout_topic)
            return None
        if error_code:
            error = error_for(error_code)
            raise error(f"Kafka answered a fetch of {layout_topic} {error.message}; retry")
        end = high_watermark
        records = MemoryRecords(raw) if raw else None
        moved = False
        while records is not None and records.has_next():
            batch = records.next_batch()
            if batch is None:
                break
            for record in batch:
                if record.offset >= position:
                    parsed = parse_record(record.key, record.value)
                    if parsed is not None:
                        counts[parsed[0]] = parsed[1]
                    position, moved = record.offset + 1, True
        if not moved:
            break  # the rest of the log is compacted away or empty
    return counts


def _not_allowed(layout_topic: str) -> None:
    # A Kafka user without READ on the layout topic (granted before it existed) still writes: as without a
    # record, each process keeps the count it first sees.
    log.warning("this Kafka user may not read %s: grant it READ and DESCRIBE on the topic", layout_topic)


class PartitionLayout:
    """The recorded counts of one prefix's source topics, read once, and the check against them."""

    def __init__(self, settings: Settings) -> None:
        self.topic = settings.layout_topic
        self._sources = frozenset((settings.checkpoint_topic, settings.store_topic))
        self.recorded: dict[str, int] | None = None
        """None until read; then the counts recorded (empty when the layout topic does not exist)."""
        self._first_seen: dict[str, int] = {}
        self._loading: asyncio.Future[None] | None = None

    @property
    def loaded(self) -> bool:
        return self.recorded is not None

    def guards(self, topic: str) -> bool:
        """Whether `topic` is a source topic, whose count is checked."""
        return topic in self._sources

    async def load(self, client: AIOKafkaClient, timeout_s: float = LOAD_TIMEOUT_S) -> None:
        """Read the layout topic once (callers at once share the read); a failure leaves it to the next call."""
        if self.recorded is not None:
            return
        if self._loading is None:
            self._loading = asyncio.ensure_future(self._load(client, timeout_s))
            self._loading.add_done_callback(self._loaded)
        await asyncio.shield(self._loading)

    def _loaded(self, done: asyncio.Future[None]) -> None:
        self._loading = None
        if not done.cancelled():
            done.exception()  # a failure is raised to the callers waiting; none may be left

    async def _load(self, client: AIOKafkaClient, timeout_s: float) -> None:
        counts = await read_layout(client, self.topic, timeout_s)
        if counts is None or not self._sources <= set(counts):
            log.warning(
                "%s records no partition count for %s: each process keeps the count it first sees. Run "
                "`graphledger topics ensure` to record the counts the topics have",
                self.topic,
                ", ".join(sorted(self._sources - set(counts or ()))),
            )
        self.recorded = {topic: n for topic, n in (counts or {}).items() if topic in self._sources}

    def check(self, topic: str, count: int) -> None:
        """Raise PartitionCountChangedError when the broker reports another count for a source topic than
        the one recorded (or, without a record, than the one this process first saw)."""
        if topic not in self._sources or count <= 0:
            return
        expected = (self.recorded or {}).get(topic)
        if expected is None:
            expected = self._first_seen.setdefault(topic, count)
        if count != expected:
            raise PartitionCountChangedError(topic, expected, count, self.topic)


class PartitionCheckedProducer(AIOKafkaProducer):  # type: ignore[misc]  # aiokafka ships no types
    """aiokafka's producer, refusing to route a record of a source topic while the broker reports another
    partition count than the one recorded: the check runs where the partition is chosen, on the metadata
    the choice uses, so nothing goes to a partition of a changed layout."""

    def __init__(self, layout: PartitionLayout, **options: object) -> None:
        super().__init__(**options)
        self.layout = layout

    async def send(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: Sequence[tuple[str, bytes]] | None = None,
    ) -> asyncio.Future[Any]:
        if not self.layout.loaded and self.layout.guards(topic):
            try:
                await self.layout.load(self.client)
            except (KafkaError, OSError) as exc:
                raise KafkaTimeoutError(f"cannot read {self.layout.topic}: {exc or type(exc).__name__}") from exc
        sent: asyncio.Future[Any] = await super().send(topic, value, key, partition, timestamp_ms, headers)
        return sent

    def _partition(self, topic, partition, key, value, serialized_key, serialized_value):  # type: ignore[no-untyped-def]  # aiokafka's own
        self.layout.check(topic, len(self._metadata.partitions_for_topic(topic) or ()))
        return super()._partition(topic, partition, key, value, serialized_key, serialized_value)
