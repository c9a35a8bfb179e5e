"""The Kafka requests graphledger builds itself, with aiokafka's protocol types: the ones carrying leader epochs.

A deposed partition leader (cut off from the cluster, not yet told) keeps answering fetches with its own
high watermark, which misses every write the new leader acknowledged since. KIP-320 fences it: a fetch
that names the partition's current leader epoch is answered FENCED_LEADER_EPOCH by a replica whose epoch
is newer and UNKNOWN_LEADER_EPOCH by one whose epoch is older, never with a stale end. The epoch comes
from Metadata v7 and later. aiokafka (0.14) negotiates each request's version per connection from the
broker's ApiVersions answer (`Request.prepare`), but its Metadata requests stop at v5 (no epochs), its
Fetch builder sends `current_leader_epoch = -1`, and its ListOffsets stops at v3. So, as aiokafka's own
requests are declared:

- `LeaderMetadataRequest`: Metadata v7 (each partition's leader and leader epoch), or aiokafka's v1-v5
  where the broker answers no v7 (then every epoch is `NO_EPOCH`, and fetches go unfenced, as before).
- `EpochFetchRequest`: Fetch v9-v10 with each partition's `current_leader_epoch`, or v4-v8 without on an
  older broker. Never v11 and later: from v11 (KIP-392) a broker serves a consumer's fetch as a follower
  too, with the follower's high watermark, which lags the leader's; v9-v10 are answered by the leader only.
- `EpochListOffsetsRequest`: ListOffsets v4 with `current_leader_epoch` (aiokafka declares v4 with a
  64-bit epoch, which no broker reads), or v1-v3.
- `error_for`: aiokafka's error classes, plus FENCED_LEADER_EPOCH and UNKNOWN_LEADER_EPOCH, which aiokafka
  does not know (it answers them UnknownError, not retriable).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TypeAlias

from aiokafka import TopicPartition
from aiokafka.errors import BrokerResponseError, for_code
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.fetch import (
    FetchRequest_v4,
    FetchRequest_v5,
    FetchRequest_v6,
    FetchRequest_v7,
    FetchRequest_v8,
    FetchRequest_v9,
    FetchRequest_v10,
)
from aiokafka.protocol.metadata import (
    MetadataRequest_v1,
    MetadataRequest_v2,
    MetadataRequest_v3,
    MetadataRequest_v4,
    MetadataRequest_v5,
)
from aiokafka.protocol.offset import OffsetRequest_v1, OffsetRequest_v2, OffsetRequest_v3, OffsetResponse_v4
from aiokafka.protocol.types import Array, Boolean, Int8, Int16, Int32, Int64, Schema, String

NO_EPOCH = -1
"""A partition's leader epoch when the broker does not tell it: the request then goes unfenced."""
METADATA, FETCH, LIST_OFFSETS = 3, 1, 2
"""API keys."""
EPOCH_METADATA_VERSION = 7
EPOCH_FETCH_VERSION = 9
EPOCH_LIST_OFFSETS_VERSION = 4
CONSUMER = -1
"""`replica_id` of a request that is not a follower's."""
NO_SESSION, FINAL_EPOCH = 0, -1
"""A fetch outside any incremental fetch session (KIP-227)."""


class FencedLeaderEpochError(BrokerResponseError):
    errno = 74
    message = "FENCED_LEADER_EPOCH"
    description = "The leader epoch in the request is older than the epoch on the broker."
    retriable = True
    invalid_metadata = True


class UnknownLeaderEpochError(BrokerResponseError):
    errno = 75
    message = "UNKNOWN_LEADER_EPOCH"
    description = "The leader epoch in the request is newer than the epoch on the broker."
    retriable = True
    invalid_metadata = True


_EPOCH_ERRORS: dict[int, type[BrokerResponseError]] = {
    FencedLeaderEpochError.errno: FencedLeaderEpochError,
    UnknownLeaderEpochError.errno: UnknownLeaderEpochError,
}


def error_for(code: int) -> type[BrokerResponseError]:
    """The error class of a Kafka error code, the two leader-epoch errors included."""
    return _EPOCH_ERRORS.get(code) or for_code(code)


# -- Metadata v7 ----------------------------------------------------------------------------------------


# Struct names follow aiokafka's (`MetadataResponse_v5`).


class MetadataResponse_v7(Response):
    """KIP-320: each partition's `leader_epoch`."""

    API_KEY = 3
    API_VERSION = 7
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("brokers", Array(("node_id", Int32), ("host", String("utf-8")), ("port", Int32), ("rack", String("utf-8")))),
        ("cluster_id", String("utf-8")),
        ("controller_id", Int32),
        (
            "topics",
            Array(
                ("error_code", Int16),
                ("topic", String("utf-8")),
                ("is_internal", Boolean),
                (
                    "partitions",
                    Array(
                        ("error_code", Int16),
                        ("partition", Int32),
                        ("leader", Int32),
                        ("leader_epoch", Int32),
                        ("replicas", Array(Int32)),
                        ("isr", Array(Int32)),
                        ("offline_replicas", Array(Int32)),
                    ),
                ),
            ),
        ),
    )


class MetadataRequest_v7(RequestStruct):
    API_KEY = 3
    API_VERSION = 7
    RESPONSE_TYPE = MetadataResponse_v7
    SCHEMA = MetadataRequest_v5.SCHEMA


_MetadataStruct: TypeAlias = (
    MetadataRequest_v1
    | MetadataRequest_v2
    | MetadataRequest_v3
    | MetadataRequest_v4
    | MetadataRequest_v5
    | MetadataRequest_v7
)


class LeaderMetadataRequest(Request[_MetadataStruct]):
    """Metadata of `topics` (never all topics), never creating one that is missing."""

    API_KEY = METADATA

    def __init__(self, topics: list[str]) -> None:
        self.topics = topics

    def build(self, request_struct_class: type[_MetadataStruct]) -> _MetadataStruct:
        if request_struct_class.API_VERSION >= 4:
            return request_struct_class(self.topics, False)
        return request_struct_class(self.topics)


@dataclass(frozen=True, slots=True)
class Leader:
    """Who leads a partition, in which epoch (`NO_EPOCH` when the broker does not tell)."""

    node: int
    epoch: int


@dataclass(frozen=True, slots=True)
class TopicMetadata:
    error_code: int
    partitions: int
    """How many partitions the topic has (0 when it is unknown)."""


def read_metadata(response: Response) -> tuple[dict[str, TopicMetadata], dict[TopicPartition, Leader]]:
    """Each topic's error and partition count, and each partition's leader with its epoch (the leader is
    -1 while there is none, as during an election)."""
    with_epochs = response.API_VERSION >= EPOCH_METADATA_VERSION
    topics: dict[str, TopicMetadata] = {}
    leaders: dict[TopicPartition, Leader] = {}
    for topic_error, topic, _internal, partitions in response.topics:
        topics[topic] = TopicMetadata(topic_error, len(partitions))
        for partition in partitions:
            _error, index, node = partition[:3]
            leaders[TopicPartition(topic, index)] = Leader(node, partition[3] if with_epochs else NO_EPOCH)
    return topics, leaders


# -- Fetch v4-v10 ---------------------------------------------------------------------------------------


_FetchStruct: TypeAlias = (
    FetchRequest_v4
    | FetchRequest_v5
    | FetchRequest_v6
    | FetchRequest_v7
    | FetchRequest_v8
    | FetchRequest_v9
    | FetchRequest_v10
)


@dataclass(frozen=True, slots=True)
class FetchPosition:
    offset: int
    max_bytes: int
    leader_epoch: int = NO_EPOCH


class EpochFetchRequest(Request[_FetchStruct]):
    """A consumer's fetch of `positions`, naming each partition's leader epoch where the broker reads it."""

    API_KEY = FETCH

    def __init__(
        self, max_wait_ms: int, min_bytes: int, max_bytes: int, isolation_level: int,
        positions: Mapping[TopicPartition, FetchPosition],
    ) -> None:  # fmt: skip
        self.max_wait_ms = max_wait_ms
        self.min_bytes = min_bytes
        self.max_bytes = max_bytes
        self.isolation_level = isolation_level
        self.positions = positions

    def build(self, request_struct_class: type[_FetchStruct]) -> _FetchStruct:
        version = request_struct_class.API_VERSION
        by_topic: dict[str, list[tuple[int, ...]]] = {}
        for tp, at in self.positions.items():
            if version >= EPOCH_FETCH_VERSION:
                entry: tuple[int, ...] = (tp.partition, at.leader_epoch, at.offset, -1, at.max_bytes)
            elif version >= 5:
                entry = (tp.partition, at.offset, -1, at.max_bytes)  # -1: log_start_offset, a follower's
            else:
                entry = (tp.partition, at.offset, at.max_bytes)
            by_topic.setdefault(tp.topic, []).append(entry)
        head: list[object] = [CONSUMER, self.max_wait_ms, self.min_bytes, self.max_bytes, self.isolation_level]
        if version >= 7:
            return request_struct_class(*head, NO_SESSION, FINAL_EPOCH, list(by_topic.items()), [])
        return request_struct_class(*head, list(by_topic.items()))


def fetched_partitions(response: Response) -> Iterator[tuple[TopicPartition, int, int, bytes | None]]:
    """`(partition, error code, high watermark, records)` of each partition in a fetch's answer (a
    request-level error, v7 and later, is every partition's)."""
    request_error = response.error_code if response.API_VERSION >= 7 else 0
    for topic, partitions in response.topics:
        for partition, error_code, high_watermark, *rest in partitions:
            yield TopicPartition(topic, partition), error_code or request_error, high_watermark, rest[-1]


# -- ListOffsets v4 -------------------------------------------------------------------------------------


class ListOffsetsRequest_v4(RequestStruct):
    """KIP-320: `current_leader_epoch` per partition (a 32-bit field)."""

    API_KEY = 2
    API_VERSION = 4
    RESPONSE_TYPE = OffsetResponse_v4
    SCHEMA = Schema(
        ("replica_id", Int32),
        ("isolation_level", Int8),
        (
            "topics",
            Array(
                ("topic", String("utf-8")),
                ("partitions", Array(("partition", Int32), ("current_leader_epoch", Int32), ("timestamp", Int64))),
            ),
        ),
    )


_ListOffsetsStruct: TypeAlias = OffsetRequest_v1 | OffsetRequest_v2 | OffsetRequest_v3 | ListOffsetsRequest_v4


class EpochListOffsetsRequest(Request[_ListOffsetsStruct]):
    """The offset at `timestamp` (-1: the end) of one partition, naming its leader epoch where read."""

    API_KEY = LIST_OFFSETS

    def __init__(self, tp: TopicPartition, timestamp: int, leader_epoch: int, isolation_level: int) -> None:
        self.tp = tp
        self.timestamp = timestamp
        self.leader_epoch = leader_epoch
        self.isolation_level = isolation_level

    def build(self, request_struct_class: type[_ListOffsetsStruct]) -> _ListOffsetsStruct:
        version = request_struct_class.API_VERSION
        partition: tuple[int, ...] = (
            (self.tp.partition, self.leader_epoch, self.timestamp)
            if version >= EPOCH_LIST_OFFSETS_VERSION
            else (self.tp.partition, self.timestamp)
        )
        topics = [(self.tp.topic, [partition])]
        if version >= 2:
            return request_struct_class(CONSUMER, self.isolation_level, topics)
        if self.isolation_level:
            raise ValueError("ListOffsets v1 reads uncommitted only")
        return request_struct_class(CONSUMER, topics)


def listed_offset(response: Response, tp: TopicPartition) -> tuple[int, int | None]:
    """The error code and offset ListOffsets answered for `tp` (`UNKNOWN_TOPIC_OR_PARTITION` when left out)."""
    for topic, partitions in response.topics:
        for partition, error_code, *rest in partitions:
            if topic == tp.topic and partition == tp.partition:
                return error_code, None if error_code else rest[1]  # rest: timestamp, offset[, leader epoch]
    return 3, None
