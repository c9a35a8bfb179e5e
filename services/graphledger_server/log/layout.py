"""`topics ensure`'s part of the partition layout (`graphledger.log.layout` says what and why): read
the recorded counts, refuse source topics whose count changed, and record the counts of the ones that
have no record yet (created now, or before the layout topic existed).
"""

from __future__ import annotations

from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from graphledger.errors import PartitionCountChangedError, TopicConfigError
from graphledger.log.layout import LAYOUT_PARTITION, LOAD_TIMEOUT_S, layout_record, read_layout
from graphledger.settings import Settings
from graphledger_server.log import durability
from graphledger_server.log.clients import new_producer

LAYOUT_CONFIGS = {"cleanup.policy": "compact"}
"""One record per source topic is all that matters; compaction keeps the last of each."""


async def recorded_counts(admin: AIOKafkaAdminClient, settings: Settings) -> dict[str, int]:
    """The counts the layout topic records (empty when it does not exist)."""
    # The admin client's own connection: a layout read is a Metadata request and a fetch.
    return await read_layout(admin._client, settings.layout_topic, LOAD_TIMEOUT_S) or {}


def refuse_changed_counts(settings: Settings, recorded: dict[str, int], found: dict[str, int | None]) -> None:
    """Before anything is created: refuse a source topic whose count is not the recorded one, and a
    missing one that would be created with another count than recorded (`found`: None when missing)."""
    for topic, count in found.items():
        expected = recorded.get(topic)
        if expected is None:
            continue
        if count is not None and count != expected:
            raise PartitionCountChangedError(topic, expected, count, settings.layout_topic)
        if count is None and settings.topic_partitions != expected:
            raise TopicConfigError(
                f"topic {topic} does not exist, and {settings.layout_topic} records it with {expected} partitions, "
                f"not GRAPHLEDGER_TOPIC_PARTITIONS {settings.topic_partitions}: create it with {expected}, or copy "
                "the log into new topics to change the count (docs/operations.md)"
            )


async def record_counts(
    admin: AIOKafkaAdminClient, settings: Settings, existing: set[str], recorded: dict[str, int], counts: dict[str, int]
) -> dict[str, int]:
    """Create the layout topic if missing and record each of `counts` it does not record yet; returns
    what it records now."""
    missing = {topic: n for topic, n in counts.items() if topic not in recorded}
    if not missing:
        return recorded
    if settings.layout_topic not in existing:
        configs = {**LAYOUT_CONFIGS, durability.MIN_INSYNC_REPLICAS: str(settings.min_insync_replicas)}
        topic = NewTopic(settings.layout_topic, 1, settings.topic_replication_factor, topic_configs=configs)
        response = await admin.create_topics([topic])
        for name, error_code, *rest in response.topic_errors:
            if error_code not in (0, 36):  # 36: created meanwhile by another `topics ensure`
                raise TopicConfigError(f"Kafka refused to create topic {name}: {rest[0] if rest else error_code}")
    # Not idempotent: a record written twice records the same count, and `topics ensure` then needs no
    # IdempotentWrite (nor a broker that has InitProducerId, as tansu has not).
    producer = new_producer(settings.model_copy(update={"kafka_idempotence": False}))
    try:
        await producer.start()
        for topic, n in sorted(missing.items()):
            key, value = layout_record(topic, n)
            await (await producer.send(settings.layout_topic, value, key=key, partition=LAYOUT_PARTITION))
    finally:
        await producer.stop()
    return {**recorded, **missing}
