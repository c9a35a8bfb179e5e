"""Builders of store events and records, a projection applier and row dumps, for the store tests."""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Sequence
from typing import Any

import asyncpg

from graphledger.events import envelope
from graphledger.events.envelope import Envelope
from graphledger.events.store import StoreDelete, StoreEvent, StoreExpire, StorePut, StoreRefresh, Vector
from graphledger.log.records import LogRecord
from graphledger.opening.records import DeadLetter
from graphledger_server.projection.batch import BatchApplier
from graphledger_server.projection.store import StoreProjection

STORE_TOPIC = "test.store"
T0 = 1_767_225_600_000
"""2026-01-01T00:00:00Z in ms: the producer time store projection logs start at."""
DIMS = 4
"""The vector size of the store projection tests' schemas."""

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


def record(event: StoreEvent, ts_ms: int, partition: int, offset: int, topic: str = STORE_TOPIC) -> LogRecord:
    """The Kafka record of `event`, appended at `ts_ms` (the item's timestamps come from it)."""
    env = Envelope(event.TYPE, str(uuid.uuid4()), ts_ms, event.to_payload())
    headers = tuple(envelope.headers_for(env))
    return LogRecord(topic, partition, offset, event.key.encode(), envelope.encode(env), headers, ts_ms)


def vec(*xs: float) -> list[float]:
    """A `DIMS`-long vector starting with `xs`, zeros after."""
    return [*xs, *([0.0] * (DIMS - len(xs)))]


class Log:
    """Records of one partition with increasing offsets, as the projector would read them."""

    def __init__(self, partition: int = 0) -> None:
        self.partition = partition
        self.offset = 0

    def __call__(self, event: StoreEvent, ts_ms: int) -> LogRecord:
        r = record(event, ts_ms, self.partition, self.offset)
        self.offset += 1
        return r


def random_events(rnd: random.Random, n: int, *, maintenance: bool = False) -> list[tuple[StoreEvent, int]]:
    """`(event, producer time)`: puts (with vectors, without, with none, with TTLs) and deletes over few
    items, so they interleave. With `maintenance`, also refreshes and expiries (the sweeper's decision
    at the event's time), with gaps long enough for TTLs to run out."""
    events: list[tuple[StoreEvent, int]] = []
    ts = T0
    for _ in range(n):
        ts += rnd.choice([0, 1, 7, 20_000] if maintenance else [0, 1, 7])  # equal producer times happen
        ns, key = rnd.choice([["a"], ["a", "b"], ["c"]]), rnd.choice(["k1", "k2", "k3"])
        roll = rnd.random()
        if roll < 0.25:
            events.append((delete(ns, key), ts))
            continue
        if maintenance and roll < 0.35:
            events.append((StoreRefresh(tuple(ns), key), ts))
            continue
        if maintenance and roll < 0.45:
            events.append((StoreExpire(tuple(ns), key, ts), ts))
            continue
        fields = rnd.choice([None, {}, {"t": vec(1)}, {"t": vec(rnd.random(), 1), "u": vec(0, 0, 1)}, {"u": vec(1, 1)}])
        ttl = rnd.choice([None, None, 5, 0.5])
        events.append((put(ns, key, {"n": rnd.randint(0, 9)}, fields, ttl=ttl), ts))
    return events


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
