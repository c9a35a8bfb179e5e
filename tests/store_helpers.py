"""Builders of store events and records, a projection applier and row dumps, for the store tests."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

import asyncpg

from graphledger.events import envelope
from graphledger.events.envelope import Envelope
from graphledger.events.store import StoreDelete, StoreEvent, StorePut, Vector
from graphledger_server.projection.batch import BatchApplier
from graphledger_server.projection.records import DeadLetter, SourceRecord
from graphledger_server.projection.store import StoreProjection

STORE_TOPIC = "test.store"

STORE_TABLES = {
    "store": "prefix, key",
    "store_vectors": "prefix, key, field_name",
}


def put(
    namespace: Sequence[str],
    key: str,
    value: dict[str, Any],
    vectors: dict[str, Sequence[float]] | None = None,
    *,
    ttl: float | None = None,
) -> StorePut:
    rows: tuple[Vector, ...] | None = None
    if vectors is not None:
        rows = tuple((path, tuple(float(x) for x in vec)) for path, vec in vectors.items())
    return StorePut(tuple(namespace), key, json.dumps(value).encode(), ttl, rows)


def delete(namespace: Sequence[str], key: str) -> StoreDelete:
    return StoreDelete(tuple(namespace), key)


def record(event: StoreEvent, ts_ms: int, partition: int, offset: int, topic: str = STORE_TOPIC) -> SourceRecord:
    """The Kafka record of `event`, produced at `ts_ms` (the item's timestamps come from it)."""
    env = Envelope(event.TYPE, str(uuid.uuid4()), ts_ms, event.to_payload())
    return SourceRecord(
        topic, partition, offset, event.key.encode(), envelope.encode(env), tuple(envelope.headers_for(env))
    )


class Applier:
    """A `BatchApplier` for the store topic alone, collecting what it dead-letters."""

    def __init__(self, schema: str, group: str = "g") -> None:
        self.projection = StoreProjection(schema)
        self.dead: list[DeadLetter] = []
        self.batch = BatchApplier(schema, group, {STORE_TOPIC: self.projection}, self._sink)

    async def _sink(self, letters: Sequence[DeadLetter]) -> None:
        self.dead.extend(letters)

    async def prepare(self, conn: asyncpg.Connection) -> Applier:
        await self.projection.prepare(conn)
        return self


async def dump(conn: asyncpg.Connection, schema: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of the store tables, ordered; jsonb as text, embeddings as text."""
    out: dict[str, list[tuple[Any, ...]]] = {}
    for table, order in STORE_TABLES.items():
        if not await conn.fetchval(f"SELECT to_regclass('{schema}.{table}') IS NOT NULL"):
            continue
        rows = await conn.fetch(f"SELECT * FROM {schema}.{table} ORDER BY {order}")
        out[table] = [tuple(v if isinstance(v, int | float | type(None)) else str(v) for v in r.values()) for r in rows]
    return out
