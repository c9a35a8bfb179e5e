"""The projection contract (`projection_contract.py`) run against `StoreProjection`, and
`graphledger.folds.store_item`, which the read API lays over it, checked against its SQL: what a store get
answers (`TestStoreFold`).
"""

from __future__ import annotations

import dataclasses
import random
import zlib
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import orjson
import pytest

import store_helpers as store
from graphledger.events import envelope
from graphledger.events.erasure import TenantErase
from graphledger.events.store import StoreExpire, StoreRefresh
from graphledger.folds import store_item
from graphledger.log.records import LogRecord
from graphledger_server.api.reads.store_sql import item_rows_statement
from graphledger_server.opening.vector_index import VectorIndex
from graphledger_server.projection.batch import TopicProjection
from graphledger_server.projection.migrate import migrate
from graphledger_server.projection.store import StoreProjection
from projection_contract import ProjectionContract, Rows


def _at(ms: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)


class TestStoreProjection(ProjectionContract):
    TOPIC = store.STORE_TOPIC
    LOGS = ("seed-0", "seed-1", "seed-2")
    PARTITIONS = 3

    async def migrate(self, dsn: str, schema: str) -> None:
        await migrate(dsn, schema, vectors=VectorIndex(store.DIMS))

    def projection(self, schema: str) -> TopicProjection:
        return StoreProjection(schema)

    def records(self, events: Sequence[Any]) -> list[LogRecord]:
        log = store.Log()
        return [log(e, store.T0 + 1_000 * i) for i, e in enumerate(events)]

    def _log(self, name: str, *, maintenance: bool) -> list[LogRecord]:
        """Each item on the partition its key hashes to, as the producer places it."""
        events = store.random_events(random.Random(int(name.removeprefix("seed-"))), 60, maintenance=maintenance)
        logs = [store.Log(p) for p in range(self.PARTITIONS)]
        return [logs[zlib.crc32(e.key.encode()) % self.PARTITIONS](e, ts) for e, ts in events]

    def log(self, name: str) -> list[LogRecord]:
        return self._log(name, maintenance=True)

    def redeliverable(self, name: str) -> list[LogRecord]:
        """Puts and deletes: a refresh or an expiry compares times with the row it finds."""
        return self._log(name, maintenance=False)

    def check_outcome(self, name: str, rows: Rows) -> None:
        assert rows["store"] and rows["store_vectors"]

    def one_key(self) -> list[Any]:
        put, delete, vec = store.put, store.delete, store.vec
        return [
            put(["u"], "k", {"v": 1}),
            put(["u"], "k", {"v": 2}, {"t": vec(1)}),
            delete(["u"], "k"),
            put(["u"], "k", {"v": 3}),
        ]

    async def key_state(self, conn: asyncpg.Connection, schema: str) -> Any:
        row = await conn.fetchrow(
            f"SELECT value::text AS value, created_at, updated_at FROM {schema}.store WHERE prefix = 'u' AND key = 'k'"
        )
        vectors = await conn.fetchval(f"SELECT count(*) FROM {schema}.store_vectors WHERE prefix = 'u' AND key = 'k'")
        return None if row is None else (row["value"], row["created_at"], row["updated_at"], vectors)

    def expected_key_state(self) -> Any:
        return '{"v": 3}', _at(store.T0 + 3_000), _at(store.T0 + 3_000), 0

    def two_keys(self) -> tuple[list[Any], list[Any], tuple[Any, ...]]:
        put, delete, vec = store.put, store.delete, store.vec
        mine = [
            put(["a"], "k", {"v": 1}, {"t": vec(1)}, ttl=5),
            StoreRefresh(("a",), "k"),
            put(["a"], "k", {"v": 2}, ttl=0.5),
        ]
        theirs = [
            put(["a", "b"], "k", {"v": 9}, {"t": vec(0, 1)}, ttl=0.01),  # expired before the refresh
            put(["a"], "k2", {"w": 1}, {"t": vec(1, 1)}),
            StoreRefresh(("a", "b"), "k"),
            delete(["a"], "k2"),
            StoreExpire(("a", "b"), "k", store.T0 + 4_000),
            put(["b"], "k", {"v": 8}),
            delete(["a", "b", "c"], "k"),
        ]
        return mine, theirs, ("a", "k")

    async def rows(self, conn: asyncpg.Connection, schema: str) -> Rows:
        return await store.dump(conn, schema)


# -- the fold equals the SQL --------------------------------------------------------------------------
#
# As `graphledger.folds.thread` against `CheckpointProjection` (test_projection_contract_checkpoints.py): from
# every point of a scenario, an item's answer with the rest of the scenario folded on (`folds.store_item`)
# must be the projection's answer after applying all of it.


def _store_scenario(seed: int) -> list[tuple[Any, int]]:
    """Random puts, deletes, refreshes and expiries of a few items, a tenant's erasure among them and an
    imported put (which carries its creation time)."""
    events = store.random_events(random.Random(seed), 40, maintenance=True)
    ts = events[-1][1]
    imported = dataclasses.replace(store.put(["c"], "k1", {"imported": True}), created_ms=store.T0 - 5_000)
    return [*events[:20], (TenantErase("c"), events[19][1]), *events[20:], (imported, ts + 1)]


def _store_record(event: Any, ts_ms: int, offset: int) -> LogRecord:
    env = envelope.Envelope(event.TYPE, f"e{offset}", ts_ms, event.to_payload())
    key = event.key.encode() if event.key is not None else None
    headers = tuple(envelope.headers_for(env))
    return LogRecord(store.STORE_TOPIC, 0, offset, key, envelope.encode(env), headers, ts_ms)  # appended at ts_ms


async def _items(conn: asyncpg.Connection, schema: str, items: list[tuple[str, str]]) -> dict[Any, Any]:
    """Each item's row as `store_item.Item` (None: no row), read as the read API reads it."""
    sql, args = item_rows_statement(schema, items)
    found: dict[Any, Any] = {}
    for row in await conn.fetch(sql, *args):
        item = None
        if row["created_at"] is not None:
            value = orjson.loads(row["value"])
            item = store_item.Item(row["prefix"], row["key"], value, row["created_at"], row["updated_at"],
                                   row["expires_at"], row["ttl"])  # fmt: skip
        found[(row["prefix"], row["key"])] = item
    return found


class TestStoreFold:
    """`graphledger.folds.store_item` against `StoreProjection`'s SQL: what a store get answers."""

    @pytest.mark.parametrize("seed", [0, 1, 2, 3])
    async def test_the_fold_of_unprojected_events_equals_the_projection(
        self, fresh_database: str, conn: asyncpg.Connection, seed: int
    ) -> None:
        scenario = _store_scenario(seed)
        records = [_store_record(e, ts, offset) for offset, (e, ts) in enumerate(scenario)]
        contract = TestStoreProjection()
        final = await contract.applier(fresh_database, conn, "final", [])
        await final.apply(conn, records)
        steps = await contract.applier(fresh_database, conn, "steps", [])
        to_event = final.projections[store.STORE_TOPIC].to_event
        timed = [to_event(envelope.decode(r.value or b""), r.timestamp) for r in records]
        items = sorted({(".".join(e.namespace), e.item_key) for e, _ in scenario if hasattr(e, "item_key")})
        expected = await _items(conn, "final", items)
        kinds: set[str] = set()
        for k in range(len(records) + 1):
            at_k = await _items(conn, "steps", items)
            for prefix, key in items:
                found = at_k[(prefix, key)]
                for event in timed[k:]:
                    mine = getattr(event.event, "item_key", key) == key and (
                        ".".join(getattr(event.event, "namespace", prefix.split("."))) == prefix
                    )
                    if mine:
                        found = store_item.apply(found, event.event, event.ts_ms)
                        kinds.add(event.TYPE)
                assert found == expected[(prefix, key)], (seed, k, prefix, key)
            if k < len(records):
                await steps.apply(conn, [records[k]])
        assert kinds == {"store.put", "store.delete", "store.refresh", "store.expire", "tenant.erase"}
