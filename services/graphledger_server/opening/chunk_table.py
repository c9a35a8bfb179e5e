"""`graphledger_chunks`: chunks of an event larger than the broker's message limit, until all arrive.

Chunks are stored inside the batch transaction that consumed them (with the offsets that cover
them), so a worker killed between two chunks of an event loses none: the next worker finds the
earlier chunks here and completes the event when the last one arrives. The event is applied at the
position of the chunk that completed it, and its chunk rows are deleted in the same transaction.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import asyncpg

from graphledger.opening.chunks import ChunkKey
from graphledger.opening.records import Chunk, subject_ref
from graphledger_server.sql import render

# $1..$3 -> unnest(topic, partition, event_id) of the chunked events in a batch.
STORED_INDEXES_SQL = """
SELECT c.topic, c.partition, c.event_id, c.idx, octet_length(c.data) AS size
FROM {schema}.graphledger_chunks c
JOIN unnest($1::text[], $2::int[], $3::text[]) AS u(topic, partition, event_id)
  ON c.topic = u.topic AND c.partition = u.partition AND c.event_id = u.event_id
"""

STORED_DATA_SQL = """
SELECT c.topic, c.partition, c.event_id, c.idx, c.data
FROM {schema}.graphledger_chunks c
JOIN unnest($1::text[], $2::int[], $3::text[]) AS u(topic, partition, event_id)
  ON c.topic = u.topic AND c.partition = u.partition AND c.event_id = u.event_id
"""

# $1..$8 -> unnest(topic, partition, event_id, idx, count, data, offset, subject_ref). A chunk seen
# twice (a producer retry) keeps its first copy.
INSERT_CHUNKS_SQL = """
INSERT INTO {schema}.graphledger_chunks (topic, partition, event_id, idx, count, data, "offset", subject_ref)
SELECT * FROM unnest($1::text[], $2::int[], $3::text[], $4::int[], $5::int[], $6::bytea[], $7::bigint[],
                     $8::text[])
ON CONFLICT (topic, partition, event_id, idx) DO NOTHING
"""

DELETE_CHUNKS_SQL = """
DELETE FROM {schema}.graphledger_chunks c
USING unnest($1::text[], $2::int[], $3::text[]) AS u(topic, partition, event_id)
WHERE c.topic = u.topic AND c.partition = u.partition AND c.event_id = u.event_id
"""


class ChunkStatements:
    def __init__(self, schema: str) -> None:
        self.stored_indexes = render(STORED_INDEXES_SQL, schema)
        self.stored_data = render(STORED_DATA_SQL, schema)
        self.insert = render(INSERT_CHUNKS_SQL, schema)
        self.delete = render(DELETE_CHUNKS_SQL, schema)


def _key_columns(keys: Iterable[ChunkKey]) -> list[list[object]]:
    ordered = sorted(set(keys))
    return [[k[0] for k in ordered], [k[1] for k in ordered], [k[2] for k in ordered]]


async def stored_indexes(
    conn: asyncpg.Connection, sql: ChunkStatements, keys: Iterable[ChunkKey]
) -> tuple[dict[ChunkKey, set[int]], dict[ChunkKey, int]]:
    """The indexes stored of each event, and their bytes (without loading the data)."""
    found: dict[ChunkKey, set[int]] = {}
    sizes: dict[ChunkKey, int] = {}
    for r in await conn.fetch(sql.stored_indexes, *_key_columns(keys)):
        key = (r["topic"], r["partition"], r["event_id"])
        found.setdefault(key, set()).add(r["idx"])
        sizes[key] = sizes.get(key, 0) + r["size"]
    return found, sizes


async def stored_data(
    conn: asyncpg.Connection, sql: ChunkStatements, keys: Iterable[ChunkKey]
) -> dict[ChunkKey, dict[int, bytes]]:
    found: dict[ChunkKey, dict[int, bytes]] = {}
    for r in await conn.fetch(sql.stored_data, *_key_columns(keys)):
        found.setdefault((r["topic"], r["partition"], r["event_id"]), {})[r["idx"]] = r["data"]
    return found


async def store(conn: asyncpg.Connection, sql: ChunkStatements, chunks: Sequence[Chunk]) -> None:
    if chunks:
        await conn.execute(
            sql.insert,
            [c.record.topic for c in chunks],
            [c.record.partition for c in chunks],
            [c.ref.event_id for c in chunks],
            [c.ref.index for c in chunks],
            [c.ref.count for c in chunks],
            [c.record.value or b"" for c in chunks],
            [c.record.offset for c in chunks],
            [subject_ref(c.record) for c in chunks],
        )


async def delete(conn: asyncpg.Connection, sql: ChunkStatements, keys: Iterable[ChunkKey]) -> None:
    columns = _key_columns(keys)
    if columns[0]:
        await conn.execute(sql.delete, *columns)
