"""Every statement on `graphledger_key_filter`, the checkpoint partitions' Bloom filters of record keys.

The projector ORs the bits of the keys of a batch's records into the filter in the batch's transaction,
before it advances the partitions' offsets past them (`projection/batch.py`), so the filter and the
offset row commit together; the read API reads both in one snapshot (`api/routes/key_filter.py`). Rows are
written in (partition, word) order, and a batch holds its partitions' offset rows locked first, so two
batches never wait on each other's words. A word whose bits are all set already is not rewritten: once a
thread's key is in, its later records cost no write.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import asyncpg
import psycopg

from graphledger.log import key_filter
from graphledger_server.sql import render

# $1 topic, $2..$4 -> unnest(partition, word, bits), sorted.
RECORD_SQL = """
INSERT INTO {schema}.graphledger_key_filter AS f (topic, partition, word, bits)
SELECT $1::text, u.partition, u.word, u.bits
FROM unnest($2::int[], $3::int[], $4::bigint[]) AS u(partition, word, bits)
ORDER BY u.partition, u.word
ON CONFLICT (topic, partition, word) DO UPDATE SET bits = f.bits | EXCLUDED.bits
WHERE f.bits | EXCLUDED.bits <> f.bits
"""

# One partition's words (psycopg, in a session whose search_path is the projection schema, in the snapshot
# of the caller's transaction). %(topic)s, %(partition)s.
SNAPSHOT_WORDS_SQL = """
SELECT word, bits FROM graphledger_key_filter WHERE topic = %(topic)s AND partition = %(partition)s
"""


async def record(conn: asyncpg.Connection, sql: str, topic: str, keys: Iterable[tuple[int, bytes]]) -> None:
    """Set the bits of `(partition, key)` of records of `topic` (`sql`: `RECORD_SQL` rendered)."""
    by_partition: dict[int, list[bytes]] = {}
    for partition, key in keys:
        by_partition.setdefault(partition, []).append(key)
    partitions: list[int] = []
    words: list[int] = []
    bits: list[int] = []
    for partition, partition_keys in by_partition.items():
        for word, word_bits in key_filter.words_of(partition_keys).items():
            partitions.append(partition)
            words.append(word)
            bits.append(key_filter.signed(word_bits))
    if partitions:
        await conn.execute(sql, topic, partitions, words, bits)


def render_record(schema: str) -> str:
    return render(RECORD_SQL, schema)


async def snapshot_words(conn: psycopg.AsyncConnection[Any], topic: str, partition: int) -> tuple[bytes, bytes]:
    """The partition's set words as packed little-endian arrays: indexes (uint32) and bits (uint64)."""
    cursor = await conn.execute(SNAPSHOT_WORDS_SQL, {"topic": topic, "partition": partition})
    rows: Sequence[Any] = await cursor.fetchall()
    indexes = bytearray()
    values = bytearray()
    for row in rows:
        word, bits = (row["word"], row["bits"]) if isinstance(row, dict) else row
        indexes += int(word).to_bytes(4, "little")
        values += int(bits).to_bytes(8, "little", signed=True)
    return bytes(indexes), bytes(values)
