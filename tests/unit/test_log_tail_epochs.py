"""The log-end fetch names each partition's leader epoch (KIP-320), so a deposed leader answers with an
error instead of its stale high watermark; every error path refreshes the leaders and asks again within
the read's deadline. tansu answers every epoch alike (its epochs stay 0 and it checks none), so the
elections, fenced and unknown epochs here run only against a cluster given as data (`kafka_wire.py`):
each node answers a fetch as a Kafka broker does with what it believes of the partition."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import KafkaConnectionError, TopicAuthorizationFailedError
from aiokafka.protocol.api import RequestStruct, Response

from graphledger.errors import LogUnavailableError
from graphledger.log.requests import (
    NO_EPOCH,
    EpochFetchRequest,
    FencedLeaderEpochError,
    FetchPosition,
    LeaderMetadataRequest,
    UnknownLeaderEpochError,
    error_for,
)
from graphledger.log.tail import LEADERS_MAX_AGE_S, LogTail
from graphledger.settings import Settings
from kafka_wire import Cluster, Wire

TOPIC = "gl.checkpoints"
P0, P1 = TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)
FETCH, LIST_OFFSETS, METADATA = 1, 2, 3
NONE, OFFSET_OUT_OF_RANGE, NOT_LEADER, TOPIC_AUTHORIZATION_FAILED = 0, 1, 6, 29
FENCED, UNKNOWN_EPOCH = 74, 75


@dataclass
class Replica:
    """What one node believes of a partition: its epoch, whether it leads, its high watermark."""

    epoch: int
    leads: bool
    high_watermark: int


@dataclass
class Partitions:
    """The cluster's truth as the controller publishes it (Metadata answers), and each node's belief."""

    published: dict[TopicPartition, tuple[int, int]] = field(default_factory=dict)
    """Per partition: (leader node, leader epoch) as Metadata answers it; node -1 in an election."""
    replicas: dict[tuple[int, TopicPartition], Replica] = field(default_factory=dict)
    answers: dict[int, list[int]] = field(default_factory=dict)
    """Error codes a node answers before anything else, in turn (a node catching up, refusing)."""

    def metadata(self, node: int, request: RequestStruct) -> Response:
        version = request.API_VERSION
        assert request.to_object()["allow_auto_topic_creation"] is False
        topics = []
        for topic in request.to_object()["topics"]:
            partitions = []
            for tp, (leader, epoch) in sorted(self.published.items(), key=lambda item: item[0].partition):
                if tp.topic == topic:
                    head = (0, tp.partition, leader, epoch) if version >= 7 else (0, tp.partition, leader)
                    partitions.append((*head, [1, 2], [1, 2], []))
            topics.append((0 if partitions else 3, topic, False, partitions))
        return request.RESPONSE_TYPE(0, [(1, "k1", 9092, None), (2, "k2", 9092, None)], "c", 1, topics)

    def answer(self, node: int, tp: TopicPartition, epoch: int) -> tuple[int, int]:
        """As a Kafka broker checks a consumer's fetch (Partition.localLogWithEpochOrException)."""
        if self.answers.get(node):
            return self.answers[node].pop(0), -1
        replica = self.replicas.get((node, tp))
        if replica is None:
            return NOT_LEADER, -1
        if epoch != NO_EPOCH and epoch < replica.epoch:
            return FENCED, -1
        if epoch != NO_EPOCH and epoch > replica.epoch:
            return UNKNOWN_EPOCH, -1
        if not replica.leads:
            return NOT_LEADER, -1
        return NONE, replica.high_watermark

    def fetch(self, node: int, request: RequestStruct) -> Response:
        version = request.API_VERSION
        topics = []
        for topic in request.to_object()["topics"]:
            partitions = []
            for p in topic["partitions"]:
                tp = TopicPartition(topic["topic"], p["partition"])
                code, hw = self.answer(node, tp, p.get("current_leader_epoch", NO_EPOCH))
                if version >= 5:
                    partitions.append((tp.partition, code, hw, hw, 0, [], b""))
                else:
                    partitions.append((tp.partition, code, hw, hw, [], b""))
            topics.append((topic["topic"], partitions))
        if version >= 7:
            return request.RESPONSE_TYPE(0, 0, 0, topics)
        return request.RESPONSE_TYPE(0, topics)

    def list_offsets(self, node: int, request: RequestStruct) -> Response:
        version = request.API_VERSION
        topics = []
        for topic in request.to_object()["topics"]:
            partitions = []
            for p in topic["partitions"]:
                tp = TopicPartition(topic["topic"], p["partition"])
                code, end = self.answer(node, tp, p.get("current_leader_epoch", NO_EPOCH))
                epoch = self.replicas[(node, tp)].epoch if (node, tp) in self.replicas else -1
                partitions.append(
                    (tp.partition, code, -1, end, epoch) if version >= 4 else (tp.partition, code, -1, end)
                )
            topics.append((topic["topic"], partitions))
        return request.RESPONSE_TYPE(0, topics) if version >= 2 else request.RESPONSE_TYPE(topics)

    def wire(self, versions: dict[int, tuple[int, int]] | None = None) -> Wire:
        wire = Wire(versions, Cluster({TOPIC: 2}, nodes=(1, 2)))
        wire.handlers = {METADATA: self.metadata, FETCH: self.fetch, LIST_OFFSETS: self.list_offsets}
        return wire


def led_by(node: int, epoch: int, high_watermark: int, *tps: TopicPartition) -> Partitions:
    partitions = Partitions()
    for tp in tps or (P0, P1):
        partitions.published[tp] = (node, epoch)
        partitions.replicas[(node, tp)] = Replica(epoch, True, high_watermark)
    return partitions


def tail(wire: Wire) -> LogTail:
    return LogTail(Settings(topic_prefix="gl"), wire)  # type: ignore[arg-type]


def fetches(wire: Wire) -> list[tuple[int, int, dict[int, int]]]:
    """(node, version, {partition: current_leader_epoch}) of each fetch sent."""
    out = []
    for sent in wire.of(FETCH):
        [topic] = sent.obj()["topics"]
        epochs = {p["partition"]: p.get("current_leader_epoch", NO_EPOCH) for p in topic["partitions"]}
        out.append((sent.node, sent.version, epochs))
    return out


async def test_the_fetch_names_the_leader_epoch_metadata_v7_gave() -> None:
    cluster = led_by(2, 7, 40)
    wire = cluster.wire()
    assert await tail(wire).ends({P0: 3, P1: 0}, 1) == {P0: 40, P1: 40}
    [metadata] = wire.of(METADATA)
    # The beacon's leader comes in the same request (test_log_tail_waits.py)
    assert (metadata.version, metadata.obj()) == (
        7,
        {"topics": [TOPIC, "gl.layout"], "allow_auto_topic_creation": False},
    )
    # One fetch for both partitions, to their leader, each naming epoch 7; v10 although the broker
    # speaks v17: from v11 a follower may answer with its own (lagging) high watermark.
    assert fetches(wire) == [(2, 10, {0: 7, 1: 7})]
    [sent] = wire.of(FETCH)
    positions = {p["partition"]: (p["fetch_offset"], p["max_bytes"]) for p in sent.obj()["topics"][0]["partitions"]}
    assert positions == {0: (3, 1), 1: (0, 1)}  # from the position, and only the end wanted
    assert (sent.obj()["replica_id"], sent.obj()["isolation_level"], sent.obj()["max_wait_time"]) == (-1, 0, 1)


@pytest.mark.parametrize(
    ("metadata", "fetch", "sent"),
    [
        ((0, 5), (4, 8), (5, 8)),  # a broker before Kafka 2.1: no epochs anywhere
        ((0, 12), (4, 8), (7, 8)),  # epochs known, but a fetch that cannot carry them
        ((0, 5), (4, 17), (5, 10)),  # the fetch carries -1: unfenced, as aiokafka sends it
        ((0, 5), (4, 4), (5, 4)),
    ],
)
async def test_older_brokers_get_the_versions_they_speak(metadata, fetch, sent) -> None:
    cluster = led_by(1, NO_EPOCH, 9)
    wire = cluster.wire({3: metadata, 1: fetch, 2: (1, 9)})
    assert await tail(wire).ends({P0: 1}, 1) == {P0: 9}
    assert wire.of(METADATA)[0].version == sent[0]
    [(node, version, epochs)] = fetches(wire)
    assert (node, version) == (1, sent[1])
    assert epochs == {0: NO_EPOCH}


async def test_a_fenced_epoch_asks_for_the_leader_again() -> None:
    # The log tail learned node 1 leads in epoch 7; then node 2 was elected (epoch 8), and node 1,
    # told so, follows in epoch 8: it fences the old epoch instead of answering its own end.
    cluster = led_by(1, 7, 10)
    wire = cluster.wire()
    log = tail(wire)
    assert await log.ends({P0: 1}, 1) == {P0: 10}
    cluster.published[P0] = (2, 8)
    cluster.replicas[(1, P0)] = Replica(8, False, 10)
    cluster.replicas[(2, P0)] = Replica(8, True, 12)
    assert await log.ends({P0: 1}, 1) == {P0: 12}
    assert fetches(wire) == [(1, 10, {0: 7}), (1, 10, {0: 7}), (2, 10, {0: 8})]
    assert len(wire.of(METADATA)) == 2


async def test_the_end_of_partitions_on_two_leaders_is_one_fetch_to_each_and_only_a_moved_one_is_asked_again() -> None:
    # P0 on node 1, P1 on node 2; then P0 moves to node 2 (epoch 8) and node 1, told so, fences epoch 7.
    cluster = led_by(1, 7, 10, P0)
    cluster.published[P1] = (2, 3)
    cluster.replicas[(2, P1)] = Replica(3, True, 20)
    wire = cluster.wire()
    log = tail(wire)
    assert await log.ends({P0: 1, P1: 1}, 1) == {P0: 10, P1: 20}
    assert sorted(fetches(wire)) == [(1, 10, {0: 7}), (2, 10, {1: 3})]
    cluster.published[P0] = (2, 8)
    cluster.replicas[(1, P0)] = Replica(8, False, 10)
    cluster.replicas[(2, P0)] = Replica(8, True, 12)
    assert await log.ends({P0: 1, P1: 1}, 1) == {P0: 12, P1: 20}
    # Both leaders asked at once; then, after the Metadata answer, only P0, of its new leader.
    assert sorted(fetches(wire)[2:4]) == [(1, 10, {0: 7}), (2, 10, {1: 3})]
    assert fetches(wire)[4:] == [(2, 10, {0: 8})]
    assert len(wire.of(METADATA)) == 2


async def test_an_epoch_the_leader_does_not_know_yet_is_asked_again_until_it_does() -> None:
    # Metadata names node 2 in epoch 8 before node 2 has taken over: it answers UNKNOWN_LEADER_EPOCH.
    cluster = led_by(2, 8, 12)
    cluster.answers[2] = [UNKNOWN_EPOCH, UNKNOWN_EPOCH]
    wire = cluster.wire()
    assert await tail(wire).ends({P0: 1}, 1) == {P0: 12}
    assert fetches(wire) == [(2, 10, {0: 8})] * 3


async def test_a_moved_leader_is_followed() -> None:
    cluster = led_by(1, 3, 5)
    cluster.replicas[(1, P0)] = Replica(3, False, 5)  # it moved away before the first fetch
    cluster.answers[1] = []
    wire = cluster.wire()

    def elect(node: int, request: RequestStruct) -> Response:
        cluster.published[P0] = (2, 4)
        cluster.replicas[(2, P0)] = Replica(4, True, 6)
        return cluster.fetch(node, request)

    wire.handlers[FETCH] = lambda node, request: (elect if node == 1 else cluster.fetch)(node, request)
    assert await tail(wire).ends({P0: 1}, 1) == {P0: 6}
    assert [node for node, _, _ in fetches(wire)] == [1, 2]


async def test_a_partition_in_an_election_is_asked_about_until_it_has_a_leader() -> None:
    cluster = led_by(-1, 7, 0)
    wire = cluster.wire()
    answers = iter([cluster.metadata, cluster.metadata])

    def metadata(node: int, request: RequestStruct) -> Response:
        answer = next(answers, None)
        if answer is None:  # the third time, the election is over
            cluster.published[P0] = (2, 8)
            cluster.replicas[(2, P0)] = Replica(8, True, 30)
            answer = cluster.metadata
        return answer(node, request)

    wire.handlers[METADATA] = metadata
    assert await tail(wire).ends({P0: 1}, 1) == {P0: 30}
    assert len(wire.of(METADATA)) == 3


async def test_errors_that_do_not_pass_fail_the_read_with_their_cause() -> None:
    cluster = led_by(1, 7, 10)
    cluster.answers[1] = [TOPIC_AUTHORIZATION_FAILED]
    with pytest.raises(LogUnavailableError) as failed:
        await tail(cluster.wire()).tails({P0: 1}, 1)
    assert isinstance(failed.value.__cause__, TopicAuthorizationFailedError)  # the client falls back on it


async def test_epoch_errors_past_the_deadline_fail_the_read_retryably() -> None:
    cluster = led_by(1, 7, 10)
    cluster.answers[1] = [FENCED] * 1000  # a leader that never catches up
    with pytest.raises(LogUnavailableError, match=re.escape("within 0.2s; retry")) as failed:
        await tail(cluster.wire()).ends({P0: 1}, 0.2)
    assert failed.value.retryable


async def test_an_unknown_topic_fails_at_once() -> None:
    wire = Partitions().wire()
    with pytest.raises(LogUnavailableError, match=re.escape("Kafka did not describe topic gl.checkpoints")):
        await tail(wire).ends({P0: 1}, 1)
    assert len(wire.of(METADATA)) == 1


async def test_list_offsets_names_the_epoch_too() -> None:
    # The projection is past the log's end (a broker lost records): the end comes from ListOffsets v4.
    cluster = led_by(1, 7, 4)
    wire = cluster.wire()
    fetch = wire.handlers[FETCH]

    def out_of_range(node: int, request: RequestStruct) -> Response:
        cluster.answers[node] = [OFFSET_OUT_OF_RANGE]
        return fetch(node, request)

    wire.handlers[FETCH] = out_of_range
    cluster.answers[1] = []
    list_offsets = wire.handlers[LIST_OFFSETS]
    fenced_once = iter([FENCED])

    def fenced_then_answer(node: int, request: RequestStruct) -> Response:
        code = next(fenced_once, None)
        if code is not None:
            cluster.answers[node] = [code]
        return list_offsets(node, request)

    wire.handlers[LIST_OFFSETS] = fenced_then_answer
    assert await tail(wire).ends({P0: 9}, 1) == {P0: 4}
    sent = wire.of(LIST_OFFSETS)
    assert [s.version for s in sent] == [4, 4]
    [partition] = sent[-1].obj()["topics"][0]["partitions"]
    assert partition == {"partition": 0, "current_leader_epoch": 7, "timestamp": -1}


async def test_reads_asking_at_once_share_one_metadata_request() -> None:
    cluster = led_by(1, 7, 10)
    wire = cluster.wire()
    log = tail(wire)
    await asyncio.gather(*(log.ends({tp: 1}, 1) for tp in (P0, P1, P0, P1)))
    assert len(wire.of(METADATA)) == 1


async def test_the_remaining_window_a_deposed_leader_not_yet_told() -> None:
    """What epochs cannot close: the log tail still names node 1 in epoch 7 (its last Metadata answer
    predates the election) and node 1 has not been told it lost the partition: it answers its own end,
    which misses what node 2 acknowledged since. The log tail asks for the leaders again once its answer
    is older than LEADERS_MAX_AGE_S, which bounds the window (docs/architecture.md states it)."""
    cluster = led_by(1, 7, 10)
    wire = cluster.wire()
    log = tail(wire)
    now = [100.0]
    log._clock = lambda: now[0]
    assert await log.ends({P0: 1}, 1) == {P0: 10}
    cluster.published[P0] = (2, 8)
    cluster.replicas[(2, P0)] = Replica(8, True, 12)
    now[0] += LEADERS_MAX_AGE_S
    assert await log.ends({P0: 1}, 1) == {P0: 10}  # stale: inside the window
    now[0] += 0.001
    assert await log.ends({P0: 1}, 1) == {P0: 12}  # the leaders asked again, before this fetch
    assert len(wire.of(METADATA)) == 2


def test_epoch_errors_are_retriable_and_known_by_code() -> None:
    assert error_for(74) is FencedLeaderEpochError and error_for(75) is UnknownLeaderEpochError
    assert FencedLeaderEpochError.retriable and UnknownLeaderEpochError.retriable
    assert error_for(6).retriable


def test_requests_encode_as_the_protocol_says() -> None:
    """Byte for byte: Metadata v7 is v5's request (topics, allow_auto_topic_creation); Fetch v10 puts
    current_leader_epoch between the partition and its fetch offset."""
    metadata = LeaderMetadataRequest(["t"]).prepare({3: (0, 12)})
    assert metadata.API_VERSION == 7
    assert metadata.encode() == b"\x00\x00\x00\x01" + b"\x00\x01t" + b"\x00"
    fetch = EpochFetchRequest(100, 0, 5, 0, {TopicPartition("t", 3): FetchPosition(41, 5, 9)}).prepare({1: (0, 17)})
    assert fetch.API_VERSION == 10
    assert fetch.encode() == (
        b"\xff\xff\xff\xff"  # replica_id -1: a consumer
        b"\x00\x00\x00\x64\x00\x00\x00\x00\x00\x00\x00\x05"  # max_wait_ms, min_bytes, max_bytes
        b"\x00"  # read uncommitted
        b"\x00\x00\x00\x00\xff\xff\xff\xff"  # no fetch session, final epoch
        b"\x00\x00\x00\x01\x00\x01t"  # one topic
        b"\x00\x00\x00\x01\x00\x00\x00\x03"  # one partition: 3
        b"\x00\x00\x00\x09"  # current_leader_epoch 9
        b"\x00\x00\x00\x00\x00\x00\x00\x29"  # fetch_offset 41
        b"\xff\xff\xff\xff\xff\xff\xff\xff"  # log_start_offset -1
        b"\x00\x00\x00\x05"  # partition_max_bytes
        b"\x00\x00\x00\x00"  # no forgotten topics
    )


async def test_a_topic_the_user_may_not_describe_fails_with_that_cause() -> None:
    cluster = led_by(1, 7, 10)
    wire = cluster.wire()

    def denied(node: int, request: RequestStruct) -> Response:
        return request.RESPONSE_TYPE(
            0, [(1, "k1", 9092, None)], "c", 1, [(TOPIC_AUTHORIZATION_FAILED, TOPIC, False, [])]
        )

    wire.handlers[METADATA] = denied
    with pytest.raises(LogUnavailableError) as failed:
        await tail(wire).tails({P0: 1}, 1)
    assert isinstance(failed.value.__cause__, TopicAuthorizationFailedError)  # the client reads via the API then


async def test_a_topic_without_leaders_yet_is_asked_about_again() -> None:
    cluster = led_by(1, 7, 10)
    wire = cluster.wire()
    metadata = wire.handlers[METADATA]
    answers = iter([5, 5])  # LEADER_NOT_AVAILABLE for the topic, twice

    def electing(node: int, request: RequestStruct) -> Response:
        code = next(answers, None)
        if code is None:
            return metadata(node, request)
        return request.RESPONSE_TYPE(0, [(1, "k1", 9092, None)], "c", 1, [(code, TOPIC, False, [])])

    wire.handlers[METADATA] = electing
    assert await tail(wire).ends({P0: 1}, 1) == {P0: 10}
    assert len(wire.of(METADATA)) == 3


async def test_a_failed_refresh_of_old_leaders_keeps_the_known_one() -> None:
    cluster = led_by(1, 7, 10)
    wire = cluster.wire()
    log = tail(wire)
    now = [0.0]
    log._clock = lambda: now[0]
    assert await log.ends({P0: 1}, 1) == {P0: 10}
    now[0] += LEADERS_MAX_AGE_S + 1

    def away(node: int, request: RequestStruct) -> Response:
        raise KafkaConnectionError("the broker asked went away")

    wire.handlers[METADATA] = away
    assert await log.ends({P0: 1}, 1) == {P0: 10}  # the fetch to the known leader tells whether it still leads
    assert len(wire.of(FETCH)) == 2
