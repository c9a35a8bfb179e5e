"""The store projection on real Postgres: apply semantics, dead letters, and the official layout.

Batches go through the projector's `BatchApplier` (offsets, dead letters, the isolation fallback)
without a broker; applying twice, order, isolation and replay are the projection contract
(`tests/projection_contract.py`); the projector's consumer loop is covered by `test_projector.py` and,
for the store topic, by `acceptance/test_store_e2e.py`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import psycopg
import pytest
from langgraph.store.postgres import AsyncPostgresStore
from langgraph.store.postgres.base import MIGRATIONS, VECTOR_MIGRATIONS
from psycopg.rows import dict_row

from graphledger.embeddings import HashEmbedder
from graphledger.errors import VectorIndexMismatchError
from graphledger.settings import Settings
from graphledger_server.opening.vector_index import VectorIndex
from graphledger_server.projection.migrate import migrate
from projection_helpers import migrated
from store_helpers import DIMS, T0, Applier, Log, delete, dump, put, vec

SCHEMA = "gl"


def at(ms: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)


@pytest.fixture
async def settings(fresh_database: str) -> Settings:
    """A projection without topics: the batches are applied by the test (`db` connects to it)."""
    return await migrated(Settings(postgres_dsn=fresh_database, postgres_schema=SCHEMA, store_vector_dims=DIMS))


@pytest.fixture
async def applier(db: asyncpg.Connection) -> Applier:
    return await Applier(SCHEMA).prepare(db)


async def items(db: asyncpg.Connection) -> dict[tuple[str, str], asyncpg.Record]:
    rows = await db.fetch(f"SELECT * FROM {SCHEMA}.store")
    return {(r["prefix"], r["key"]): r for r in rows}


async def vector_fields(db: asyncpg.Connection, prefix: str, key: str) -> list[str]:
    rows = await db.fetch(
        f"SELECT field_name FROM {SCHEMA}.store_vectors WHERE prefix = $1 AND key = $2 ORDER BY 1", prefix, key
    )
    return [r["field_name"] for r in rows]


# -- apply semantics -------------------------------------------------------------------------------


async def test_put_takes_its_times_from_the_event_and_an_update_keeps_created_at(
    db: asyncpg.Connection, applier: Applier
) -> None:
    log = Log()
    await applier.batch.apply(db, [log(put(["u", "1"], "k", {"a": 1}, ttl=30), T0)])
    row = (await items(db))[("u.1", "k")]
    assert (row["created_at"], row["updated_at"]) == (at(T0), at(T0))
    assert row["expires_at"] == at(T0) + timedelta(minutes=30) and row["ttl_minutes"] == 30
    assert row["value"] == '{"a": 1}'

    await applier.batch.apply(db, [log(put(["u", "1"], "k", {"a": 2}), T0 + 5_000)])
    row = (await items(db))[("u.1", "k")]
    assert (row["created_at"], row["updated_at"]) == (at(T0), at(T0 + 5_000))
    assert row["expires_at"] is None and row["ttl_minutes"] is None
    assert row["value"] == '{"a": 2}'


async def test_vectors_are_replaced_kept_or_cascaded(db: asyncpg.Connection, applier: Applier) -> None:
    log = Log()
    ns = ["docs"]
    await applier.batch.apply(db, [log(put(ns, "k", {"t": "a"}, {"t": vec(1), "tags.0": vec(0, 1)}), T0)])
    assert await vector_fields(db, "docs", "k") == ["t", "tags.0"]

    # `vectors` null (index=False): the value changes, the vectors stay, as in both official stores.
    await applier.batch.apply(db, [log(put(ns, "k", {"t": "b"}), T0 + 1)])
    assert await vector_fields(db, "docs", "k") == ["t", "tags.0"]

    # A list replaces every row: a field the new value no longer has leaves no orphan behind.
    await applier.batch.apply(db, [log(put(ns, "k", {"t": "c"}, {"t": vec(0, 0, 1)}), T0 + 2)])
    assert await vector_fields(db, "docs", "k") == ["t"]
    embedding = await db.fetchval(f"SELECT embedding::text FROM {SCHEMA}.store_vectors WHERE key = 'k'")
    assert embedding == "[0,0,1,0]"

    # An empty list removes them all; a delete removes the item and (cascade) its vectors.
    await applier.batch.apply(db, [log(put(ns, "k", {"t": "d"}, {}), T0 + 3)])
    assert await vector_fields(db, "docs", "k") == []
    await applier.batch.apply(db, [log(put(ns, "k", {"t": "e"}, {"t": vec(1)}), T0 + 4), log(delete(ns, "k"), T0 + 5)])
    assert await items(db) == {}
    assert await db.fetchval(f"SELECT count(*) FROM {SCHEMA}.store_vectors") == 0


async def test_a_put_after_a_delete_in_one_batch_starts_a_new_item(db: asyncpg.Connection, applier: Applier) -> None:
    log = Log()
    ns = ["docs"]
    await applier.batch.apply(db, [log(put(ns, "k", {"v": 1}, {"t": vec(1)}), T0)])
    # One batch: delete, then a put without vectors: created_at restarts and the old vectors are gone.
    await applier.batch.apply(db, [log(delete(ns, "k"), T0 + 10), log(put(ns, "k", {"v": 2}), T0 + 20)])
    row = (await items(db))[("docs", "k")]
    assert (row["created_at"], row["updated_at"], row["value"]) == (at(T0 + 20), at(T0 + 20), '{"v": 2}')
    assert await vector_fields(db, "docs", "k") == []


# -- dead letters ------------------------------------------------------------------------------------


async def test_a_put_with_other_dims_is_dead_lettered_and_the_partition_moves_on(
    db: asyncpg.Connection, applier: Applier
) -> None:
    log = Log(partition=2)
    batch = [
        log(put(["docs"], "good", {"t": 1}, {"t": vec(1)}), T0),
        log(put(["docs"], "bad", {"t": 2}, {"t": [1.0, 2.0, 3.0]}), T0 + 1),
        log(put(["docs"], "after", {"t": 3}, {"t": vec(0, 1)}), T0 + 2),
        log(put(["docs"], "huge", {"t": 4}, {"t": vec(1e39)}), T0 + 3),  # beyond float4
    ]
    result = await applier.batch.apply(db, batch)
    assert result.dead_letters == 2 and not result.isolated
    assert result.next_offsets == {("test.store", 2): 4}
    letter, huge = applier.dead
    assert (letter.record.offset, huge.record.offset) == (1, 3)
    assert "3-dim vectors" in letter.reason and "vector(4)" in letter.reason
    assert "beyond vector's" in huge.reason
    assert set(await items(db)) == {("docs", "good"), ("docs", "after")}
    reason = await db.fetchval(f"SELECT reason FROM {SCHEMA}.graphledger_dead_letters")
    assert "3-dim" in reason


async def test_without_a_vector_table_vectors_are_dead_lettered_and_plain_puts_apply(fresh_database: str) -> None:
    await migrate(fresh_database, SCHEMA)  # GRAPHLEDGER_STORE_VECTOR_DIMS unset
    conn = await asyncpg.connect(fresh_database)
    try:
        a = await Applier(SCHEMA).prepare(conn)
        log = Log()
        result = await a.batch.apply(
            conn,
            [
                log(put(["d"], "plain", {"x": 1}), T0),
                log(put(["d"], "cleared", {"x": 2}, {}), T0),  # index=[] with no texts: nothing to store
                log(put(["d"], "indexed", {"x": 3}, {"t": vec(1)}), T0),
                log(delete(["d"], "plain"), T0 + 1),
                log(put(["d"], "plain", {"x": 4}), T0 + 2),
            ],
        )
        assert result.dead_letters == 1
        assert "4-dim vectors" in a.dead[0].reason and "no vector table" in a.dead[0].reason
        rows = await conn.fetch(f"SELECT key, value FROM {SCHEMA}.store ORDER BY key")
        assert [(r["key"], r["value"]) for r in rows] == [("cleared", '{"x": 2}'), ("plain", '{"x": 4}')]
        assert await conn.fetchval(f"SELECT to_regclass('{SCHEMA}.store_vectors')") is None
    finally:
        await conn.close()


# -- migrations and the official layout --------------------------------------------------------------

# graphledger's own columns beside the official ones (`graphledger_ttl_minutes`, migration 0003)
# come after them and are left out: the official store neither reads nor writes them.
COLUMNS_SQL = """
SELECT table_name, ordinal_position, column_name, data_type, udt_name, is_nullable, column_default
FROM information_schema.columns
WHERE table_schema = $1 AND table_name = ANY($2::text[]) AND column_name NOT LIKE 'graphledger\\_%'
ORDER BY table_name, ordinal_position
"""

INDEXES_SQL = """
SELECT tablename, indexname, replace(replace(indexdef, $1 || '.', 'SCHEMA.'), 'public.', '') AS indexdef
FROM pg_indexes WHERE schemaname = $1 AND tablename = ANY($2::text[])
  AND indexname NOT LIKE 'graphledger\\_%'  -- our own indexes beside the official ones
ORDER BY tablename, indexname
"""

CONSTRAINTS_SQL = """
SELECT c.relname, k.contype, pg_get_constraintdef(k.oid)
FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid
WHERE k.connamespace = $1::regnamespace AND c.relname = ANY($2::text[])
ORDER BY 1, 2, 3
"""

STORE_TABLES = ["store", "store_vectors", "store_migrations", "vector_migrations"]


@asynccontextmanager
async def official_store(dsn: str, schema: str, dims: int) -> AsyncIterator[AsyncPostgresStore]:
    """The official store on `schema` (pgvector's types resolve through `public`)."""
    async with await psycopg.AsyncConnection.connect(
        dsn, autocommit=True, prepare_threshold=0, row_factory=dict_row, options=f"-c search_path={schema},public"
    ) as conn:
        yield AsyncPostgresStore(conn, index={"dims": dims, "embed": HashEmbedder(dims), "fields": ["text"]})


async def _rows(conn: asyncpg.Connection, sql: str, schema: str) -> list[tuple[Any, ...]]:
    rows = await conn.fetch(sql, schema, STORE_TABLES) if "$2" in sql else await conn.fetch(sql, schema)
    return [tuple(str(v).replace(f"{schema}.", "") for v in r.values()) for r in rows]


async def test_layout_equals_the_official_store_setup_which_then_has_nothing_to_do(fresh_database: str) -> None:
    dims = 8
    await migrate(fresh_database, SCHEMA, vectors=VectorIndex(dims))
    conn = await asyncpg.connect(fresh_database)
    try:
        await conn.execute("CREATE SCHEMA official")
        async with official_store(fresh_database, "official", dims) as store:
            await store.setup()
        for sql in (COLUMNS_SQL, INDEXES_SQL, CONSTRAINTS_SQL):
            assert await _rows(conn, sql, SCHEMA) == await _rows(conn, sql, "official")
        before = await dump(conn, SCHEMA)
        tables = await conn.fetchval("SELECT count(*) FROM information_schema.tables WHERE table_schema = $1", SCHEMA)
        async with official_store(fresh_database, SCHEMA, dims) as store:
            await store.setup()
        assert await dump(conn, SCHEMA) == before
        assert (
            await conn.fetchval("SELECT count(*) FROM information_schema.tables WHERE table_schema = $1", SCHEMA)
            == tables
        )
        assert await conn.fetchval(f"SELECT max(v) FROM {SCHEMA}.store_migrations") == len(MIGRATIONS) - 1
        assert await conn.fetchval(f"SELECT max(v) FROM {SCHEMA}.vector_migrations") == len(VECTOR_MIGRATIONS) - 1
    finally:
        await conn.close()


@pytest.mark.parametrize(
    ("first", "second", "match"),
    [
        (VectorIndex(8), VectorIndex(16), r"stores 8-dim vectors .* re-embed into a new schema"),
        (VectorIndex(8), VectorIndex(8, distance="l2"), r"built as vector\(8\), cosine distance"),
        (VectorIndex(8), VectorIndex(8, vector_type="halfvec"), r"ask for halfvec\(8\)"),
        (VectorIndex(8), VectorIndex(8, hnsw_m=24), r"m=16.*m=24"),
    ],
)
async def test_migrating_with_another_vector_shape_fails_and_changes_nothing(
    fresh_database: str, first: VectorIndex, second: VectorIndex, match: str
) -> None:
    await migrate(fresh_database, SCHEMA, vectors=first)
    assert await migrate(fresh_database, SCHEMA, vectors=first) == []  # the same shape: nothing to do
    assert await migrate(fresh_database, SCHEMA) == []  # unset dims: the table stays
    with pytest.raises(VectorIndexMismatchError, match=match):
        await migrate(fresh_database, SCHEMA, vectors=second)
    conn = await asyncpg.connect(fresh_database)
    try:
        column = await conn.fetchval(
            "SELECT format_type(atttypid, atttypmod) FROM pg_attribute "
            f"WHERE attrelid = '{SCHEMA}.store_vectors'::regclass AND attname = 'embedding'"
        )
        assert column == first.column_type
    finally:
        await conn.close()


@pytest.mark.parametrize(
    ("shape", "opclass"),
    [
        (VectorIndex(8, distance="l2", hnsw_m=8, hnsw_ef_construction=32), "vector_l2_ops"),
        (VectorIndex(8, vector_type="halfvec", distance="inner_product"), "halfvec_ip_ops"),
        (VectorIndex(8, index="flat"), None),
    ],
)
async def test_the_vector_table_follows_the_settings(
    fresh_database: str, shape: VectorIndex, opclass: str | None
) -> None:
    await migrate(fresh_database, SCHEMA, vectors=shape)
    conn = await asyncpg.connect(fresh_database)
    try:
        indexdef = await conn.fetchval(
            "SELECT indexdef FROM pg_indexes WHERE schemaname = $1 AND indexname = 'store_vectors_embedding_idx'",
            SCHEMA,
        )
        if opclass is None:
            assert indexdef is None
        else:
            assert opclass in indexdef
            if (shape.hnsw_m, shape.hnsw_ef_construction) == (16, 64):
                assert "WITH" not in indexdef  # pgvector's defaults, spelled as the official store spells them
            else:
                assert f"m='{shape.hnsw_m}', ef_construction='{shape.hnsw_ef_construction}'" in indexdef
    finally:
        await conn.close()
