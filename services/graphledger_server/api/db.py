"""The read API's Postgres connections: a pool whose sessions see only the projection schema."""

from __future__ import annotations

import json
import logging
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import orjson
import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from graphledger.settings import Settings
from graphledger_server.driver_errors import Verdict, verdict_of

log = logging.getLogger(__name__)

CHECKPOINTS_TABLE_SQL = "SELECT to_regclass('checkpoints') IS NOT NULL AS ready"


@asynccontextmanager
async def snapshot(pool: AsyncConnectionPool[Any]) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """A connection in a repeatable-read transaction: the projection's rows and its applied offsets as
    of one instant (a projector batch commits both at once)."""
    async with pool.connection() as conn:
        if conn.isolation_level is not psycopg.IsolationLevel.REPEATABLE_READ:
            await conn.set_isolation_level(psycopg.IsolationLevel.REPEATABLE_READ)  # for its transactions only
        async with conn.transaction():
            yield conn


class _MostRecentFirst(deque[Any]):
    """psycopg_pool's idle connections, taken from the end they are returned to."""

    def popleft(self) -> Any:  # the pool takes from the left and returns to the right
        return self.pop()


class LifoConnectionPool(AsyncConnectionPool[Any]):
    """A pool that hands out the connection returned last (SQLAlchemy's `pool_use_lifo`).

    psycopg_pool cycles through its idle connections in turn, so at low load every read runs on a
    backend that has sat idle the longest, with cold caches: a store search measured 0.3-0.45 ms slower
    on it than on the connection just used (concurrency 1, 10 connections). Under load every connection
    is busy and the order does not matter. psycopg_pool has no option for it, so the
    idle deque is replaced; the pool is fixed-size, so its shrinking (which takes from the same
    end) never runs. If a psycopg_pool release renames the deque, the pool stays FIFO and says so.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        idle = getattr(self, "_pool", None)
        if type(idle) is deque and not idle:
            self._pool = _MostRecentFirst()
        else:
            log.warning("psycopg_pool's idle connections are not where expected: the pool hands them out in turn")


def conninfo(settings: Settings) -> str:
    """The DSN with `search_path` set to the projection schema, keeping options the DSN already has.

    The official saver's queries name tables unqualified, so the schema is chosen per session; the
    schema name is a validated identifier (`Settings.postgres_schema`).
    """
    options = conninfo_to_dict(settings.postgres_dsn).get("options") or ""
    return make_conninfo(settings.postgres_dsn, options=f"{options} -c search_path={settings.postgres_schema}".strip())


def open_pool(settings: Settings) -> AsyncConnectionPool[Any]:
    """A fixed-size pool with the session settings `AsyncPostgresSaver` expects; opened by the caller."""
    return LifoConnectionPool(
        conninfo(settings),
        min_size=settings.api_pool_size,
        max_size=settings.api_pool_size,
        # What AsyncPostgresSaver.from_conn_string sets: reads need no transaction, every statement
        # is prepared on its first run (prepare_threshold 0; behind PgBouncer that needs its
        # max_prepared_statements, 1.21+), and the saver indexes rows by column name.
        kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
        # A read that gets no connection in time is a retryable 503, not a wait of the pool's default
        # 30 s, longer than a client's patience.
        timeout=settings.api_pool_timeout_s,
        name="graphledger-read-api",
        open=False,
    )


async def not_ready_reason(pool: AsyncConnectionPool[Any]) -> str | None:
    """None when Postgres answers and the schema has the checkpoint tables; otherwise why not."""
    try:
        async with pool.connection() as conn:
            cur = await conn.execute(CHECKPOINTS_TABLE_SQL)
            row = await cur.fetchone()
    except psycopg.Error as exc:
        if verdict_of(exc) is not Verdict.RETRY:
            raise
        await pool.check()  # replace the connections an outage broke, so readiness returns with Postgres
        return f"Postgres is unreachable: {type(exc).__name__}"
    if not row or not row["ready"]:
        return "the projection schema is not migrated: no checkpoints table"
    return None


async def open_store_pool(settings: Settings) -> asyncpg.Pool:
    """The store reads' pool: asyncpg, at most `api_pool_size` connections, opened as reads need them
    (none while Postgres is down) and handed out most recently used first.

    Every session searches the projection schema and runs HNSW scans with `store_hnsw_ef_search`
    (pgvector picks the setting up when it loads); jsonb arrives decoded. asyncpg prepares every
    statement, as the checkpoint pool does (behind PgBouncer: its max_prepared_statements, 1.21+).
    """
    pool = await asyncpg.create_pool(
        settings.postgres_dsn,
        min_size=0,
        max_size=settings.api_pool_size,
        timeout=settings.api_pool_timeout_s,  # connecting
        server_settings={
            "search_path": settings.postgres_schema,
            "hnsw.ef_search": str(settings.store_hnsw_ef_search),
            "application_name": "graphledger-read-api",
        },
        init=_init_store_connection,
        reset=_keep_session,
    )
    assert pool is not None
    return pool


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Nothing to undo when a store read releases its connection: it changes no session state (an
    iterative scan's setting is a `SET LOCAL`; asyncpg rolls back an unfinished transaction itself).
    asyncpg's default reset (`RESET ALL`, `UNLISTEN *`, ...) would be one more round trip per read."""


async def _init_store_connection(conn: asyncpg.Connection) -> None:
    # Parameters are JSON text already (store_sql); results are parsed as the psycopg reads parse them.
    await conn.set_type_codec("jsonb", schema="pg_catalog", encoder=str, decoder=_json_loads, format="text")


def _json_loads(data: bytes | str) -> Any:
    """orjson for speed; json for what orjson refuses (integers beyond 64 bits, which jsonb allows)."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)
