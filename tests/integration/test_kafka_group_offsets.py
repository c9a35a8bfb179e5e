"""The projector's progress as Kafka's own tools see it (`kafka-consumer-groups --describe`, KEDA's
Kafka scaler): the group's committed offsets in Kafka follow the offsets stored in Postgres, so the lag
they compute (log end minus committed) is the records not applied yet. And Postgres stays the truth:
a worker assigned a partition whose Kafka offset is ahead of the stored one applies from the stored one.

Each record is published alone, in its own batch, because tansu answers ListOffsets with the last
batch's base offset + 1: exact only then.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import asyncpg
from aiokafka import TopicPartition

from graphledger.settings import Settings
from graphledger_server.log.reset import reset_offset
from kafka_clients import raw_admin, raw_consumer
from polling import wait_for
from projection_helpers import put
from worker_helpers import producer_for, publish, running_projector

LOCK_OFFSETS = "LOCK TABLE {schema}.graphledger_offsets IN ACCESS EXCLUSIVE MODE"
WAIT_FOR_PUT_S = 3.0
"""How long the stored offsets stay unreadable while the test watches that no batch starts."""
READS_STORED = r"SELECT partition, next_offset FROM"
"""The assignment's read of the stored offsets (`STORED_OFFSETS_SQL`)."""
BATCH = r"INSERT INTO \S+graphledger_offsets|FOR UPDATE OF o"
"""A batch's first statements, which take the partitions' offset rows."""


async def _stored(settings: Settings) -> dict[TopicPartition, int]:
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        rows = await conn.fetch(
            f"SELECT topic, partition, next_offset FROM {settings.postgres_schema}.graphledger_offsets "
            "WHERE consumer_group = $1",
            settings.projector_group_id,
        )
    finally:
        await conn.close()
    return {TopicPartition(r["topic"], r["partition"]): r["next_offset"] for r in rows}


def _partitions(settings: Settings) -> list[TopicPartition]:
    topics = (settings.checkpoint_topic, settings.store_topic)
    return [TopicPartition(topic, p) for topic in topics for p in range(settings.topic_partitions)]


async def _stored_at(settings: Settings, tp: TopicPartition, offset: int) -> bool:
    return (await _stored(settings)).get(tp) == offset


async def _committed_in_kafka(settings: Settings) -> dict[TopicPartition, int]:
    """What `kafka-consumer-groups --describe` shows as CURRENT-OFFSET (OffsetFetch for the group)."""
    admin = raw_admin(settings)
    await admin.start()
    try:
        # Partitions named: tansu answers OffsetFetch for "every partition" with a body aiokafka cannot read.
        committed = await admin.list_consumer_group_offsets(
            settings.projector_group_id, partitions=_partitions(settings)
        )
    finally:
        await admin.close()
    return {tp: meta.offset for tp, meta in committed.items() if meta.offset >= 0}


async def _kafka_lag(settings: Settings) -> int:
    """The group's lag as Kafka's tools compute it: log end offset minus committed offset, summed."""
    committed = await _committed_in_kafka(settings)
    consumer = raw_consumer(settings)
    await consumer.start()
    try:
        ends = await consumer.end_offsets(_partitions(settings))
    finally:
        await consumer.stop()
    return sum(end - committed.get(tp, 0) for tp, end in ends.items())


async def _checkpoints(settings: Settings) -> int:
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        return await conn.fetchval(f"SELECT count(*) FROM {settings.postgres_schema}.checkpoints")
    finally:
        await conn.close()


async def test_kafka_tools_see_the_lag_the_projector_has_and_see_it_go(
    ready_settings: Callable[..., Awaitable[Settings]],
) -> None:
    settings = await ready_settings(topic_partitions=2, batch_max_wait_ms=20)
    async with producer_for(settings) as producer:
        for n in range(3):
            await publish(producer, settings, put(f"a{n}", 1), n % 2)
        async with running_projector(settings):

            async def applied() -> bool:
                return len(await _stored(settings)) == 2

            await wait_for(applied, "both partitions applied")

            async def mirrored() -> bool:
                return await _committed_in_kafka(settings) == await _stored(settings)

            await wait_for(mirrored, "Kafka's committed offsets to equal the stored ones")
            assert await _kafka_lag(settings) == 0

        # The projector is gone: what agents write now is lag, and Kafka's tools count it.
        for n in range(5):
            await publish(producer, settings, put(f"b{n}", 1), n % 2)
        assert await _kafka_lag(settings) == 5
        assert await _committed_in_kafka(settings) == await _stored(settings)

        async with running_projector(settings):

            async def caught_up() -> bool:
                return await _kafka_lag(settings) == 0

            await wait_for(caught_up, "Kafka's lag to drop to 0 once the projector applied the backlog")
        assert await _checkpoints(settings) == 8


async def test_postgres_stays_the_truth_when_kafka_is_ahead(ready_settings: Callable[..., Awaitable[Settings]]) -> None:
    """The stored offset of partition 0 moved back (`offsets reset`, or Postgres restored from a backup)
    while Kafka's committed offset stayed ahead: the worker re-applies from the stored offset, so the
    rows removed since come back, and the records past Kafka's offset are applied too."""
    settings = await ready_settings(topic_partitions=2, batch_max_wait_ms=20)
    tp = TopicPartition(settings.checkpoint_topic, 0)
    # Every partition starts with a stored offset, so each gets one committed to Kafka at assignment
    # (a partition without any would make the consumer raise NoOffsetForPartitionError instead of fetching).
    for topic in (settings.checkpoint_topic, settings.store_topic):
        for partition in range(settings.topic_partitions):
            await reset_offset(settings, topic, partition, 0, apply=True)
    async with producer_for(settings) as producer:
        for n in range(4):
            await publish(producer, settings, put(f"old{n}", 1), 0)
        async with running_projector(settings):

            async def mirrored() -> bool:
                committed = await _committed_in_kafka(settings)
                return committed.get(tp) == 4 and len(committed) == 4 and (await _stored(settings)).get(tp) == 4

            await wait_for(mirrored, "4 records applied and committed to Kafka")

        await reset_offset(settings, settings.checkpoint_topic, 0, "earliest", apply=True)
        conn = await asyncpg.connect(settings.postgres_dsn)
        try:
            await conn.execute(f"DELETE FROM {settings.postgres_schema}.checkpoints")
        finally:
            await conn.close()
        for n in range(3):
            await publish(producer, settings, put(f"new{n}", 1), 0)
        assert (await _committed_in_kafka(settings))[tp] == 4 and (await _stored(settings))[tp] == 0

        # The stored offsets are unreadable for a while, so the new worker's assignment hangs reading them:
        # meanwhile no batch may start (from Kafka's offset 4, it would skip offsets 0 to 3 for good).
        blocker = await asyncpg.connect(settings.postgres_dsn)
        watcher = await asyncpg.connect(settings.postgres_dsn)
        try:
            lock = blocker.transaction()
            await lock.start()
            await blocker.execute(LOCK_OFFSETS.format(schema=settings.postgres_schema))
            async with running_projector(settings):
                try:
                    await wait_for(lambda: _waiting(watcher, READS_STORED), "the assignment to wait for the offsets")
                    watch_until = time.monotonic() + WAIT_FOR_PUT_S
                    while time.monotonic() < watch_until:
                        assert not await _waiting(watcher, BATCH), "a batch started before the stored offsets were read"
                        await asyncio.sleep(0.1)
                finally:
                    await lock.rollback()  # before the projector stops: its stop waits for whatever waits on it
                await wait_for(lambda: _stored_at(settings, tp, 7), "partition 0 applied to its end")
        finally:
            await watcher.close()
            await blocker.close()
        assert await _checkpoints(settings) == 7  # the 4 re-applied from offset 0 and the 3 new ones


async def _waiting(conn: asyncpg.Connection, statement: str) -> bool:
    """Whether a session of the database waits for a lock in a statement matching `statement`."""
    return bool(
        await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' "
            "AND query ~ $1",
            statement,
        )
    )
