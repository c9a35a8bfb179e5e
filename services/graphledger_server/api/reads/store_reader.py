"""Runs the ops of one `/v1/store/batch` request on one pooled connection.

Gets are answered together by one statement. A search with a query vector is exact (every vector of
every matching item scored) when at most `exact_max_items` items match its namespace prefix and
filter (a capped count decides, in the same statement as the index search), so small namespaces (one
user's memories) get exact answers, identical to a brute-force search. Larger scopes use the HNSW
index: the nearest vector rows of matching items, max-pooled per item. When those do not fill the
requested page (a selective filter, a page deep into the ranking), the index scan is retried with
pgvector's strict-order iterative scan, which continues past the rows the filter rejected; when even
that falls short (items without vectors needed for the tail), the exact search answers, so the
index never drops an item that should be on the page.

The reads run on asyncpg (its own pool, `db.open_store_pool`): 0.1 ms less per statement than
psycopg, measured, most of what a search at concurrency 1 can still lose; the checkpoint reads keep
psycopg for the official saver's queries. `ef_search` is a session setting of every pooled connection
(set when it connects); an iterative scan is switched on for its one statement (`SET LOCAL` in a
transaction). The count that picks exact or index search is remembered for a few seconds per scope
(`scope_verdicts`).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, assert_never

import asyncpg

from graphledger.answers import ItemAnswer, SearchItemAnswer, StoreResult
from graphledger_server.api.errors import ApiError, unavailable
from graphledger_server.api.reads import store_sql
from graphledger_server.api.reads.scope_verdicts import ScopeVerdicts, scope_key
from graphledger_server.api.store_models import GetOp, ListNamespacesOp, SearchOp
from graphledger_server.driver_errors import Verdict, verdict_of
from graphledger_server.opening.vector_index import VectorIndex, load_extension_schema, load_vector_index
from graphledger_server.sql import render
from graphledger_server.telemetry import api as telemetry

log = logging.getLogger(__name__)

EXACT_SEARCH_MAX_ITEMS = 1_000
"""Searches whose namespace prefix holds at most this many items are answered exactly."""
INDEX_CANDIDATES_PER_ITEM = 4
"""Vector rows fetched from the index per item of the page while the table statistics are unknown."""
STATISTICS_REFRESH_S = 60.0


@dataclass(frozen=True, slots=True)
class _Vectors:
    index: VectorIndex
    ext: str


class StoreReader:
    """The store's read path for one API process; remembers the schema's vector table once seen."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        schema: str,
        *,
        acquire_timeout_s: float | None = None,
        exact_max_items: int = EXACT_SEARCH_MAX_ITEMS,
    ) -> None:
        self.pool = pool
        self.schema = schema
        self.acquire_timeout_s = acquire_timeout_s
        """How long a read waits for a pooled connection (None: as long as it takes) before its 503."""
        self.exact_max_items = exact_max_items
        self._vectors: _Vectors | None = None
        self._scopes = ScopeVerdicts()
        """Scope -> whether more than exact_max_items items match."""
        self._iterating = ScopeVerdicts()
        """Scopes whose nearest ef_search rows lately came up short of a page."""
        self._statistics_sql = render(store_sql.STATISTICS_SQL, schema)
        self._per_item = INDEX_CANDIDATES_PER_ITEM
        self._per_item_until = 0.0

    async def run(
        self, ops: Sequence[GetOp | SearchOp | ListNamespacesOp], searches: list[tuple[str, float]] | None = None
    ) -> list[StoreResult]:
        """The results of `ops`, in order (no transaction: each statement is one consistent read). Each
        search's mode and seconds go to the latency metric, or to `searches` for a caller that records
        them only if it keeps the answer (`telemetry.store_searches`)."""
        try:
            async with self.pool.acquire(timeout=self.acquire_timeout_s) as conn:
                return await self._run(conn, ops, searches)
        except Exception as exc:
            # An unreachable, restarting or overloaded Postgres (connecting, a pool that has no
            # connection in time, a connection lost mid-statement): a retryable 503, as on the
            # checkpoint reads.
            if verdict_of(exc) is not Verdict.RETRY:
                raise
            log.warning("postgres unavailable for a store read: %s", exc)
            # Idle connections an outage broke fail only when used: replace them all now, so one read
            # after Postgres returns is answered 503, not one per stale connection.
            await self.pool.expire_connections()
            raise unavailable("postgres_unavailable", "the projection database is unreachable; retry") from None

    async def _run(
        self,
        conn: asyncpg.Connection,
        ops: Sequence[GetOp | SearchOp | ListNamespacesOp],
        searches: list[tuple[str, float]] | None,
    ) -> list[StoreResult]:
        results: list[StoreResult] = [None] * len(ops)
        vectors = await self._check_queries(conn, ops)
        gets = [(i, op) for i, op in enumerate(ops) if isinstance(op, GetOp)]
        if gets:
            await self._gets(conn, gets, results)
        for i, op in enumerate(ops):
            match op:
                case GetOp():
                    pass  # answered together above
                case SearchOp():
                    ranked = op.query_vector is not None and vectors is not None
                    started = time.perf_counter()
                    results[i] = await self._search(conn, op, vectors)
                    timed = ("vector" if ranked else "filter", time.perf_counter() - started)
                    if searches is None:
                        telemetry.store_searches([timed])
                    else:
                        searches.append(timed)
                case ListNamespacesOp():
                    results[i] = await self._list_namespaces(conn, op)
                case _:
                    assert_never(op)
        return results

    # -- vector table ----------------------------------------------------------------------------

    async def _check_queries(self, conn: asyncpg.Connection, ops: Sequence[Any]) -> _Vectors | None:
        """The vector table, if any search has a query vector; 400 when it cannot be answered."""
        queries = [(i, op.query_vector) for i, op in enumerate(ops) if isinstance(op, SearchOp) and op.query_vector]
        if not queries:
            return None
        vectors = self._vectors or await self._load_vectors(conn)
        for i, query in queries:
            if vectors is None:
                raise ApiError(
                    400,
                    "no_vector_index",
                    f"ops.{i}.query_vector: the projection has no vector table (it was migrated without "
                    "GRAPHLEDGER_STORE_VECTOR_DIMS), so a search cannot rank by similarity",
                )
            if len(query) != vectors.index.dims:
                raise ApiError(
                    400,
                    "query_vector_dims",
                    f"ops.{i}.query_vector has {len(query)} dims; the store's vectors have {vectors.index.dims} "
                    f"(store_vectors.embedding {vectors.index.column_type}): embed queries with the writers' embedder",
                )
        return vectors

    async def _load_vectors(self, conn: asyncpg.Connection) -> _Vectors | None:
        # Not cached while absent: a migration may add the table while this process runs.
        index = await load_vector_index(conn, self.schema)
        if index is None:
            return None
        self._vectors = _Vectors(index, await load_extension_schema(conn))
        return self._vectors

    # -- ops -------------------------------------------------------------------------------------

    async def _gets(self, conn: asyncpg.Connection, gets: list[tuple[int, GetOp]], results: list[StoreResult]) -> None:
        wanted = [(".".join(op.namespace), op.key) for _, op in gets]
        rows = await _fetch(conn, store_sql.get_statement(self.schema, list(dict.fromkeys(wanted))))
        found = {(row["prefix"], row["key"]): _item(row) for row in rows}
        for (i, _), item in zip(gets, wanted, strict=True):
            results[i] = found.get(item)

    async def _search(self, conn: asyncpg.Connection, op: SearchOp, vectors: _Vectors | None) -> list[SearchItemAnswer]:
        if op.limit == 0:
            return []
        if op.query_vector is None or vectors is None:
            statement = store_sql.search_statement(self.schema, op.namespace_prefix, op.filter, op.limit, op.offset)
            return [_search_item(row) for row in await _fetch(conn, statement)]
        if vectors.index.index == "hnsw":
            page = await self._index_page(conn, op, vectors)
            if page is not None:
                return [_search_item(r) for r in page]
        return [_search_item(r) for r in await _fetch(conn, self._vector_search(op, vectors))]

    async def _index_page(self, conn: asyncpg.Connection, op: SearchOp, vectors: _Vectors) -> list[Any] | None:
        """The page from the HNSW index; None when few items match or the index cannot fill it.

        The nearest `ef_search` rows come first: they fill the page unless the filter or the
        namespace rejects most of them. When they do not, the scan is repeated iteratively, and the
        scope (namespace prefix and filter) starts iterating for the next searches while that is
        remembered: a selective filter pays one wasted attempt per 10 s, not one per search.
        """
        scope = scope_key(op.namespace_prefix, op.filter)
        large = self._scopes.get(scope)
        if large is False:
            return None
        # A known-large scope is not counted again (exact_max -1: the statement without the count).
        exact_max = -1 if large else self.exact_max_items
        for iterate in (True,) if self._iterating.get(scope) else (False, True):
            rows = await self._index_rows(conn, op, vectors, iterate, exact_max)
            if exact_max >= 0:
                self._scopes.put(scope, rows[0]["large"])
                if not rows[0]["large"]:
                    return None
                exact_max = -1
            page = [row for row in rows if row["key"] is not None]
            if len(page) == op.limit:
                return page
            if not iterate:
                self._iterating.put(scope, True)
        return None

    async def _index_rows(
        self, conn: asyncpg.Connection, op: SearchOp, vectors: _Vectors, iterate: bool, exact_max: int
    ) -> list[Any]:
        """The index search's rows; with `iterate`, pgvector's strict-order iterative scan for this
        statement only (the session's default is off)."""
        index_scope = (exact_max, (op.offset + op.limit) * await self._candidates_per_item(conn))
        statement = self._vector_search(op, vectors, index_scope=index_scope)
        if not iterate:
            return await _fetch(conn, statement)
        async with conn.transaction(readonly=True):
            await conn.execute(store_sql.ITERATIVE_SCAN_SQL)
            return await _fetch(conn, statement)

    async def _candidates_per_item(self, conn: asyncpg.Connection) -> int:
        """Vector rows to fetch from the index per item of a page: twice the average item's (an item
        has a row per embedded field, and a page needs distinct items), from the planner's
        statistics, read once a minute. Too few only costs the iterative or exact search."""
        now = time.monotonic()
        if now >= self._per_item_until:
            self._per_item = _per_item(await conn.fetchrow(self._statistics_sql))
            self._per_item_until = now + STATISTICS_REFRESH_S
        return self._per_item

    def _vector_search(
        self, op: SearchOp, vectors: _Vectors, *, index_scope: tuple[int, int] | None = None
    ) -> store_sql.Statement:
        """The index search (`index_scope`: see `store_sql.vector_search_statement`), else the exact one."""
        assert op.query_vector is not None
        return store_sql.vector_search_statement(
            self.schema,
            vectors.ext,
            vectors.index,
            op.namespace_prefix,
            op.filter,
            op.query_vector,
            op.limit,
            op.offset,
            index_scope=index_scope,
        )

    async def _list_namespaces(self, conn: asyncpg.Connection, op: ListNamespacesOp) -> list[list[str]]:
        statement = store_sql.list_namespaces_statement(
            self.schema, op.prefix, op.suffix, op.max_depth, op.limit, op.offset
        )
        return [list(row["labels"]) for row in await _fetch(conn, statement)]


async def _fetch(conn: asyncpg.Connection, statement: store_sql.Statement) -> list[asyncpg.Record]:
    sql, args = statement
    return await conn.fetch(sql, *args)


def _per_item(statistics: Any) -> int:
    if statistics is None or statistics["items"] <= 0 or statistics["vectors"] < 0:
        return INDEX_CANDIDATES_PER_ITEM
    return 2 * max(1, math.ceil(statistics["vectors"] / statistics["items"]))


def _item(row: Any) -> ItemAnswer:
    return ItemAnswer(*_item_fields(row))


def _search_item(row: Any) -> SearchItemAnswer:
    return SearchItemAnswer(*_item_fields(row), row["score"])


def _item_fields(row: Any) -> tuple[list[str], str, Any, str, str, str | None]:
    """An item's fields as the read API answers them, from its row of `store`."""
    expires_at = None if row["expires_at"] is None else row["expires_at"].isoformat()
    return (
        row["prefix"].split("."),
        row["key"],
        row["value"],
        row["created_at"].isoformat(),
        row["updated_at"].isoformat(),
        expires_at,
    )
