"""`topics ensure` against a cluster given as data (`kafka_wire.py`): the CreateTopics and DescribeConfigs
requests it sends, and what it decides on the answers a real Kafka cluster gives. tansu describes only
the configs a topic was created with and keeps one replica whatever it is asked for, so the answers of
a cluster with replicas and broker defaults are tried here only."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.protocol.api import RequestStruct, Response

from graphledger.errors import PartitionCountChangedError, SingleBrokerAcksError, TopicConfigError
from graphledger.settings import Settings
from graphledger_server.log import durability, layout, topics
from graphledger_server.log.durability import Durability
from kafka_wire import Wire, record_batch

CREATE_TOPICS, DESCRIBE_CONFIGS, METADATA, FETCH = 19, 32, 3, 1
TOPIC_RESOURCE = 2
INVALID_REPLICATION_FACTOR = 38


@dataclass
class Topic:
    partitions: int
    replicas: int
    configs: dict[str, str] = field(default_factory=dict)


@dataclass
class Cluster:
    """Topics as a Kafka cluster holds them, answering the admin client's requests."""

    topics: dict[str, Topic] = field(default_factory=dict)
    describes_configs: bool = True
    broker_defaults: dict[str, str] = field(default_factory=lambda: {"min.insync.replicas": "1"})
    refuse_creation: str | None = None
    layout: list[tuple[bytes, bytes]] = field(default_factory=list)
    """The records of the layout topic, in offset order."""

    def wire(self) -> Wire:
        wire = Wire()
        wire.handlers = {
            METADATA: self.metadata,
            CREATE_TOPICS: self.create,
            DESCRIBE_CONFIGS: self.describe,
            FETCH: self.fetch,
        }
        return wire

    def fetch(self, node: int, request: RequestStruct) -> Response:
        [topic] = request.to_object()["topics"]
        [partition] = topic["partitions"]
        assert topic["topic"] == "gl.layout" and partition["partition"] == 0
        offset = partition["fetch_offset"]
        records = record_batch(self.layout[offset:], offset) if offset < len(self.layout) else b""
        end = len(self.layout)
        return request.RESPONSE_TYPE(0, 0, 0, [("gl.layout", [(0, 0, end, end, 0, [], records)])])

    def recorded(self) -> dict[str, int]:
        return {key.decode(): json.loads(value)["partitions"] for key, value in self.layout}

    def metadata(self, node: int, request: RequestStruct) -> Response:
        names = request.to_object()["topics"]
        wanted = list(self.topics) if names is None else names
        answers = []
        for name in wanted:
            topic = self.topics.get(name)
            if topic is None:
                answers.append((3, name, False, []))
                continue
            replicas = list(range(1, topic.replicas + 1))
            epoch = (0,) if request.API_VERSION >= 7 else ()  # the layout read asks v7: leader epochs
            partitions = [(0, p, 1, *epoch, replicas, replicas, []) for p in range(topic.partitions)]
            answers.append((0, name, False, partitions))
        return request.RESPONSE_TYPE(0, [(1, "kafka-1", 9092, None)], "cluster", 1, answers)

    def create(self, node: int, request: RequestStruct) -> Response:
        errors = []
        for topic in request.to_object()["create_topic_requests"]:
            name, partitions, replicas, configs = (
                topic["topic"],
                topic["num_partitions"],
                topic["replication_factor"],
                topic["configs"],
            )
            if self.refuse_creation is not None:
                errors.append((name, INVALID_REPLICATION_FACTOR, self.refuse_creation))
            elif name in self.topics:
                errors.append((name, 36, "Topic already exists."))
            else:
                self.topics[name] = Topic(partitions, replicas, {c["config_key"]: c["config_value"] for c in configs})
                errors.append((name, 0, None))
        return request.RESPONSE_TYPE(0, errors)

    def describe(self, node: int, request: RequestStruct) -> Response:
        resources = []
        for resource in request.to_object()["resources"]:
            name = resource["resource_name"]
            if not self.describes_configs:
                resources.append((41, "Cluster authorization failed.", TOPIC_RESOURCE, name, []))
                continue
            configs = {**self.broker_defaults, **self.topics[name].configs}
            entries = [(key, value, False, 5, False, []) for key, value in sorted(configs.items())]
            resources.append((0, None, TOPIC_RESOURCE, name, entries))
        return request.RESPONSE_TYPE(0, resources)


class LayoutProducer:
    """Stands in for the producer `topics ensure` records partition counts with."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def send(self, topic: str, value: bytes, *, key: bytes, partition: int) -> asyncio.Future[None]:
        assert (topic, partition) == ("gl.layout", 0)
        self.cluster.layout.append((key, value))
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> Cluster:
    cluster = Cluster()
    monkeypatch.setattr(layout, "new_producer", lambda settings: LayoutProducer(cluster))

    def new_admin(settings: Settings) -> AIOKafkaAdminClient:
        admin = AIOKafkaAdminClient(bootstrap_servers="kafka-1:9092")
        admin._client = cluster.wire()  # type: ignore[assignment]
        cluster.last_wire = admin._client  # type: ignore[attr-defined]
        return admin

    monkeypatch.setattr(topics, "new_admin", new_admin)
    return cluster


def settings(**values: Any) -> Settings:
    return Settings(topic_prefix="gl", **values)


def sent(cluster: Cluster, api_key: int) -> list[dict[str, Any]]:
    return [s.obj() for s in cluster.last_wire.of(api_key)]  # type: ignore[attr-defined]


async def test_created_source_topics_ask_for_two_in_sync_replicas(cluster: Cluster) -> None:
    reports = await topics.ensure_topics(settings(topic_replication_factor=3))

    [create_checkpoints, create_store, create_dead_letters, _] = [
        request["create_topic_requests"][0] for request in sent(cluster, CREATE_TOPICS)
    ]
    for request in (create_checkpoints, create_store):
        assert (request["num_partitions"], request["replication_factor"]) == (12, 3)
        configs = {c["config_key"]: c["config_value"] for c in request["configs"]}
        assert configs == {
            "retention.ms": "-1",
            "retention.bytes": "-1",
            "min.insync.replicas": "2",
            "message.timestamp.type": "LogAppendTime",
        }
    assert create_dead_letters["topic"] == "gl.dead-letters" and create_dead_letters["configs"] == []
    described = [r["resource_name"] for request in sent(cluster, DESCRIBE_CONFIGS) for r in request["resources"]]
    assert described == ["gl.checkpoints", "gl.store", "gl.dead-letters"]
    create_layout = sent(cluster, CREATE_TOPICS)[3]["create_topic_requests"][0]
    assert (create_layout["topic"], create_layout["num_partitions"], create_layout["replication_factor"]) == (
        "gl.layout",
        1,
        3,
    )
    configs = {c["config_key"]: c["config_value"] for c in create_layout["configs"]}
    assert configs == {"cleanup.policy": "compact", "min.insync.replicas": "2"}
    assert all(r["resource_type"] == TOPIC_RESOURCE for q in sent(cluster, DESCRIBE_CONFIGS) for r in q["resources"])
    by_name = {r.name: r for r in reports}
    assert (by_name["gl.checkpoints"].replication_factor, by_name["gl.checkpoints"].min_insync_replicas) == (3, 2)
    assert by_name["gl.dead-letters"].min_insync_replicas == 1  # the broker's default: it may expire anyway


async def test_the_setting_and_the_replication_factor_decide_min_insync_replicas(cluster: Cluster) -> None:
    await topics.ensure_topics(settings(topic_replication_factor=5, topic_min_insync_replicas=3))
    [checkpoints] = sent(cluster, CREATE_TOPICS)[0]["create_topic_requests"]
    configs = {c["config_key"]: c["config_value"] for c in checkpoints["configs"]}
    assert configs["min.insync.replicas"] == "3"
    assert settings(topic_replication_factor=2).min_insync_replicas == 2
    assert settings(topic_replication_factor=1).min_insync_replicas == 1
    with pytest.raises(ValueError, match=re.escape("topic_min_insync_replicas 4 exceeds topic_replication_factor 3")):
        settings(topic_replication_factor=3, topic_min_insync_replicas=4)


async def test_one_replica_is_refused_before_anything_is_created(cluster: Cluster) -> None:
    with pytest.raises(SingleBrokerAcksError) as refused:
        await topics.ensure_topics(settings(topic_replication_factor=1))
    assert "GRAPHLEDGER_TOPIC_REPLICATION_FACTOR 1 and min.insync.replicas 1" in str(refused.value)
    assert "--allow-single-broker-acks" in str(refused.value)
    assert sent(cluster, CREATE_TOPICS) == [] and cluster.topics == {}

    with pytest.raises(SingleBrokerAcksError, match=re.escape("REPLICATION_FACTOR 3 and min.insync.replicas 1")):
        await topics.ensure_topics(settings(topic_replication_factor=3, topic_min_insync_replicas=1))
    assert cluster.topics == {}

    reports = await topics.ensure_topics(settings(topic_replication_factor=1), allow_single_broker_acks=True)
    assert [r.min_insync_replicas for r in reports[:2]] == [1, 1]
    allowed_by_setting = settings(topic_replication_factor=1, topic_allow_single_broker_acks=True)
    assert all(not r.created for r in await topics.ensure_topics(allowed_by_setting))


async def test_an_existing_topic_kafka_acknowledges_on_its_leader_alone_is_refused(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    # Created elsewhere with the broker default min.insync.replicas=1; the dead-letter topic is missing.
    cluster.topics["gl.checkpoints"] = Topic(12, 3, {"retention.ms": "-1"})
    cluster.topics["gl.store"] = Topic(12, 3, {"retention.ms": "-1", "min.insync.replicas": "2"})
    with pytest.raises(SingleBrokerAcksError) as refused:
        await topics.ensure_topics(settings(topic_replication_factor=3))
    message = str(refused.value)
    assert "topic gl.checkpoints has replication factor 3 and min.insync.replicas 1" in message
    assert "--add-config min.insync.replicas=2" in message
    assert sent(cluster, CREATE_TOPICS) == [] and "gl.dead-letters" not in cluster.topics  # nothing changed

    with caplog.at_level(logging.WARNING):
        reports = await topics.ensure_topics(settings(topic_replication_factor=3), allow_single_broker_acks=True)
    assert reports[0].min_insync_replicas == 1
    assert "gl.dead-letters" in cluster.topics
    assert "gl.checkpoints has min.insync.replicas 1, the settings ask for 2; left as it is" in caplog.text


async def test_an_existing_topic_that_refuses_every_write_is_refused(cluster: Cluster) -> None:
    cluster.topics["gl.store"] = Topic(12, 2, {"min.insync.replicas": "3"})
    with pytest.raises(
        TopicConfigError, match=re.escape("replication factor 2 and min.insync.replicas 3: the broker refuses")
    ):
        await topics.ensure_topics(settings(topic_replication_factor=3), allow_single_broker_acks=True)


async def test_configs_the_broker_does_not_describe(cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    cluster.describes_configs = False
    cluster.topics["gl.checkpoints"] = Topic(12, 3)
    cluster.topics["gl.store"] = Topic(12, 1)
    with pytest.raises(
        SingleBrokerAcksError, match=re.escape("gl.store has replication factor 1 and min.insync.replicas not")
    ):
        await topics.ensure_topics(settings(topic_replication_factor=3))
    cluster.topics["gl.store"] = Topic(12, 3)
    with caplog.at_level(logging.WARNING):
        reports = await topics.ensure_topics(settings(topic_replication_factor=3))
    assert [r.min_insync_replicas for r in reports] == [None, None, None]
    assert "gl.checkpoints: the broker did not describe min.insync.replicas" in caplog.text


async def test_a_creation_the_broker_refuses_fails_naming_its_reason(cluster: Cluster) -> None:
    cluster.refuse_creation = "Replication factor: 3 larger than available brokers: 1."
    with pytest.raises(
        TopicConfigError, match=re.escape("Kafka refused to create topic gl.checkpoints: Replication factor: 3")
    ):
        await topics.ensure_topics(settings(topic_replication_factor=3))


def test_who_acknowledges_a_write() -> None:
    assert Durability("t", 3, 2).acknowledgers == 2
    assert Durability("t", 3, 1).acknowledgers == 1
    assert Durability("t", 1, 2).acknowledgers == 1
    assert Durability("t", 1, None).acknowledgers == 1  # one replica, whatever the config
    assert Durability("t", 3, None).acknowledgers is None
    assert durability.check_existing(Durability("t", 3, 2), 2, allow_single_broker_acks=False) is None


# -- the partition layout ---------------------------------------------------------------------------------


async def test_the_partition_counts_are_recorded_once(cluster: Cluster) -> None:
    reports = await topics.ensure_topics(settings(topic_replication_factor=3))
    assert cluster.recorded() == {"gl.checkpoints": 12, "gl.store": 12}
    assert [r.recorded_partitions for r in reports] == [12, 12, None]
    await topics.ensure_topics(settings(topic_replication_factor=3))
    assert len(cluster.layout) == 2  # recorded already: nothing written again
    # The layout read asks Metadata v7 for the layout topic alone, never creating it.
    reads = [s for s in cluster.last_wire.of(METADATA) if s.version == 7]  # type: ignore[attr-defined]
    assert reads and all(r.obj() == {"topics": ["gl.layout"], "allow_auto_topic_creation": False} for r in reads)


async def test_topics_from_before_the_layout_get_their_counts_recorded(cluster: Cluster) -> None:
    cluster.topics["gl.checkpoints"] = Topic(6, 3, {"min.insync.replicas": "2"})
    cluster.topics["gl.store"] = Topic(4, 3, {"min.insync.replicas": "2"})
    await topics.ensure_topics(settings(topic_replication_factor=3))
    assert cluster.recorded() == {"gl.checkpoints": 6, "gl.store": 4}  # what they have, not the setting's 12


async def test_a_changed_partition_count_is_reported_and_nothing_changes(cluster: Cluster) -> None:
    await topics.ensure_topics(settings(topic_replication_factor=3))
    cluster.topics["gl.store"].partitions = 16  # kafka-topics.sh --alter --partitions 16
    del cluster.topics["gl.dead-letters"]
    created_before, layout_before = len(sent(cluster, CREATE_TOPICS)), list(cluster.layout)
    with pytest.raises(PartitionCountChangedError) as refused:
        await topics.ensure_topics(settings(topic_replication_factor=3))
    assert "Kafka reports 16 partitions for gl.store, which gl.layout records with 12" in str(refused.value)
    assert "docs/operations.md" in str(refused.value)
    assert (refused.value.recorded, refused.value.found) == (12, 16)
    assert sent(cluster, CREATE_TOPICS) == [] and cluster.layout == layout_before  # a new admin: nothing sent
    assert created_before and "gl.dead-letters" not in cluster.topics


async def test_a_missing_topic_is_created_only_with_its_recorded_count(cluster: Cluster) -> None:
    await topics.ensure_topics(settings(topic_replication_factor=3))
    del cluster.topics["gl.checkpoints"]
    with pytest.raises(
        TopicConfigError, match=re.escape("records it with 12 partitions, not GRAPHLEDGER_TOPIC_PARTITIONS 8")
    ):
        await topics.ensure_topics(settings(topic_replication_factor=3, topic_partitions=8))
    assert "gl.checkpoints" not in cluster.topics
    await topics.ensure_topics(settings(topic_replication_factor=3, topic_partitions=12))
    assert cluster.topics["gl.checkpoints"].partitions == 12
