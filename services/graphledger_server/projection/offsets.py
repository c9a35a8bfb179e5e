"""Per-partition progress in `graphledger_offsets`, written in the batch transaction.

The row of each partition in a batch is locked (`FOR UPDATE`) before anything is applied, and
records below its `next_offset` are skipped. That fences a zombie worker: if a partition moved to
another worker while this one held a batch, whichever commits second waits for the first, sees the
advanced offset and skips what the first applied. Rows are locked in (topic, partition) order so
two workers with overlapping batches cannot deadlock on them.

A replay switches schemas by renaming them while it holds the offsets table locked (docs/replay.md).
A batch that waited for that lock must land in the schema now carrying the name, not in the one it
started to lock: `lock_offsets` compares the table it locked with the one the name means after the
wait and raises `SchemaSwitchedError` when they differ, and the batch is re-run from the start.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import asyncpg

from graphledger.errors import SchemaSwitchedError
from graphledger_server.projection.sql import render

TopicPartition = tuple[str, int]

APPLIED_CHANNEL = "graphledger_applied"

# $1 group, $2/$3 -> unnest(topic, partition).
LOCK_OFFSETS_SQL = """
SELECT o.topic, o.partition, o.next_offset, o.tableoid AS relid
FROM {schema}.graphledger_offsets o
JOIN unnest($2::text[], $3::int[]) AS u(topic, partition) ON o.topic = u.topic AND o.partition = u.partition
WHERE o.consumer_group = $1::text
ORDER BY o.topic, o.partition
FOR UPDATE OF o
"""

# Rows for partitions seen for the first time; next_offset 0 means nothing applied yet.
# $1 group, $2/$3 -> unnest(topic, partition), sorted.
INSERT_OFFSETS_SQL = """
INSERT INTO {schema}.graphledger_offsets (consumer_group, topic, partition, next_offset)
SELECT $1::text, u.topic, u.partition, 0
FROM unnest($2::text[], $3::int[]) AS u(topic, partition)
ORDER BY u.topic, u.partition
ON CONFLICT (consumer_group, topic, partition) DO NOTHING
"""

# $1 group, $2..$4 -> unnest(topic, partition, next_offset).
ADVANCE_OFFSETS_SQL = """
UPDATE {schema}.graphledger_offsets o
SET next_offset = u.next_offset, updated_at = now()
FROM unnest($2::text[], $3::int[], $4::bigint[]) AS u(topic, partition, next_offset)
WHERE o.consumer_group = $1::text AND o.topic = u.topic AND o.partition = u.partition
"""

# $1 group, $2 topic.
STORED_OFFSETS_SQL = """
SELECT partition, next_offset FROM {schema}.graphledger_offsets
WHERE consumer_group = $1::text AND topic = $2::text
"""

# The offsets table the schema name means now. Read from the catalog tables with this statement's
# snapshot, which sees a rename committed while the batch waited; name lookups (`to_regclass`) go
# through a cache this transaction may not have refreshed since its first lock. $1 schema.
CURRENT_OFFSETS_TABLE_SQL = """
SELECT c.oid FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1::text AND c.relname = 'graphledger_offsets'
"""

# Delivered at commit: the read API wakes the reads waiting for a consistency token. $1 schema.
NOTIFY_APPLIED_SQL = f"SELECT pg_notify('{APPLIED_CHANNEL}', $1::text)"


class OffsetStatements:
    def __init__(self, schema: str) -> None:
        self.schema = schema
        self.lock = render(LOCK_OFFSETS_SQL, schema)
        self.insert = render(INSERT_OFFSETS_SQL, schema)
        self.advance = render(ADVANCE_OFFSETS_SQL, schema)
        self.stored = render(STORED_OFFSETS_SQL, schema)
        self.current_table = render(CURRENT_OFFSETS_TABLE_SQL, schema)


async def lock_offsets(
    conn: asyncpg.Connection, sql: OffsetStatements, group: str, partitions: Iterable[TopicPartition]
) -> dict[TopicPartition, int]:
    """Lock the partitions' rows (creating missing ones) and return their next offsets.

    Raises `SchemaSwitchedError` when the rows locked are no longer in the schema named `sql.schema`.
    """
    wanted = sorted(set(partitions))
    topics, parts = [t for t, _ in wanted], [p for _, p in wanted]
    rows = await conn.fetch(sql.lock, group, topics, parts)
    if len(rows) < len(wanted):
        await conn.execute(sql.insert, group, topics, parts)
        rows = await conn.fetch(sql.lock, group, topics, parts)
    current = await conn.fetchval(sql.current_table, sql.schema)
    if any(r["relid"] != current for r in rows):
        raise SchemaSwitchedError(f"schema {sql.schema} was switched by a replay while this batch waited")
    return {(r["topic"], r["partition"]): r["next_offset"] for r in rows}


async def advance_offsets(
    conn: asyncpg.Connection, sql: OffsetStatements, group: str, next_offsets: Mapping[TopicPartition, int]
) -> None:
    if next_offsets:
        items = sorted(next_offsets.items())
        await conn.execute(
            sql.advance, group, [t for (t, _), _ in items], [p for (_, p), _ in items], [o for _, o in items]
        )


async def notify_applied(conn: asyncpg.Connection, schema: str) -> None:
    await conn.execute(NOTIFY_APPLIED_SQL, schema)


async def stored_offsets(conn: asyncpg.Connection, sql: OffsetStatements, group: str, topic: str) -> dict[int, int]:
    """Next offset of each partition of `topic` this group has applied to (where to seek on assignment)."""
    return {r["partition"]: r["next_offset"] for r in await conn.fetch(sql.stored, group, topic)}
