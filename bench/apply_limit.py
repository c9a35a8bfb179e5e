"""The projector's apply against its limit, in `make bench`'s projector apply row.

The live apply upserts into indexed tables with its offset rows in the same transaction, so no projector
can apply faster than this: the rows an apply of a backlog wrote, loaded again into a schema migrated as the
live one (every index), a transaction per batch of the projector's size (`batch_max_events`), each holding
one binary COPY per table into a temporary staging table (asyncpg `copy_records_to_table`), one
`INSERT ... SELECT ... ON CONFLICT DO NOTHING` per table from it, and the update of its offset row. The
rows are read out before the clock starts; the limit is in checkpoints per second, as the apply's rate, and
its loader runs on the stack's cores, where the projector ran (`Placement.to_stack`).
"""

from __future__ import annotations

import math
import time

import asyncpg

from bench.rebuild import COLUMNS_SQL
from graphledger.settings import Settings
from graphledger_server.projection.migrate import migrate

SCHEMA = "bench_apply_limit"
OFFSETS = "graphledger_offsets"
"""Not copied: each batch updates its own offset row instead, as the apply does."""


async def mark(dsn: str) -> int:
    """A transaction id below every transaction that starts after this call: rows whose `xmin` is above it
    were written (or last updated) later (a fresh cluster's ids stay within one epoch)."""
    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval("SELECT txid_current() % 4294967296"))
    finally:
        await conn.close()


async def staging_merge(settings: Settings, since: int) -> tuple[int, float]:
    """(checkpoints, seconds) of loading the rows the live schema's transactions after `since` wrote, as the
    module docstring says, into a fresh `SCHEMA`."""
    live = settings.postgres_schema
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        await conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        await migrate(settings.postgres_dsn, SCHEMA)
        tables = {r["table_name"]: r["columns"] for r in await conn.fetch(COLUMNS_SQL, live)}
        rows: dict[str, list[asyncpg.Record]] = {}
        merges: dict[str, str] = {}
        for table, columns in sorted(tables.items()):
            if table == OFFSETS or not await _exists(conn, SCHEMA, table):
                continue
            listed = ", ".join(f'"{c}"' for c in columns)
            found = await conn.fetch(f'SELECT {listed} FROM {live}."{table}" WHERE xmin::text::bigint > $1', since)
            if found:
                rows[table] = found
                merges[table] = (
                    f'INSERT INTO {SCHEMA}."{table}" ({listed}) SELECT {listed} FROM "stage_{table}" '
                    "ON CONFLICT DO NOTHING"
                )
                await conn.execute(
                    f'CREATE TEMP TABLE "stage_{table}" ON COMMIT DELETE ROWS AS '
                    f'SELECT {listed} FROM {SCHEMA}."{table}" WITH NO DATA'
                )
        checkpoints = len(rows.get("checkpoints", []))
        batches = max(1, math.ceil(checkpoints / settings.batch_max_events))
        offset_row = "(consumer_group, topic, partition, next_offset) VALUES ('bench', 't', 0, 0)"
        await conn.execute(f"INSERT INTO {SCHEMA}.{OFFSETS} {offset_row}")
        start = time.perf_counter()
        for b in range(batches):
            async with conn.transaction():
                for table, found in rows.items():
                    part = found[b * len(found) // batches : (b + 1) * len(found) // batches]
                    if not part:
                        continue
                    await conn.copy_records_to_table(f"stage_{table}", records=part, columns=tables[table])
                    await conn.execute(merges[table])
                await conn.execute(f"UPDATE {SCHEMA}.{OFFSETS} SET next_offset = $1 WHERE consumer_group = 'bench'", b)
        seconds = time.perf_counter() - start
        counts = ", ".join(f"{table} {len(r):,}" for table, r in sorted(rows.items(), key=lambda i: -len(i[1])))
        print(f"  apply limit: {batches} batches of rows {counts}", flush=True)
        return checkpoints, seconds
    finally:
        await conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        await conn.close()


async def _exists(conn: asyncpg.Connection, schema: str, table: str) -> bool:
    return bool(await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", f'{schema}."{table}"'))
