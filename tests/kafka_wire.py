"""A Kafka cluster as data, for unit tests of code that builds requests and reads answers.

`Wire` stands in for aiokafka's `AIOKafkaClient` where a test hands one over (an admin client's, a
`LogTail`'s): every request is negotiated against the API versions the test gives (as a connection does
with the broker's ApiVersions answer), encoded and decoded again, recorded as sent, and answered by the
test's handler for its API key with a response struct of the negotiated version. So a test checks
what goes on the wire, and answers with what a real broker would, including the answers tansu never
gives (DescribeConfigs of a real cluster, leader epochs, FENCED_LEADER_EPOCH).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.record.default_records import DefaultRecordBatchBuilder

KAFKA_3_VERSIONS: dict[int, tuple[int, int]] = {
    0: (3, 11),  # Produce
    1: (4, 17),  # Fetch
    2: (1, 9),  # ListOffsets
    3: (0, 12),  # Metadata
    19: (0, 7),  # CreateTopics
    32: (0, 4),  # DescribeConfigs
}
"""What a Kafka 3.9 broker's ApiVersions answer says of the APIs graphledger uses."""

Handler = Callable[[int, RequestStruct], Response]


@dataclass
class Node:
    nodeId: int
    host: str = "127.0.0.1"
    port: int = 9092


@dataclass
class Cluster:
    """The part of aiokafka's `ClusterMetadata` the code under test reads."""

    partitions: dict[str, int] = field(default_factory=dict)
    leaders: dict[tuple[str, int], int] = field(default_factory=dict)
    nodes: tuple[int, ...] = (1,)

    @property
    def controller(self) -> Node:
        return Node(self.nodes[0])

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        count = self.partitions.get(topic)
        return None if count is None else set(range(count))

    def available_partitions_for_topic(self, topic: str) -> set[int] | None:
        return self.partitions_for_topic(topic)

    def leader_for_partition(self, tp: Any) -> int | None:
        return self.leaders.get((tp.topic, tp.partition), self.nodes[0] if tp.topic in self.partitions else None)

    def broker_metadata(self, node_id: int) -> Node | None:
        return Node(node_id) if node_id in self.nodes else None

    def brokers(self) -> set[Node]:
        return {Node(n) for n in self.nodes}  # type: ignore[misc]


@dataclass
class Sent:
    node: int
    struct: RequestStruct

    @property
    def api_key(self) -> int:
        return self.struct.API_KEY

    @property
    def version(self) -> int:
        return self.struct.API_VERSION

    def obj(self) -> dict[str, Any]:
        return self.struct.to_object()


class Wire:
    """Answers each request with its API key's handler; records what was sent."""

    def __init__(self, versions: dict[int, tuple[int, int]] | None = None, cluster: Cluster | None = None) -> None:
        self.versions = dict(KAFKA_3_VERSIONS if versions is None else versions)
        self.cluster = cluster or Cluster()
        self.handlers: dict[int, Handler] = {}
        self.sent: list[Sent] = []
        self.metadata_updates = 0
        self._request_timeout_ms = 1000
        self._retry_backoff = 0.001

    async def bootstrap(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def ready(self, node_id: int) -> bool:
        return True

    def get_random_node(self) -> int:
        return self.cluster.nodes[0]

    async def force_metadata_update(self) -> bool:
        self.metadata_updates += 1
        return True

    async def _wait_on_metadata(self, topic: str) -> set[int]:
        found = self.cluster.partitions_for_topic(topic)
        if found is None:
            raise AssertionError(f"no topic {topic} in the test's cluster")
        return found

    async def send(self, node_id: int, request: Request[Any]) -> Response:
        struct = request.prepare(self.versions)
        # What a broker would read: the request as encoded, decoded by the struct of its version.
        struct = type(struct).decode(struct.encode())
        self.sent.append(Sent(node_id, struct))
        handler = self.handlers.get(struct.API_KEY)
        if handler is None:
            raise AssertionError(f"the test gave no answer for API {struct.API_KEY} v{struct.API_VERSION}")
        response = handler(node_id, struct)
        # And what the client reads: the answer as encoded.
        return type(response).decode(response.encode())

    def of(self, api_key: int) -> list[Sent]:
        return [s for s in self.sent if s.api_key == api_key]


def record_batch(records: Sequence[tuple[bytes | None, bytes | None]], base_offset: int = 0) -> bytes:
    """One record batch (message format v2) holding `(key, value)` records from `base_offset` on."""
    builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, 0, 1 << 20)
    for delta, (key, value) in enumerate(records):
        builder.append(delta, 0, key, value, [])
    batch = bytearray(builder.build())
    batch[:8] = struct.pack(">q", base_offset)  # the broker sets it on append
    return bytes(batch)
