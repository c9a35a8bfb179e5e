"""`topics ensure` against a cluster given as data (`kafka_wire.py`): the CreateTopics and DescribeConfigs
requests it sends, and what it decides on the answers a real Kafka cluster gives. tansu describes only
the configs a topic was created with and keeps one replica whatever it is asked for, so the answers of
a cluster with replicas and broker defaults are tried here only."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.protocol.api import RequestStruct, Response

from graphledger.errors import SingleBrokerAcksError, TopicConfigError
from graphledger.settings import Settings
from graphledger_server.log import durability, topics
from graphledger_server.log.durability import Durability
from kafka_wire import Wire

CREATE_TOPICS, DESCRIBE_CONFIGS, METADATA = 19, 32, 3
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

    def wire(self) -> Wire:
        wire = Wire()
        wire.handlers = {METADATA: self.metadata, CREATE_TOPICS: self.create, DESCRIBE_CONFIGS: self.describe}
        return wire

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
            partitions = [(0, p, 1, replicas, replicas, []) for p in range(topic.partitions)]
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


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> Cluster:
    cluster = Cluster()

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

    [create_checkpoints, create_store, create_dead_letters] = [
        request["create_topic_requests"][0] for request in sent(cluster, CREATE_TOPICS)
    ]
    for request in (create_checkpoints, create_store):
        assert (request["num_partitions"], request["replication_factor"]) == (12, 3)
        configs = {c["config_key"]: c["config_value"] for c in request["configs"]}
        assert configs == {"retention.ms": "-1", "retention.bytes": "-1", "min.insync.replicas": "2"}
    assert create_dead_letters["topic"] == "gl.dead-letters" and create_dead_letters["configs"] == []
    described = [r["resource_name"] for request in sent(cluster, DESCRIBE_CONFIGS) for r in request["resources"]]
    assert described == ["gl.checkpoints", "gl.store", "gl.dead-letters"]
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
