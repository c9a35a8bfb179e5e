"""The partition-count check at every routing decision: the producer's partition choice and the log tail's
partition lookup, against the count the layout topic records, on the metadata in use at that moment (so
after every metadata refresh). tansu cannot add partitions to a topic (no CreatePartitions), so a count
that changes under a running process is tried here only; tests/integration/test_partition_layout.py runs
the rest on the broker."""

from __future__ import annotations

import random
import re

import pytest
from aiokafka.partitioner import DefaultPartitioner, murmur2
from aiokafka.protocol.api import RequestStruct, Response

from graphledger.errors import LogUnavailableError, PartitionCountChangedError
from graphledger.log.layout import (
    PartitionCheckedProducer,
    PartitionLayout,
    key_hash,
    key_partitioner,
    layout_record,
    parse_record,
)
from graphledger.log.tail import LogTail
from graphledger.settings import Settings
from kafka_wire import Cluster, Wire, record_batch

SETTINGS = Settings(topic_prefix="gl")
CHECKPOINTS, STORE, LAYOUT = SETTINGS.checkpoint_topic, SETTINGS.store_topic, SETTINGS.layout_topic
METADATA, FETCH = 3, 1


def recorded(**counts: int) -> PartitionLayout:
    layout = PartitionLayout(SETTINGS)
    layout.recorded = {f"gl.{topic}": n for topic, n in counts.items()}
    return layout


def test_a_count_other_than_the_recorded_one_stops() -> None:
    layout = recorded(checkpoints=12, store=6)
    layout.check(CHECKPOINTS, 12)
    layout.check(STORE, 6)
    layout.check(SETTINGS.dead_letter_topic, 99)  # not a source topic: any count
    with pytest.raises(PartitionCountChangedError) as stopped:
        layout.check(CHECKPOINTS, 16)
    assert (stopped.value.topic, stopped.value.recorded, stopped.value.found) == (CHECKPOINTS, 12, 16)
    assert not stopped.value.retryable
    assert isinstance(stopped.value, LogUnavailableError)  # a read that meets it fails, never answers


def test_without_a_record_the_first_count_seen_is_kept() -> None:
    layout = recorded()
    layout.check(CHECKPOINTS, 4)
    layout.check(CHECKPOINTS, 4)
    with pytest.raises(PartitionCountChangedError, match=re.escape("gl.layout records with 4")):
        layout.check(CHECKPOINTS, 5)


def test_layout_records_round_trip_and_strangers_are_skipped() -> None:
    assert parse_record(*layout_record(CHECKPOINTS, 12)) == (CHECKPOINTS, 12)
    assert layout_record(CHECKPOINTS, 12) == (b"gl.checkpoints", b'{"partitions":12}')
    for key, value in [(None, b'{"partitions":3}'), (b"t", None), (b"t", b"{"), (b"t", b'{"partitions":0}'),
                       (b"t", b'{"partitions":"3"}'), (b"t", b"[]")]:  # fmt: skip
        assert parse_record(key, value) is None


def producer(layout: PartitionLayout, metadata: Cluster) -> PartitionCheckedProducer:
    checked = PartitionCheckedProducer(layout, bootstrap_servers="kafka-1:9092")
    checked._metadata = metadata  # what aiokafka's `ClusterMetadata` answers, refreshed by the test
    return checked


async def test_the_producer_refuses_to_route_once_a_refresh_shows_another_count() -> None:
    metadata = Cluster({CHECKPOINTS: 12, STORE: 12, SETTINGS.dead_letter_topic: 1})
    checked = producer(recorded(checkpoints=12, store=12), metadata)
    key = b"thread-1"
    assert checked._partition(CHECKPOINTS, None, key, b"v", key, b"v") == (murmur2(key) & 0x7FFFFFFF) % 12
    assert checked._partition(CHECKPOINTS, 3, None, b"v", None, b"v") == 3  # a chosen partition too
    metadata.partitions[CHECKPOINTS] = 16  # someone ran kafka-topics.sh --alter; aiokafka refreshed
    with pytest.raises(PartitionCountChangedError, match=re.escape("Kafka reports 16 partitions for gl.checkpoints")):
        checked._partition(CHECKPOINTS, None, key, b"v", key, b"v")
    with pytest.raises(PartitionCountChangedError):
        checked._partition(CHECKPOINTS, 3, None, b"v", None, b"v")  # a runs.delete to every partition
    assert checked._partition(STORE, None, key, b"v", key, b"v") < 12
    assert checked._partition(SETTINGS.dead_letter_topic, 0, None, b"v", None, b"v") == 0


class LayoutTopic:
    """A cluster holding the layout topic, for the log tail's read of it."""

    def __init__(self, records: list[tuple[bytes, bytes]] | None, error_code: int = 3, unserved: int = 0) -> None:
        self.records = records
        self.error_code = error_code
        """What Metadata answers for the topic when there are no records: 3, it does not exist."""
        self.unserved = unserved
        """How many fetches the leader answers without the partition, as tansu does just after a start."""

    def metadata(self, node: int, request: RequestStruct) -> Response:
        [topic] = request.to_object()["topics"]
        assert request.to_object()["allow_auto_topic_creation"] is False
        if self.records is None:
            answer = (self.error_code, topic, False, [])
        else:
            answer = (0, topic, False, [(0, 0, 1, 5, [1], [1], [])])
        return request.RESPONSE_TYPE(0, [(1, "k1", 9092, None)], "c", 1, [answer])

    def fetch(self, node: int, request: RequestStruct) -> Response:
        [topic] = request.to_object()["topics"]
        [partition] = topic["partitions"]
        assert (topic["topic"], partition["current_leader_epoch"]) == (LAYOUT, 5)
        if self.unserved:
            self.unserved -= 1
            return request.RESPONSE_TYPE(0, 0, 0, [])
        records = self.records or []
        offset = partition["fetch_offset"]
        raw = record_batch(records[offset : offset + 2], offset) if offset < len(records) else b""  # two a fetch
        return request.RESPONSE_TYPE(0, 0, 0, [(LAYOUT, [(0, 0, len(records), len(records), 0, [], raw)])])

    def wire(self, counts: dict[str, int]) -> Wire:
        wire = Wire(cluster=Cluster(counts))
        wire.handlers = {METADATA: self.metadata, FETCH: self.fetch}
        return wire


async def test_the_log_tail_tells_no_partition_of_a_changed_topic() -> None:
    records = [layout_record(CHECKPOINTS, 8), layout_record(STORE, 4), (b"junk", b"x"), layout_record(CHECKPOINTS, 12)]
    wire = LayoutTopic(records).wire({CHECKPOINTS: 12, STORE: 4})
    log = LogTail(SETTINGS, wire)  # type: ignore[arg-type]
    assert await log.partition_count(CHECKPOINTS) == 12  # the last record of a topic wins
    assert await log.partition_of(STORE, b"k") == (murmur2(b"k") & 0x7FFFFFFF) % 4
    assert len(wire.of(FETCH)) == 2  # read once, a page at a time
    wire.cluster.partitions[STORE] = 5
    with pytest.raises(PartitionCountChangedError):
        await log.partition_of(STORE, b"k")
    assert len(wire.of(METADATA)) == 1


async def test_a_leader_not_serving_the_layout_yet_is_asked_again() -> None:
    topic = LayoutTopic([layout_record(CHECKPOINTS, 6), layout_record(STORE, 6)], unserved=3)
    wire = topic.wire({CHECKPOINTS: 6, STORE: 6})
    log = LogTail(SETTINGS, wire)  # type: ignore[arg-type]
    assert await log.partition_count(CHECKPOINTS) == 6
    assert (topic.unserved, len(wire.of(METADATA))) == (0, 4)  # each try asks who leads it now


async def test_without_a_layout_topic_the_log_tail_keeps_the_first_count(caplog: pytest.LogCaptureFixture) -> None:
    wire = LayoutTopic(None).wire({CHECKPOINTS: 3})
    log = LogTail(SETTINGS, wire)  # type: ignore[arg-type]
    assert await log.partition_count(CHECKPOINTS) == 3
    assert "gl.layout records no partition count for gl.checkpoints, gl.store" in caplog.text
    assert "graphledger topics ensure" in caplog.text
    wire.cluster.partitions[CHECKPOINTS] = 4
    with pytest.raises(PartitionCountChangedError):
        await log.partition_count(CHECKPOINTS)


async def test_a_user_without_read_on_the_layout_keeps_writing(caplog: pytest.LogCaptureFixture) -> None:
    """Agents' Kafka users granted before the layout topic existed: TOPIC_AUTHORIZATION_FAILED is no outage."""
    wire = LayoutTopic(None, error_code=29).wire({CHECKPOINTS: 3})
    log = LogTail(SETTINGS, wire)  # type: ignore[arg-type]
    assert await log.partition_count(CHECKPOINTS) == 3
    assert "may not read gl.layout: grant it READ and DESCRIBE" in caplog.text
    wire.cluster.partitions[CHECKPOINTS] = 4
    with pytest.raises(PartitionCountChangedError):
        await log.partition_count(CHECKPOINTS)


def test_the_cached_partitioner_routes_every_key_as_aiokafkas_default_does() -> None:
    rng = random.Random(20261128)
    for n in (1, 4, 12, 50):
        partitions = list(range(n))
        for size in (1, 7, 36, 64, 200):
            key = rng.randbytes(size)
            assert key_partitioner(key, partitions, partitions) == DefaultPartitioner()(key, partitions, partitions)
            assert key_partitioner(key, partitions, []) == key_hash(key) % n  # what the log tail computes
