"""The official savers the bench measures against, in their two forms.

`langgraph-checkpoint-postgres` serializes every call of one `AsyncPostgresSaver` through a
per-instance lock. On a single connection that is what it needs; since 3.2.1 a saver on a connection
pool takes no lock, so calls run concurrently on the pool's connections. The installed 3.2.0 still
locks on a pool, so `UnlockedPoolSaver` is 3.2.0 with 3.2.1's `_cursor` for pools.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from langgraph.checkpoint.postgres import _ainternal
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

POOL_SIZE = 16
"""Connections of the pooled form; 8 and 32 measured no faster on 2 cores at concurrency 64."""


class UnlockedPoolSaver(AsyncPostgresSaver):
    """`AsyncPostgresSaver` on a pool as 3.2.1 runs it: each call on a connection of its own, no lock."""

    @asynccontextmanager
    async def _cursor(self, *, pipeline: bool = False) -> AsyncIterator[Any]:
        async with _ainternal.get_connection(self.conn) as conn:
            if pipeline and self.supports_pipeline:
                async with conn.pipeline(), conn.cursor(binary=True, row_factory=dict_row) as cur:
                    yield cur
            elif pipeline:
                async with conn.transaction(), conn.cursor(binary=True, row_factory=dict_row) as cur:
                    yield cur
            else:
                async with conn.cursor(binary=True, row_factory=dict_row) as cur:
                    yield cur


@asynccontextmanager
async def saver_pool(dsn: str) -> AsyncIterator[AsyncConnectionPool[Any]]:
    """The pooled form's connections, `POOL_SIZE` of them, opened."""
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        dsn,
        min_size=POOL_SIZE,
        max_size=POOL_SIZE,
        kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
        open=False,
    )
    await pool.open(wait=True)
    try:
        yield pool
    finally:
        await pool.close()


@asynccontextmanager
async def official_savers(dsn: str) -> AsyncIterator[dict[str, list[AsyncPostgresSaver]]]:
    """Both forms on `dsn`, set up, two savers each (as two pods would hold):
    `{"single connection": [...], "pool": [...]}`."""
    async with (
        saver_pool(dsn) as pool,
        AsyncPostgresSaver.from_conn_string(dsn) as first,
        AsyncPostgresSaver.from_conn_string(dsn) as second,
    ):
        await first.setup()
        yield {"single connection": [first, second], "pool": [UnlockedPoolSaver(pool), UnlockedPoolSaver(pool)]}
