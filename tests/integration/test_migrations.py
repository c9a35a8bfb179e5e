"""Migrations: idempotent, safe from two processes at once, and the official saver's exact layout."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.postgres.base import MIGRATIONS

from graphledger_server.projection.migrate import load_migrations, migrate
from projection_helpers import official_saver

OFFICIAL_TABLES = ("checkpoint_migrations", "checkpoints", "checkpoint_blobs", "checkpoint_writes")
OUR_TABLES = (
    "graphledger_migrations",
    "graphledger_offsets",
    "graphledger_thread_partitions",
    "graphledger_chunks",
    "graphledger_dead_letters",
    "graphledger_imports",  # 0005
    "graphledger_forks",  # 0007
    "graphledger_subjects",  # 0008
    "graphledger_thread_copies",  # 0008
    "graphledger_copy_stages",  # 0010
    "graphledger_staged_checkpoints",  # 0010
    "graphledger_staged_blobs",  # 0010
    "graphledger_staged_writes",  # 0010
    "graphledger_parked_subjects",  # 0011
    "graphledger_held_records",  # 0011
    "graphledger_record_verdicts",  # 0011
    "graphledger_key_filter",  # 0012
    "graphledger_thread_ledgers",  # 0013
    "graphledger_thread_leads",  # 0013
    "graphledger_refusals",  # 0013
)
# 0002_store: the store projection (its vector table only when configured: test_store_projection.py).
STORE_TABLES = ("store", "store_migrations", "graphledger_store_index")

COLUMNS_SQL = """
SELECT table_name, ordinal_position, column_name, data_type, is_nullable, column_default
FROM information_schema.columns
WHERE table_schema = $1 AND table_name = ANY($2::text[])
ORDER BY table_name, ordinal_position
"""

INDEXES_SQL = """
SELECT tablename, indexname, replace(indexdef, $1 || '.', 'SCHEMA.') AS indexdef
FROM pg_indexes WHERE schemaname = $1 AND tablename = ANY($2::text[])
ORDER BY tablename, indexname
"""


async def _rows(dsn: str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    conn = await asyncpg.connect(dsn)
    try:
        return [tuple(r) for r in await conn.fetch(sql, *args)]
    finally:
        await conn.close()


async def test_concurrent_migrations_apply_each_version_once(fresh_database: str) -> None:
    results = await asyncio.gather(migrate(fresh_database, "gl"), migrate(fresh_database, "gl"))
    versions = [m.version for m in load_migrations()]
    assert sorted(results[0] + results[1]) == versions  # one call applied them, the other waited
    assert await migrate(fresh_database, "gl") == []
    recorded = await _rows(fresh_database, "SELECT version FROM gl.graphledger_migrations ORDER BY version")
    assert [r[0] for r in recorded] == versions
    assert await _rows(fresh_database, "SELECT extname FROM pg_extension WHERE extname = 'vector'") == [("vector",)]
    tables = await _rows(
        fresh_database, "SELECT table_name FROM information_schema.tables WHERE table_schema = 'gl' ORDER BY 1"
    )
    assert {t[0] for t in tables} == set(OFFICIAL_TABLES + OUR_TABLES + STORE_TABLES)


async def test_layout_equals_the_official_saver_setup(fresh_database: str) -> None:
    await migrate(fresh_database, "gl")
    await _rows(fresh_database, "CREATE SCHEMA official")
    async with official_saver(fresh_database, "official") as saver:
        await saver.setup()
    for sql in (COLUMNS_SQL, INDEXES_SQL):
        ours = await _rows(fresh_database, sql, "gl", list(OFFICIAL_TABLES))
        theirs = await _rows(fresh_database, sql, "official", list(OFFICIAL_TABLES))
        assert ours == theirs
    migrations = "SELECT v FROM {}.checkpoint_migrations ORDER BY v"
    assert await _rows(fresh_database, migrations.format("gl")) == await _rows(
        fresh_database, migrations.format("official")
    )


async def test_official_saver_setup_is_a_noop_and_it_reads_and_writes(fresh_database: str) -> None:
    await migrate(fresh_database, "gl")
    async with official_saver(fresh_database, "gl") as saver:
        await saver.setup()
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"inline": 1, "blob": ["a", "b"]}
        checkpoint["channel_versions"] = {"inline": "1", "blob": "1"}
        config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
        saved = await saver.aput(config, checkpoint, {"source": "input", "step": -1}, {"inline": "1", "blob": "1"})
        await saver.aput_writes(saved, [("blob", ["c"])], "task-1", "path")
        got = await saver.aget_tuple({"configurable": {"thread_id": "t"}})
        assert got is not None
        assert got.checkpoint["channel_values"] == {"inline": 1, "blob": ["a", "b"]}
        assert got.pending_writes == [("task-1", "blob", ["c"])]
    count = await _rows(fresh_database, "SELECT count(*) FROM gl.checkpoint_migrations")
    assert count == [(len(MIGRATIONS),)]


async def test_a_schema_name_that_is_not_an_identifier_is_refused(fresh_database: str) -> None:
    with pytest.raises(ValueError, match="not a lower-case SQL identifier"):
        await migrate(fresh_database, "gl; DROP TABLE x")


async def test_partitions_applied_before_the_key_filter_existed_are_marked_not_covered(fresh_database: str) -> None:
    """0012 on a projection with progress: the filter lacks the keys of what was applied, so those rows say
    so; a partition first applied afterwards starts covered."""
    await migrate(fresh_database, "gl")
    conn = await asyncpg.connect(fresh_database)
    try:
        await conn.execute("ALTER TABLE gl.graphledger_offsets DROP COLUMN key_filter_complete")
        await conn.execute("DROP TABLE gl.graphledger_key_filter")
        await conn.execute("DELETE FROM gl.graphledger_migrations WHERE version = 12")
        insert = (
            "INSERT INTO gl.graphledger_offsets (consumer_group, topic, partition, next_offset) VALUES ($1, $2, $3, $4)"
        )
        await conn.execute(insert, "g", "t", 0, 500)
        assert await migrate(fresh_database, "gl") == [12]
        await conn.execute(insert, "g", "t", 1, 0)
        rows = await conn.fetch("SELECT partition, key_filter_complete FROM gl.graphledger_offsets ORDER BY 1")
        assert [tuple(r) for r in rows] == [(0, False), (1, True)]
    finally:
        await conn.close()
