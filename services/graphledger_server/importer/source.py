"""Reading an existing `langgraph-checkpoint-postgres` database, in cursor order, in bounded chunks.

Threads are ordered by `thread_id` and store items by `(prefix, key)`, both in byte order (`COLLATE "C"`),
so a cursor names a position that does not depend on the database's locale. jsonb columns come back
as their JSON text (asyncpg's default), which is what the events carry.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import asyncpg

from graphledger.errors import SourceError
from graphledger.events.store import Vector
from graphledger_server.importer.plan import ThreadRows
from graphledger_server.sql import check_schema

THREADS_SQL = """
SELECT DISTINCT thread_id COLLATE "C" AS thread_id FROM {s}.checkpoints
WHERE $1::text IS NULL OR thread_id COLLATE "C" > $1::text
ORDER BY 1 LIMIT $2::int
"""
CHECKPOINTS_SQL = """
SELECT thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint::text AS checkpoint,
       metadata::text AS metadata
FROM {s}.checkpoints WHERE thread_id = ANY($1::text[])
"""
BLOBS_SQL = """
SELECT thread_id, checkpoint_ns, channel, version, type, blob FROM {s}.checkpoint_blobs
WHERE thread_id = ANY($1::text[])
"""
WRITES_SQL = """
SELECT thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob
FROM {s}.checkpoint_writes WHERE thread_id = ANY($1::text[])
"""
ITEMS_SQL = """
SELECT prefix, key, value::text AS value, created_at, updated_at, ttl_minutes FROM {s}.store
WHERE $1::text IS NULL OR (prefix COLLATE "C", key COLLATE "C") > ($1::text, $2::text)
ORDER BY prefix COLLATE "C", key COLLATE "C" LIMIT $3::int
"""
VECTORS_SQL = """
SELECT v.prefix, v.key, v.field_name, v.embedding::real[] AS embedding
FROM {s}.store_vectors v JOIN unnest($1::text[], $2::text[]) AS i(prefix, key) USING (prefix, key)
ORDER BY v.prefix, v.key, v.field_name
"""
HAS_TABLE_SQL = "SELECT to_regclass($1::text) IS NOT NULL"
DIMS_SQL = "SELECT array_length(embedding::real[], 1) FROM {s}.store_vectors LIMIT 1"


class Source:
    """One connection to the source database, schema `schema`."""

    def __init__(self, conn: asyncpg.Connection, schema: str) -> None:
        check_schema(schema)
        self.conn = conn
        self.schema = schema
        self.has_checkpoints = False
        self.has_store = False
        self.has_vectors = False

    def _sql(self, sql: str) -> str:
        return sql.replace("{s}", self.schema)

    async def inspect(self) -> None:
        async def has(table: str) -> bool:
            return bool(await self.conn.fetchval(HAS_TABLE_SQL, f"{self.schema}.{table}"))

        self.has_checkpoints = all([await has(t) for t in ("checkpoints", "checkpoint_blobs", "checkpoint_writes")])
        self.has_store = await has("store")
        self.has_vectors = self.has_store and await has("store_vectors")
        if not self.has_checkpoints and not self.has_store:
            raise SourceError(
                f"schema {self.schema!r} of the source has neither checkpoint tables nor a store table "
                "(is it a langgraph-checkpoint-postgres database? set --from-schema)"
            )

    async def vector_dims(self) -> int | None:
        """The dims of the source's stored vectors, None without any."""
        if not self.has_vectors:
            return None
        return await self.conn.fetchval(self._sql(DIMS_SQL))

    async def threads_after(self, cursor: str | None, limit: int) -> list[str]:
        rows = await self.conn.fetch(self._sql(THREADS_SQL), cursor, limit)
        return [r["thread_id"] for r in rows]

    async def thread_rows(self, thread_ids: Sequence[str]) -> list[ThreadRows]:
        ids = list(thread_ids)
        checkpoints = await self.conn.fetch(self._sql(CHECKPOINTS_SQL), ids)
        blobs = await self.conn.fetch(self._sql(BLOBS_SQL), ids)
        writes = await self.conn.fetch(self._sql(WRITES_SQL), ids)
        grouped: dict[str, tuple[list[Any], list[Any], list[Any]]] = {t: ([], [], []) for t in ids}
        for i, rows in enumerate((checkpoints, blobs, writes)):
            for row in rows:
                grouped[row["thread_id"]][i].append(row)
        return [ThreadRows(t, *grouped[t]) for t in ids]

    async def items_after(self, cursor: Sequence[str] | None, limit: int) -> list[tuple[Any, list[Vector]]]:
        """Up to `limit` store rows after `cursor` ([prefix, key]), each with its vector rows."""
        prefix, key = (cursor[0], cursor[1]) if cursor else (None, None)
        items = await self.conn.fetch(self._sql(ITEMS_SQL), prefix, key, limit)
        vectors: dict[tuple[str, str], list[Vector]] = {}
        if items and self.has_vectors:
            prefixes, keys = [r["prefix"] for r in items], [r["key"] for r in items]
            rows = await self.conn.fetch(self._sql(VECTORS_SQL), prefixes, keys)
            for r in rows:
                vectors.setdefault((r["prefix"], r["key"]), []).append((r["field_name"], tuple(r["embedding"])))
        return [(r, vectors.get((r["prefix"], r["key"]), [])) for r in items]
