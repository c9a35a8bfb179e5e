"""`POST /v1/store/batch` on real Postgres: exactness against brute force, filter semantics, namespaces,
TTL, validation and errors.

The projection is filled by the store projection itself (no broker); the app runs in-process with its
lifespan. Expected answers come from independent Python models of LangGraph's store semantics: a
brute-force max-pooled similarity ranking, and `InMemoryStore._compare_values` with typed range
comparisons (docs/architecture.md, "Store").
"""

from __future__ import annotations

import json
import math
import operator
import random
import struct
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import asyncpg
import httpx
import ormsgpack
import pytest
from langgraph.store.memory import _compare_values

from graphledger.embeddings import HashEmbedder
from graphledger.settings import Settings
from graphledger.wire import CONSISTENCY_HEADER, JSON, MSGPACK
from graphledger_server.api.app import create_app
from graphledger_server.api.db import open_store_pool
from graphledger_server.api.reads import store_sql
from graphledger_server.api.reads.store_reader import StoreReader
from graphledger_server.api.store_models import SearchOp
from graphledger_server.opening.vector_index import VectorIndex, load_extension_schema, load_vector_index
from graphledger_server.projection.migrate import migrate
from read_api_helpers import api_settings
from store_helpers import Applier, delete, put, record

SCHEMA = "mem"
NO_VECTORS = "plain"
DIMS = 32
BATCH = "/v1/store/batch"
EMBED = HashEmbedder(DIMS)
T0 = int(time.time() * 1000) - 3_600_000  # an hour ago: TTLs below decide what is expired
WORDS = "pizza anchovies dog rex market stock report lyon sister river cat garden".split()


# -- the data ----------------------------------------------------------------------------------------


@dataclass
class Row:
    namespace: tuple[str, ...]
    key: str
    value: dict[str, Any]
    vectors: dict[str, list[float]]
    ts: int


def _corpus() -> list[Row]:
    """~300 items: several namespaces, 0, 1 or 2 vectors each, values to filter on."""
    rnd = random.Random(7)
    rows = []
    for i in range(300):
        namespace = ("docs", rnd.choice(["a", "b", "b_c"]), *rnd.choice([(), ("deep",)]))
        text = f"{' '.join(rnd.sample(WORDS, 3))} t{i}"
        value: dict[str, Any] = {"text": text, "n": rnd.randint(0, 20), "kind": rnd.choice(["x", "y"])}
        vectors = {"text": EMBED.embed_query(text)}
        if i % 3 == 0:
            value["title"] = f"{rnd.choice(WORDS)} title {i}"
            vectors["title"] = EMBED.embed_query(value["title"])
        if i % 10 == 0:
            vectors = {}  # written with index=False: no vectors
        rows.append(Row(namespace, f"k{i}", value, vectors, T0 + i))
    return rows


CORPUS = _corpus()

FILTER_VALUES: list[dict[str, Any]] = [
    {"a": 1}, {"a": 1.0}, {"a": 2.5}, {"a": -3}, {"a": 10}, {"a": 9}, {"a": 2**62}, {"a": "1"}, {"a": "b"},
    {"a": "Zebra"}, {"a": "éclair"}, {"a": True}, {"a": False}, {"a": None}, {}, {"a": [1, 2]}, {"a": [2, 1]},
    {"a": [1, {"x": 1, "y": 2}]}, {"a": {"x": 1, "y": {"z": "q"}}}, {"a": {"x": "1"}}, {"a": {"x": None}},
    {"a": {}}, {"b": 1}, {"a": 1, "b": 1}, {"a": {"x": 2, "w": [True]}},
]  # fmt: skip

FILTERS: list[dict[str, Any]] = [
    {"a": 1}, {"a": 1.0}, {"a": "1"}, {"a": None}, {"a": True}, {"a": 2**62}, {"a": {"$eq": 1}}, {"a": {"$ne": 1}},
    {"a": {"$ne": None}}, {"a": {"$eq": None}}, {"a": {"$gt": 1}}, {"a": {"$gte": 1, "$lt": 10}},
    {"a": {"$lte": 9.5}}, {"a": {"$gt": -3.5}}, {"a": {"$lt": "b"}}, {"a": {"$gt": "Z"}}, {"a": {"$gte": "b"}},
    {"a": {"x": 1}}, {"a": {"x": None}}, {"a": {}}, {"a": {"y": {"z": "q"}}}, {"a": {"x": {"$gte": 1}}},
    {"a": {"w": [True]}}, {"a": [1, 2]}, {"a": []}, {"a": [1, {"x": 1}]}, {"a": [{"$gt": 0}, 2]},
    {"a": {"$eq": [1, 2]}}, {"a": {"$eq": {"x": 1, "y": {"z": "q"}}}}, {"a": {"$eq": {"x": 1}}}, {"a": 1, "b": 1},
    {"b": {"$ne": 1}}, {"a": {"$ne": "b", "$gt": "a"}},
]  # fmt: skip


def _json_equal(a: Any, b: Any) -> bool:
    """JSON equality: numbers by value (1 == 1.0), and `true` is not `1`."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


_RANGE: dict[str, Callable[[Any, Any], bool]] = {
    "$gt": operator.gt,
    "$gte": operator.ge,
    "$lt": operator.lt,
    "$lte": operator.le,
}


def _operator(value: Any, op: str, operand: Any) -> bool:
    if op == "$eq":
        return _json_equal(value, operand)
    if op == "$ne":
        return not _json_equal(value, operand)
    if isinstance(operand, str):
        return isinstance(value, str) and _RANGE[op](value, operand)
    return isinstance(value, int | float) and not isinstance(value, bool) and _RANGE[op](value, operand)


def _model(value: Any, condition: Any) -> bool:
    """`InMemoryStore._compare_values`, with typed range comparisons and JSON equality."""
    if isinstance(condition, dict):
        if any(k.startswith("$") for k in condition):
            return all(_operator(value, op, x) for op, x in condition.items())
        return isinstance(value, dict) and all(_model(value.get(k), v) for k, v in condition.items())
    if isinstance(condition, list):
        return (
            isinstance(value, list)
            and len(value) == len(condition)
            and all(_model(v, c) for v, c in zip(value, condition, strict=True))
        )
    return _json_equal(value, condition)


def _matches(value: dict[str, Any], flt: dict[str, Any] | None) -> bool:
    return all(_model(value.get(k), c) for k, c in (flt or {}).items())


def _holds(x: Any, kind: type | tuple[type, ...]) -> bool:
    if isinstance(x, kind):
        return True
    if isinstance(x, dict):
        return any(_holds(v, kind) for v in x.values())
    if isinstance(x, list):
        return any(_holds(v, kind) for v in x)
    return False


def _has_range(flt: Any) -> bool:
    if isinstance(flt, dict):
        return any(k in _RANGE or _has_range(v) for k, v in flt.items())
    return isinstance(flt, list) and any(_has_range(v) for v in flt)


# -- fixtures ----------------------------------------------------------------------------------------


async def _fill(dsn: str, schema: str, rows: list[Row], *, ttl: dict[str, float] | None = None) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        applier = await Applier(schema, group=uuid.uuid4().hex).prepare(conn)
        records = [
            record(
                put(
                    r.namespace,
                    r.key,
                    r.value,
                    r.vectors if (r.vectors or schema == NO_VECTORS) else None,
                    ttl=(ttl or {}).get(r.key),
                ),
                r.ts,
                0,
                i,
            )
            for i, r in enumerate(rows)
        ]
        await applier.batch.apply(conn, records)
        assert applier.dead == []
    finally:
        await conn.close()


@pytest.fixture(scope="module")
async def projection(pg: Any) -> str:
    dsn = pg.create_database(f"t_{uuid.uuid4().hex[:12]}")
    await migrate(dsn, SCHEMA, vectors=VectorIndex(DIMS))
    await migrate(dsn, NO_VECTORS)
    filters = [Row(("filters",), f"f{i}", v, {}, T0 + i) for i, v in enumerate(FILTER_VALUES)]
    await _fill(dsn, SCHEMA, [*CORPUS, *filters])
    await _fill(dsn, NO_VECTORS, [Row(("docs",), "k", {"text": "pizza"}, {}, T0)])
    return dsn


LOG: dict[str, Any] = {}
"""The session's empty topics (`empty_log`): the read API learns from them that nothing is unprojected."""


@pytest.fixture(autouse=True, scope="module")
def _empty_log(empty_log: dict[str, Any]) -> None:
    LOG.update(empty_log)


def settings_for(dsn: str, **overrides: Any) -> Settings:
    return api_settings(dsn, LOG, SCHEMA, **{"api_pool_size": 2, **overrides})


@asynccontextmanager
async def running(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://read-api") as client:
            yield client


@pytest.fixture(scope="module")
async def api(projection: str) -> AsyncIterator[httpx.AsyncClient]:
    async with running(settings_for(projection)) as client:
        yield client


async def batch(client: httpx.AsyncClient, *ops: dict[str, Any], fmt: str = "msgpack", **headers: str) -> Any:
    if fmt == "msgpack":
        response = await client.post(
            BATCH,
            content=ormsgpack.packb({"ops": list(ops)}),
            headers={"Content-Type": MSGPACK, "Accept": MSGPACK, **headers},
        )
        body = ormsgpack.unpackb(response.content)
    else:
        response = await client.post(BATCH, json={"ops": list(ops)}, headers={"Accept": JSON, **headers})
        body = response.json()
    return response.status_code, body


async def results(client: httpx.AsyncClient, *ops: dict[str, Any]) -> list[Any]:
    status, body = await batch(client, *ops)
    assert status == 200, body
    return body["results"]


# -- vector search: exact, equal to brute force ---------------------------------------------------------


def _cosine(a: list[float], b: list[float]) -> float:
    # pgvector stores float4: compare with what it stores.
    a32 = [float(_f32(x)) for x in a]
    b32 = [float(_f32(x)) for x in b]
    dot = sum(x * y for x, y in zip(a32, b32, strict=True))
    return dot / math.sqrt(sum(x * x for x in a32) * sum(y * y for y in b32))


def _f32(x: float) -> float:
    return float(struct.unpack("f", struct.pack("f", x))[0])


def brute_force(
    query: list[float], prefix: tuple[str, ...], flt: dict[str, Any] | None, rows: list[Row] = CORPUS
) -> list[tuple[str, float | None]]:
    """Max-pooled cosine over each matching item's vectors, best first; items without vectors after,
    most recently updated first."""
    scope = [r for r in rows if r.namespace[: len(prefix)] == prefix and _matches(r.value, flt)]
    scored = [(r.key, max(_cosine(query, v) for v in r.vectors.values())) for r in scope if r.vectors]
    scored.sort(key=lambda x: -x[1])
    tail = sorted((r for r in scope if not r.vectors), key=lambda r: -r.ts)
    return [*scored, *((r.key, None) for r in tail)]


def assert_ranking(got: list[dict[str, Any]], expected: list[tuple[str, float | None]], offset: int) -> None:
    """`got` is the page at `offset` of `expected`, up to scores within float4 rounding."""
    page = expected[offset : offset + len(got)]
    assert len(got) == len(page)
    for position, item in enumerate(got, start=offset):
        score = expected[position][1]
        if score is None:
            assert item["score"] is None and item["key"] == expected[position][0]
            continue
        assert item["score"] == pytest.approx(score, abs=1e-5)
        tied = {k for k, s in expected if s is not None and abs(s - score) <= 1e-5}
        assert item["key"] in tied


SEARCHES = [
    (("docs",), None, 10, 0),
    (("docs",), None, 7, 40),
    (("docs", "b"), None, 5, 0),  # not ("docs", "b_c"): a prefix covers whole labels
    (("docs", "b_c"), {"kind": "x"}, 10, 3),
    (("docs",), {"n": {"$gte": 15}}, 200, 0),  # every match, the tail of unindexed items included
    (("docs", "a", "deep"), {"n": {"$lt": 5}, "kind": "y"}, 3, 1),
    (("docs",), {"kind": "nothing"}, 5, 0),
]


@pytest.mark.parametrize(("prefix", "flt", "limit", "offset"), SEARCHES)
async def test_query_search_is_exactly_brute_force(
    api: httpx.AsyncClient, prefix: tuple[str, ...], flt: dict[str, Any] | None, limit: int, offset: int
) -> None:
    for text in ("pizza anchovies", "river cat"):
        query = EMBED.embed_query(text)
        op = {"op": "search", "namespace_prefix": list(prefix), "filter": flt, "limit": limit, "offset": offset}
        (got,) = await results(api, {**op, "query_vector": query})
        assert_ranking(got, brute_force(query, prefix, flt), offset)
        assert len(got) == len(brute_force(query, prefix, flt)[offset : offset + limit])


async def test_the_index_path_equals_brute_force_on_small_data(projection: str) -> None:
    """Forced onto the HNSW index (no exact shortcut), with ef_search covering the whole graph, the
    index search returns what brute force returns; pages it cannot fill fall back to the exact one."""
    pool = await open_store_pool(settings_for(projection, store_hnsw_ef_search=1000))
    try:
        reader = StoreReader(pool, SCHEMA, exact_max_items=0)
        full_pages = 0
        for prefix, flt, limit, offset in SEARCHES:
            query = EMBED.embed_query("pizza market")
            op = SearchOp.model_validate(
                {
                    "op": "search",
                    "namespace_prefix": list(prefix),
                    "filter": flt,
                    "limit": limit,
                    "offset": offset,
                    "query_vector": query,
                }
            )
            (got,) = await reader.run([op])
            assert_ranking([item.to_wire() for item in got], brute_force(query, prefix, flt), offset)
            # The index statement alone, where it yields a full page, with the planner kept on the
            # HNSW index (on a table this small it would rather sort every row, which is exact anyway).
            async with pool.acquire() as conn, conn.transaction():
                await conn.execute(store_sql.ITERATIVE_SCAN_SQL)
                await conn.execute("SET LOCAL enable_seqscan = off")
                await conn.execute("SET LOCAL enable_sort = off")
                vectors = await reader._load_vectors(conn)
                assert vectors is not None
                candidates = (offset + limit) * 4
                sql, args = store_sql.vector_search_statement(
                    SCHEMA, vectors.ext, vectors.index, prefix, flt, query, limit, offset, index_scope=(0, candidates)
                )
                plan = "\n".join(row[0] for row in await conn.fetch("EXPLAIN " + sql, *args))
                assert "Index Scan using store_vectors_embedding_idx" in plan
                page = await reader._index_page(conn, op, vectors)
                if page is not None:
                    assert_ranking(page, brute_force(query, prefix, flt), offset)
                    full_pages += 1
        assert full_pages >= 4
    finally:
        await pool.close()


async def test_a_large_scopes_index_search_is_planned_once_per_connection(projection: str) -> None:
    """The page statement of a scope known to be large keeps a generic plan after Postgres's first five
    custom ones (planning every search anew cost a fifth of it, measured), in a table large enough
    that the planner scans the HNSW index, and answers as the custom plans do."""
    big = "big"
    await migrate(projection, big, vectors=VectorIndex(DIMS))
    conn = await asyncpg.connect(projection, server_settings={"search_path": big, "hnsw.ef_search": "200"})
    try:
        await conn.execute(
            f"""INSERT INTO {big}.store (prefix, key, value)
            SELECT 'docs.' || (g % 3), 'k' || g, jsonb_build_object('n', g % 20) FROM generate_series(1, 6000) g;
            INSERT INTO {big}.store_vectors (prefix, key, field_name, embedding)
            SELECT prefix, key, 'text', array(SELECT random() - 0.5 + length(key) * 0 FROM generate_series(1, {DIMS}))
            FROM {big}.store;
            ANALYZE {big}.store, {big}.store_vectors"""
        )
        index, ext = await load_vector_index(conn, big), await load_extension_schema(conn)
        assert index is not None
        for prefix, flt in ((("docs",), None), (("docs", "1"), {"n": {"$gte": 4}})):
            answers = []
            for mode in ("force_custom_plan", "auto"):
                await conn.execute(f"SET plan_cache_mode = {mode}")
                for i in range(8):
                    query = EMBED.embed_query(f"{WORDS[i]} {WORDS[-i - 1]}")
                    sql, args = store_sql.vector_search_statement(
                        big, ext, index, prefix, flt, query, 10, 0, index_scope=(-1, 10 * 2)
                    )
                    answers.append([(row["key"], row["score"]) for row in await conn.fetch(sql, *args)])
            assert answers[:8] == answers[8:]
            assert all(len(page) == 10 for page in answers)
            plans = await conn.fetchrow("SELECT generic_plans FROM pg_prepared_statements WHERE statement = $1", sql)
            assert plans is not None and plans["generic_plans"] >= 3, (prefix, flt, dict(plans or {}))
    finally:
        await conn.close()


async def test_pages_far_past_the_end_are_empty_on_every_path(projection: str) -> None:
    """An offset near Postgres's bigint limit: the page's end is clamped, not an overflow (a 500)."""
    pool = await open_store_pool(settings_for(projection, store_hnsw_ef_search=40))
    try:
        for exact_max_items in (0, 1_000):  # the HNSW index path, the exact path
            reader = StoreReader(pool, SCHEMA, exact_max_items=exact_max_items)
            for query in (None, EMBED.embed_query("pizza")):
                op = SearchOp.model_validate(
                    {
                        "op": "search",
                        "namespace_prefix": ["docs"],
                        "limit": 10,
                        "offset": 2**63 - 1,
                        "query_vector": query,
                    }
                )
                assert await reader.run([op]) == [[]]
    finally:
        await pool.close()


async def test_search_without_query_is_most_recently_updated_first(api: httpx.AsyncClient) -> None:
    expected = [r.key for r in sorted((r for r in CORPUS if r.value["kind"] == "y"), key=lambda r: -r.ts)]
    op = {"op": "search", "namespace_prefix": ["docs"], "filter": {"kind": "y"}, "limit": 25}
    pages = await results(api, {**op, "offset": 0}, {**op, "offset": 25})
    got = [i for page in pages for i in page]
    assert [i["key"] for i in got] == expected[:50]
    assert all(i["score"] is None for i in got)
    newest = max((r for r in CORPUS if r.value["kind"] == "y"), key=lambda r: r.ts)
    assert got[0]["created_at"] == got[0]["updated_at"]
    assert datetime.fromisoformat(got[0]["updated_at"]) == datetime.fromtimestamp(newest.ts / 1000, UTC)


# -- filters -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("flt", FILTERS, ids=json.dumps)
async def test_filters_follow_in_memory_store_semantics(api: httpx.AsyncClient, flt: dict[str, Any]) -> None:
    (got,) = await results(api, {"op": "search", "namespace_prefix": ["filters"], "filter": flt, "limit": 100})
    values = {f"f{i}": v for i, v in enumerate(FILTER_VALUES)}
    expected = {k for k, v in values.items() if _matches(v, flt)}
    assert {i["key"] for i in got} == expected
    # InMemoryStore agrees wherever it answers (it raises on range operators over non-numbers),
    # except where it converts a numeric string with float() ("1" > -3.5) and where Python's
    # True == 1 differs from JSON's.
    for key, value in values.items():
        if _holds(value, bool) or _holds(flt, bool) or (_has_range(flt) and _holds(value, str)):
            continue
        try:
            theirs = all(_compare_values(value.get(k), c) for k, c in flt.items())
        except (TypeError, ValueError):
            continue
        assert theirs == (key in expected), (key, value)


# -- namespaces --------------------------------------------------------------------------------------


async def test_list_namespaces(api: httpx.AsyncClient) -> None:
    def listing(**kw: Any) -> dict[str, Any]:
        return {"op": "list_namespaces", **kw}

    got = await results(
        api,
        listing(prefix=["docs"]),
        listing(prefix=["docs", "*", "deep"]),
        listing(prefix=["docs"], suffix=["deep"]),
        listing(suffix=["*", "deep"]),
        listing(prefix=["docs"], max_depth=2),
        listing(prefix=["docs"], max_depth=2, limit=1, offset=1),
        listing(prefix=["docs", "b_c"]),
        listing(prefix=["docs", "b%c"]),
        listing(prefix=["docs"], max_depth=0),
        listing(prefix=["nothing"]),
    )
    # Ordered as AsyncPostgresStore orders them: by the dot-joined text, byte-wise.
    assert got[0] == [
        ["docs", "a"], ["docs", "a", "deep"], ["docs", "b"], ["docs", "b", "deep"], ["docs", "b_c"],
        ["docs", "b_c", "deep"],
    ]  # fmt: skip
    assert got[1] == [["docs", "a", "deep"], ["docs", "b", "deep"], ["docs", "b_c", "deep"]]
    assert got[2] == got[1] == got[3]
    assert got[4] == [["docs", "a"], ["docs", "b"], ["docs", "b_c"]]
    assert got[5] == [["docs", "b"]]
    assert got[6] == [["docs", "b_c"], ["docs", "b_c", "deep"]]
    assert got[7] == []  # `%` and `_` in a label are literal
    assert got[8] == [[]]
    assert got[9] == []


# -- TTL ---------------------------------------------------------------------------------------------


async def test_expired_items_are_never_returned(projection: str, api: httpx.AsyncClient) -> None:
    rows = [
        Row(("ttl", "gone"), "expired", {"text": "pizza"}, {"text": EMBED.embed_query("pizza")}, T0),
        Row(("ttl", "kept"), "alive", {"text": "pizza"}, {"text": EMBED.embed_query("pizza")}, T0),
        Row(("ttl", "kept"), "forever", {"text": "pizza"}, {}, T0),
    ]
    # Written an hour ago: 30 minutes is over, a day is not.
    await _fill(projection, SCHEMA, rows, ttl={"expired": 30, "alive": 24 * 60})
    query = EMBED.embed_query("pizza")
    got = await results(
        api,
        {"op": "get", "namespace": ["ttl", "gone"], "key": "expired"},
        {"op": "get", "namespace": ["ttl", "kept"], "key": "alive"},
        {"op": "search", "namespace_prefix": ["ttl"]},
        {"op": "search", "namespace_prefix": ["ttl"], "query_vector": query},
        {"op": "list_namespaces", "prefix": ["ttl"]},
    )
    assert got[0] is None and got[1]["key"] == "alive"
    assert sorted(i["key"] for i in got[2]) == ["alive", "forever"]
    assert [(i["key"], i["score"] is None) for i in got[3]] == [("alive", False), ("forever", True)]
    assert got[4] == [["ttl", "kept"]]


# -- errors ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "field"),
    [
        ({"op": "fetch", "key": "k"}, "ops.0"),
        ({"op": "get", "namespace": ["a.b"], "key": "k"}, "ops.0.get.namespace.0"),
        ({"op": "get", "namespace": [""], "key": "k"}, "ops.0.get.namespace.0"),
        ({"op": "get", "namespace": ["a"], "key": "k\x00"}, "ops.0.get.key"),
        ({"op": "get", "namespace": ["a"], "key": "k", "extra": 1}, "ops.0.get.extra"),
        ({"op": "search", "namespace_prefix": ["a"], "limit": -1}, "ops.0.search.limit"),
        ({"op": "search", "namespace_prefix": ["a"], "offset": 1.5}, "ops.0.search.offset"),
        ({"op": "search", "namespace_prefix": ["a"], "filter": {"n": {"$gt": 1, "$foo": 2}}}, "$foo"),
        ({"op": "search", "namespace_prefix": ["a"], "filter": {"n": {"$gt": None}}}, "filter.n.$gt"),
        ({"op": "search", "namespace_prefix": ["a"], "filter": {"n": {"$lt": [1]}}}, "filter.n.$lt"),
        ({"op": "search", "namespace_prefix": ["a"], "filter": {"n": "\x00"}}, "filter.n"),
        ({"op": "search", "namespace_prefix": ["a"], "query_vector": []}, "ops.0.search.query_vector"),
        ({"op": "search", "namespace_prefix": ["a"], "query_vector": [1.0, float("nan")]}, "query_vector"),
        ({"op": "list_namespaces", "max_depth": -1}, "ops.0.list_namespaces.max_depth"),
        ({"op": "list_namespaces", "prefix": ["a", "b.c"]}, "ops.0.list_namespaces.prefix.1"),
    ],
)
async def test_bad_ops_are_a_422_naming_the_field(api: httpx.AsyncClient, op: dict[str, Any], field: str) -> None:
    status, body = await batch(api, {"op": "get", "namespace": ["a"], "key": "fine"}, op)
    assert status == 422, body
    assert body["error"] == "invalid_request"
    assert field.replace("ops.0", "ops.1") in body["message"] or field in body["message"], body["message"]


async def test_a_query_vector_of_other_dims_is_a_400_naming_them(api: httpx.AsyncClient) -> None:
    status, body = await batch(api, {"op": "search", "namespace_prefix": ["docs"], "query_vector": [0.5] * 3})
    assert status == 400 and body["error"] == "query_vector_dims"
    assert "3 dims" in body["message"] and f"{DIMS}" in body["message"] and "ops.0.query_vector" in body["message"]


async def test_a_query_without_a_vector_table_is_a_400(projection: str) -> None:
    async with running(settings_for(projection, postgres_schema=NO_VECTORS)) as client:
        status, body = await batch(client, {"op": "search", "namespace_prefix": ["docs"], "query_vector": [1.0]})
        assert status == 400 and body["error"] == "no_vector_index"
        # Everything else works without one.
        (got,) = await results(client, {"op": "search", "namespace_prefix": ["docs"]})
        assert [i["key"] for i in got] == ["k"]


async def test_json_and_msgpack_answer_the_same(api: httpx.AsyncClient) -> None:
    ops = [
        {"op": "get", "namespace": ["docs", "a"], "key": "k1"},
        {"op": "search", "namespace_prefix": ["docs"], "query_vector": EMBED.embed_query("dog"), "limit": 3},
        {"op": "list_namespaces", "prefix": ["docs"], "max_depth": 2},
    ]
    _, as_msgpack = await batch(api, *ops)
    _, as_json = await batch(api, *ops, fmt="json")
    assert as_msgpack == as_json


async def test_the_consistency_header_is_honoured(projection: str, filled_log: dict[str, Any]) -> None:
    settings = settings_for(projection, consistency_timeout_s=2, **filled_log)
    token = {CONSISTENCY_HEADER: f"{settings.store_topic}:0:5"}
    async with running(settings) as client:
        op = {"op": "get", "namespace": ["docs"], "key": "k"}
        status, body = await batch(client, op, **{CONSISTENCY_HEADER: "nonsense"})
        assert status == 400 and body["error"] == "invalid_consistency_token"
        status, body = await batch(client, op, **token)
        assert status == 503 and body["error"] == "consistency_timeout" and body["retryable"]
        conn = await asyncpg.connect(projection)
        try:
            # The projector's progress for that partition, as a batch commit writes and announces it.
            await conn.execute(
                f"INSERT INTO {SCHEMA}.graphledger_offsets (consumer_group, topic, partition, next_offset) "
                "VALUES ($1, $2, 0, 6)",
                settings.projector_group_id,
                settings.store_topic,
            )
            await conn.execute("SELECT pg_notify('graphledger_applied', $1)", SCHEMA)
        finally:
            await conn.close()
        status, body = await batch(client, op, **token)
        assert status == 200, body


async def test_openapi_documents_the_store_batch(api: httpx.AsyncClient) -> None:
    schema = (await api.get("/openapi.json")).json()
    post = schema["paths"][BATCH]["post"]
    assert set(post["requestBody"]["content"]) == {JSON, MSGPACK}
    assert {"400", "422", "503"} <= set(post["responses"])


async def test_deleted_items_and_their_vectors_are_gone(projection: str, api: httpx.AsyncClient) -> None:
    conn = await asyncpg.connect(projection)
    try:
        applier = await Applier(SCHEMA, group=uuid.uuid4().hex).prepare(conn)
        vector = EMBED.embed_query("garden")
        await applier.batch.apply(conn, [record(put(["gone"], "k", {"text": "garden"}, {"text": vector}), T0, 1, 0)])
        (found,) = await results(api, {"op": "search", "namespace_prefix": ["gone"], "query_vector": vector})
        assert [i["key"] for i in found] == ["k"]
        await applier.batch.apply(conn, [record(delete(["gone"], "k"), T0 + 1, 1, 1)])
        assert await conn.fetchval(f"SELECT count(*) FROM {SCHEMA}.store_vectors WHERE prefix = 'gone'") == 0
    finally:
        await conn.close()
    got = await results(
        api,
        {"op": "get", "namespace": ["gone"], "key": "k"},
        {"op": "search", "namespace_prefix": ["gone"], "query_vector": vector},
    )
    assert got == [None, []]
