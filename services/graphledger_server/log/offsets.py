"""Per-partition progress in `graphledger_offsets`: every statement on that table, and its notification.

This module owns the table: the projector's batch transaction, the read API's consistency watcher,
the sweeper's wait for its events, `graphledger offsets reset`, the replay's switch and the dev stack
and benches all read or write it through the statements and functions here, never with SQL of their
own. A question another module asks of the table with its own data, such as the sweeper's "are these
positions applied?" (its positions joined against the rows), is a statement here that takes that data
as array parameters, so the table's SQL is written once.

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

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import asyncpg
import psycopg

from graphledger.errors import SchemaSwitchedError
from graphledger_server.sql import render

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

# $1 group, $2/$3 -> unnest(topic, partition). Plain reads: a committed next offset only grows.
NEXT_OFFSETS_SQL = """
SELECT o.topic, o.partition, o.next_offset
FROM {schema}.graphledger_offsets o
JOIN unnest($2::text[], $3::int[]) AS u(topic, partition) ON o.topic = u.topic AND o.partition = u.partition
WHERE o.consumer_group = $1::text
"""

# $1 group, $2 topic.
STORED_OFFSETS_SQL = """
SELECT partition, next_offset FROM {schema}.graphledger_offsets
WHERE consumer_group = $1::text AND topic = $2::text
"""

# The projection's next offset on one partition, read by the read API inside the snapshot of its answer
# (psycopg, in a session whose search_path is the projection schema): the answer holds every record
# below it. %(group)s, %(topic)s, %(partition)s; no row: nothing applied.
SNAPSHOT_OFFSET_SQL = """
SELECT next_offset FROM graphledger_offsets
WHERE consumer_group = %(group)s AND topic = %(topic)s AND partition = %(partition)s
"""

# The same, with whether the key filter holds every key below it (`log/key_filter.py`).
SNAPSHOT_KEY_FILTER_OFFSET_SQL = """
SELECT next_offset, key_filter_complete FROM graphledger_offsets
WHERE consumer_group = %(group)s AND topic = %(topic)s AND partition = %(partition)s
"""

# Every partition of every topic the group applied to. $1 group.
GROUP_OFFSETS_SQL = """
SELECT topic, partition, next_offset FROM {schema}.graphledger_offsets WHERE consumer_group = $1::text
"""

# Whether the group applied every listed position (a partition without a row applied nothing).
# $1 group, $2..$4 -> unnest(topic, partition, offset).
ALL_APPLIED_SQL = """
SELECT bool_and(coalesce(o.next_offset > u.off, false))
FROM unnest($2::text[], $3::int[], $4::bigint[]) AS u(topic, partition, off)
LEFT JOIN {schema}.graphledger_offsets o
  ON o.consumer_group = $1::text AND o.topic = u.topic AND o.partition = u.partition
"""

# One partition's row, locked until the operator's change commits. $1 group, $2 topic, $3 partition.
PARTITION_OFFSET_FOR_UPDATE_SQL = """
SELECT next_offset FROM {schema}.graphledger_offsets
WHERE consumer_group = $1::text AND topic = $2::text AND partition = $3::int
FOR UPDATE
"""

# $1 group, $2 topic, $3 partition, $4 next offset.
SET_OFFSET_SQL = """
INSERT INTO {schema}.graphledger_offsets (consumer_group, topic, partition, next_offset)
VALUES ($1::text, $2::text, $3::int, $4::bigint)
ON CONFLICT (consumer_group, topic, partition) DO UPDATE SET next_offset = EXCLUDED.next_offset, updated_at = now()
"""

# Whether the schema has been migrated this far (a projection to replace).
OFFSETS_TABLE_EXISTS_SQL = "SELECT to_regclass('{schema}.graphledger_offsets') IS NOT NULL"

# Every projector batch starts by locking its rows FOR UPDATE, which EXCLUSIVE mode blocks, while
# plain SELECTs go on: holding it stops the schema's projection until the transaction ends.
LOCK_OFFSETS_TABLE_SQL = "LOCK TABLE {schema}.graphledger_offsets IN EXCLUSIVE MODE"

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
    """The statements on one schema's `graphledger_offsets`, rendered once."""

    def __init__(self, schema: str) -> None:
        self.schema = schema
        self.lock = render(LOCK_OFFSETS_SQL, schema)
        self.insert = render(INSERT_OFFSETS_SQL, schema)
        self.advance = render(ADVANCE_OFFSETS_SQL, schema)
        self.stored = render(STORED_OFFSETS_SQL, schema)
        self.next = render(NEXT_OFFSETS_SQL, schema)
        self.current_table = render(CURRENT_OFFSETS_TABLE_SQL, schema)
        self.group = render(GROUP_OFFSETS_SQL, schema)
        self.all_applied = render(ALL_APPLIED_SQL, schema)
        self.partition_for_update = render(PARTITION_OFFSET_FOR_UPDATE_SQL, schema)
        self.set = render(SET_OFFSET_SQL, schema)
        self.table_exists = render(OFFSETS_TABLE_EXISTS_SQL, schema)
        self.lock_table = render(LOCK_OFFSETS_TABLE_SQL, schema)


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


async def next_offsets(
    conn: asyncpg.Connection, sql: OffsetStatements, group: str, partitions: Iterable[TopicPartition]
) -> dict[TopicPartition, int]:
    """The committed next offsets of `partitions` (absent: nothing applied there yet)."""
    wanted = sorted(set(partitions))
    rows = await conn.fetch(sql.next, group, [t for t, _ in wanted], [p for _, p in wanted])
    return {(r["topic"], r["partition"]): r["next_offset"] for r in rows}


async def notify_applied(conn: asyncpg.Connection, schema: str) -> None:
    """Have the read APIs re-read `schema`'s offsets once this transaction commits."""
    await conn.execute(NOTIFY_APPLIED_SQL, schema)


async def stored_offsets(conn: asyncpg.Connection, sql: OffsetStatements, group: str, topic: str) -> dict[int, int]:
    """Next offset of each partition of `topic` this group has applied to (where to seek on assignment)."""
    return {r["partition"]: r["next_offset"] for r in await conn.fetch(sql.stored, group, topic)}


async def group_offsets(conn: asyncpg.Connection, sql: OffsetStatements, group: str) -> dict[TopicPartition, int]:
    """Next offset of every partition this group has applied to, on any topic."""
    return {(r["topic"], r["partition"]): r["next_offset"] for r in await conn.fetch(sql.group, group)}


async def all_applied(
    conn: asyncpg.Connection, sql: OffsetStatements, group: str, positions: Sequence[tuple[str, int, int]]
) -> bool:
    """Whether this group applied every `(topic, partition, offset)` of `positions`."""
    if not positions:
        return True
    topics, partitions, offsets = (list(column) for column in zip(*positions, strict=True))
    return bool(await conn.fetchval(sql.all_applied, group, topics, partitions, offsets))


async def lock_partition_offset(
    conn: asyncpg.Connection, sql: OffsetStatements, group: str, tp: TopicPartition
) -> int | None:
    """`tp`'s next offset for `group` (None: no row), its row locked until the transaction ends."""
    return await conn.fetchval(sql.partition_for_update, group, *tp)


async def set_offset(
    conn: asyncpg.Connection, sql: OffsetStatements, group: str, tp: TopicPartition, next_offset: int
) -> None:
    """Set `tp`'s next offset for `group`, creating its row if missing (an operator's reset)."""
    await conn.execute(sql.set, group, *tp, next_offset)


async def offsets_table_exists(conn: asyncpg.Connection, sql: OffsetStatements) -> bool:
    return bool(await conn.fetchval(sql.table_exists))


async def hold_projection(conn: asyncpg.Connection, sql: OffsetStatements) -> None:
    """Stop the schema's projector batches until this transaction ends (reads go on); see LOCK_OFFSETS_TABLE_SQL."""
    await conn.execute(sql.lock_table)


async def snapshot_key_filter_offset(
    conn: psycopg.AsyncConnection[Any], group: str, topic: str, partition: int
) -> tuple[int, bool]:
    """`snapshot_offset`, and whether the partition's key filter holds every key below it (no row: nothing
    applied, so an empty filter does)."""
    params = {"group": group, "topic": topic, "partition": partition}
    row = await (await conn.execute(SNAPSHOT_KEY_FILTER_OFFSET_SQL, params)).fetchone()
    if row is None:
        return 0, True
    next_offset, complete = (row["next_offset"], row["key_filter_complete"]) if isinstance(row, dict) else row
    return int(next_offset), bool(complete)


async def snapshot_offset(conn: psycopg.AsyncConnection[Any], group: str, topic: str, partition: int) -> int:
    """`(topic, partition)`'s next offset for `group` (0: none applied), on a psycopg session whose
    search_path is the schema, in the snapshot of the caller's transaction."""
    cursor = await conn.execute(SNAPSHOT_OFFSET_SQL, {"group": group, "topic": topic, "partition": partition})
    row = await cursor.fetchone()
    if row is None:
        return 0
    return int(row["next_offset"] if isinstance(row, dict) else row[0])
