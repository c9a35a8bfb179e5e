"""An operator's move of a partition's applied offset (`graphledger offsets reset`), after the log lost
records the projection applied: the projector stopped that partition rather than guess (`log_guard`)."""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg
from aiokafka import TopicPartition

from graphledger.errors import OffsetResetError
from graphledger.settings import Settings
from graphledger_server.log.clients import new_consumer
from graphledger_server.log.offsets import OffsetStatements, lock_partition_offset, notify_applied, set_offset
from graphledger_server.log.topics import source_topics


@dataclass(frozen=True)
class Reset:
    group: str
    topic: str
    partition: int
    before: int | None
    after: int


async def earliest_offset(settings: Settings, topic: str, partition: int) -> int:
    """The first offset the broker still holds for the partition (ListOffsets earliest)."""
    consumer = new_consumer(settings)
    await consumer.start()
    try:
        tp = TopicPartition(topic, partition)
        return (await consumer.beginning_offsets([tp]))[tp]
    finally:
        await consumer.stop()


async def reset_offset(
    settings: Settings, topic: str, partition: int, to: str | int, *, group: str | None = None, apply: bool
) -> Reset:
    """Set the stored next offset of `group`'s `topic`:`partition` (only when `apply`) to `to`, an offset
    or "earliest"; returns what it was and what it is (or would be)."""
    group = group or settings.projector_group_id
    if topic not in source_topics(settings):
        raise OffsetResetError(f"topic {topic} is not one the projector consumes: {', '.join(source_topics(settings))}")
    target = await earliest_offset(settings, topic, partition) if to == "earliest" else int(to)
    sql = OffsetStatements(settings.postgres_schema)
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        async with conn.transaction():
            before = await lock_partition_offset(conn, sql, group, (topic, partition))
            if apply:
                await set_offset(conn, sql, group, (topic, partition), target)
                await notify_applied(conn, settings.postgres_schema)  # the read API re-reads the offsets
    finally:
        await conn.close()
    return Reset(group, topic, partition, before, target)
