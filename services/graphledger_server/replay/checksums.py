"""Row counts and content checksums of the projection tables, to compare a rebuild with the live schema.

The checksum of a table is the sum, as `numeric`, of a 64-bit hash of each row's text form
(`hashtextextended(t::text, 0)`): order-independent, so no sort, one sequential scan per table, and
it covers every column (jsonb in its canonical text, bytea in hex, vectors as pgvector prints them).
Equal counts and sums for every table mean equal contents up to a 64-bit hash collision.
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from graphledger_server.sql import render

TABLES = (
    "checkpoints",
    "checkpoint_blobs",
    "checkpoint_writes",
    "store",
    "store_vectors",
    "graphledger_thread_partitions",
    "graphledger_thread_ledgers",
    "graphledger_thread_leads",
    "graphledger_thread_copies",
    "graphledger_subjects",
    "graphledger_copy_stages",
    "graphledger_staged_checkpoints",
    "graphledger_staged_blobs",
    "graphledger_staged_writes",
    "graphledger_parked_subjects",
    "graphledger_held_records",
)
"""Every table a projection event writes, the one-writer rule's state (its ledgers and leads: a rebuild
decides the next writes as the live schema would), and the parked subjects with the records they hold
(chunks, dead letters, verdicts, forks and refusals are bookkeeping, not projection)."""

EXISTS_SQL = "SELECT to_regclass($1::text) IS NOT NULL"
CHECKSUM_SQL = """
SELECT count(*) AS rows, coalesce(sum(hashtextextended(t::text, 0)::numeric), 0)::text AS checksum
FROM {schema}.{table} t
"""


@dataclass(frozen=True, slots=True)
class TableSum:
    rows: int
    checksum: str


@dataclass(frozen=True, slots=True)
class TableCheck:
    table: str
    live: TableSum | None
    rebuilt: TableSum | None
    """None: the schema has no such table (store_vectors without a vector index)."""

    @property
    def equal(self) -> bool:
        return self.live == self.rebuilt

    def describe(self) -> str:
        def show(s: TableSum | None) -> str:
            return "absent" if s is None else f"{s.rows} rows, checksum {s.checksum}"

        verdict = "equal" if self.equal else "DIFFERENT"
        return f"{self.table}: {verdict} (live {show(self.live)}; rebuilt {show(self.rebuilt)})"


async def table_sum(conn: asyncpg.Connection, schema: str, table: str) -> TableSum | None:
    if not await conn.fetchval(EXISTS_SQL, f"{schema}.{table}"):
        return None
    row = await conn.fetchrow(render(CHECKSUM_SQL, schema).replace("{table}", table))
    return TableSum(row["rows"], row["checksum"])


async def compare(conn: asyncpg.Connection, live: str, rebuilt: str) -> list[TableCheck]:
    """Every projection table of both schemas, summed on `conn` (the caller holds the live one still)."""
    return [TableCheck(t, await table_sum(conn, live, t), await table_sum(conn, rebuilt, t)) for t in TABLES]
