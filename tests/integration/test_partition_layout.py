"""The partition layout on the broker: `topics ensure` records each source topic's count in
`<prefix>.layout`, and when the broker reports another count every writer, reader and projector stops
with a clear error, writing nothing. tansu cannot add partitions (no CreatePartitions), so the count
"changes" here by a newer layout record naming another one, which every process reads as it reads a
real change; a count that changes under a running process is tried in tests/unit/test_partition_count_checks.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx
import pytest
from aiokafka import TopicPartition

from graphledger.client.producer import new_producer
from graphledger.client.publisher import EventPublisher
from graphledger.errors import PartitionCountChangedError
from graphledger.events import to_envelope
from graphledger.events.store import StorePut
from graphledger.log.layout import layout_record, read_layout
from graphledger.log.tail import LogTail
from graphledger.settings import Settings
from graphledger_server.api.app import create_app
from graphledger_server.log.topics import ensure_topics
from graphledger_server.projection.migrate import migrate
from graphledger_server.projector.main import run_projector

PARTITIONS = 4


def _event(key: str) -> object:
    return to_envelope(StorePut(("layout",), key, b'{"v": 1}', None, None))


async def _record(settings: Settings, topic: str, partitions: int) -> None:
    producer = new_producer(settings)
    await producer.start()
    try:
        key, value = layout_record(topic, partitions)
        await (await producer.send(settings.layout_topic, value, key=key, partition=0))
    finally:
        await producer.stop()


async def _recorded(settings: Settings) -> dict[str, int] | None:
    tail = LogTail(settings)
    await tail.start()
    try:
        return await read_layout(tail._client, settings.layout_topic, 10)  # type: ignore[arg-type]
    finally:
        await tail.stop()


async def _ends(settings: Settings, topic: str) -> dict[TopicPartition, int]:
    tail = LogTail(settings)
    await tail.start()
    try:
        return await tail.ends({TopicPartition(topic, p): 0 for p in range(PARTITIONS)}, 10)
    finally:
        await tail.stop()


async def test_a_count_other_than_the_recorded_one_stops_writers_readers_and_the_projector(
    make_settings: Callable[..., Settings],
) -> None:
    settings = make_settings(topic_partitions=PARTITIONS)
    reports = await ensure_topics(settings)
    assert [r.recorded_partitions for r in reports] == [PARTITIONS, PARTITIONS, None]
    assert await _recorded(settings) == {settings.checkpoint_topic: PARTITIONS, settings.store_topic: PARTITIONS}
    publisher = EventPublisher(settings)
    await publisher.start()
    try:
        assert await publisher.publish(settings.store_topic, "before", _event("before"))
    finally:
        await publisher.stop()

    # From here on the broker's 4 partitions of the store topic are not the 3 recorded.
    await _record(settings, settings.store_topic, 3)
    before = await _ends(settings, settings.store_topic)

    publisher = EventPublisher(settings)
    await publisher.start()
    try:
        with pytest.raises(PartitionCountChangedError) as stopped:
            await publisher.publish(settings.store_topic, "after", _event("after"))
        assert (
            f"Kafka reports 4 partitions for {settings.store_topic}, which {settings.layout_topic} records with 3"
            in (str(stopped.value))
        )
        # The other source topic keeps its recorded count: its writes go on.
        assert await publisher.publish(settings.checkpoint_topic, None, _event("other"), partition=0)
    finally:
        await publisher.stop()
    assert await _ends(settings, settings.store_topic) == before  # nothing written

    tail = LogTail(settings)
    await tail.start()
    try:
        with pytest.raises(PartitionCountChangedError):
            await tail.partition_of(settings.store_topic, b"after")
        assert await tail.partition_count(settings.checkpoint_topic) == PARTITIONS
    finally:
        await tail.stop()

    # The read API cannot tell an item's partition: 503, not retryable, naming the counts.
    await migrate(settings.postgres_dsn, settings.postgres_schema)
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://read-api") as client:
            response = await client.post(
                "/v1/store/batch", json={"ops": [{"op": "get", "namespace": ["layout"], "key": "after"}]}
            )
    assert response.status_code == 503, response.text
    body = response.json()
    assert (body["error"], body["retryable"]) == ("partition_count_changed", False)
    assert "records with 3" in body["message"]

    with pytest.raises(PartitionCountChangedError):
        await ensure_topics(settings)
    assert (await _recorded(settings) or {})[settings.store_topic] == 3  # the mismatch is reported, not recorded

    # The projector stops at its assignment: it would apply a thread's records from two partitions apart.
    with pytest.raises(PartitionCountChangedError):
        await asyncio.wait_for(run_projector(settings, asyncio.Event()), 60)
