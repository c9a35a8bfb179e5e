"""KafkaStore's writes on a real broker: one item's events share a partition and keep their order there.

Everything else the client does before and after publishing (validation, the events it builds, its read
API calls) is `unit/test_store_client.py`, against in-memory fakes.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiokafka.structs import TopicPartition

from graphledger import KafkaStore
from graphledger.events import store_event
from graphledger.events.envelope import decode
from graphledger.events.store import StorePut
from graphledger.settings import Settings
from graphledger_server.log.topics import ensure_topics
from kafka_clients import raw_consumer


@pytest.fixture
async def settings(make_settings: Callable[..., Settings]) -> Settings:
    # Writes only, in the clear: no projection, and no read API to get data keys from (the order of
    # sealed writes, under keyed-hash record keys, is tested in tests/acceptance/test_erasure.py).
    s = make_settings(postgres_dsn="postgresql://unused/unused", encrypt_events=False)
    await ensure_topics(s)
    return s


@pytest.fixture
async def store(settings: Settings) -> AsyncIterator[KafkaStore]:
    async with KafkaStore(settings) as s:
        yield s


async def _end_offsets(settings: Settings) -> dict[int, int]:
    """End offset of every store-topic partition."""
    consumer = raw_consumer(settings)
    await consumer.start()
    try:
        partitions = [TopicPartition(settings.store_topic, p) for p in range(settings.topic_partitions)]
        return {tp.partition: offset for tp, offset in (await consumer.end_offsets(partitions)).items()}
    finally:
        await consumer.stop()


async def _events_since(settings: Settings, before: dict[int, int]) -> list[tuple[int, str, Any]]:
    """(partition, Kafka key, decoded event) of every record published after `before`."""
    after = await _end_offsets(settings)
    consumer = raw_consumer(settings)
    await consumer.start()
    try:
        wanted = {TopicPartition(settings.store_topic, p): end for p, end in after.items() if end > before[p]}
        consumer.assign(list(wanted))
        for tp in wanted:
            consumer.seek(tp, before[tp.partition])
        events = []
        while [tp for tp, end in wanted.items() if await consumer.position(tp) < end]:
            for tp, records in (await consumer.getmany(timeout_ms=1000)).items():
                for r in records:
                    events.append((tp.partition, r.key.decode(), store_event(decode(r.value))))
        return events
    finally:
        await consumer.stop()


async def test_one_items_events_share_a_partition_and_keep_their_order(settings: Settings, store: KafkaStore) -> None:
    before = await _end_offsets(settings)
    for i in range(5):
        await store.aput(("ns",), "same", {"i": i})
    await store.adelete(("ns",), "same")
    events = await _events_since(settings, before)
    assert len({partition for partition, _, _ in events}) == 1
    assert [json.loads(e.value_json)["i"] if isinstance(e, StorePut) else None for _, _, e in events] == [
        0,
        1,
        2,
        3,
        4,
        None,
    ]
