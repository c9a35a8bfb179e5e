"""What the projections share to erase a subject: the names behind references, and the traces an
erased subject leaves besides its rows (dead letters, stored chunks, its `graphledger_subjects` row).

Every sealed event the projector opens records its subject (reference, kind, tenant, name) in the
batch that applies it, so an erasure event, which names the subject by reference only, finds the rows
to delete. A replay of a log whose subject was erased never opens its events and never records it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import asyncpg

from graphledger.erasure.sealing import SealedSubject
from graphledger_server.sql import render

# $1..$4 -> unnest(ref, kind, tenant, name).
RECORD_SUBJECTS_SQL = """
INSERT INTO {schema}.graphledger_subjects (ref, kind, tenant, name)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[])
ON CONFLICT (ref) DO NOTHING
"""
# $1 kind, $2 -> refs.
NAMES_SQL = "SELECT name, tenant FROM {schema}.graphledger_subjects WHERE kind = $1::text AND ref = ANY($2::text[])"
# $1 kind, $2 -> names: the tenant of each subject recorded under one of the names.
TENANTS_SQL = "SELECT name, tenant FROM {schema}.graphledger_subjects WHERE kind = $1::text AND name = ANY($2::text[])"
# $1 kind, $2 tenant.
TENANT_REFS_SQL = "SELECT ref FROM {schema}.graphledger_subjects WHERE kind = $1::text AND tenant = $2::text"
# $1 -> refs.
DELETE_TRACES_SQL = """
WITH d AS (DELETE FROM {schema}.graphledger_dead_letters WHERE subject_ref = ANY($1::text[])),
     c AS (DELETE FROM {schema}.graphledger_chunks WHERE subject_ref = ANY($1::text[]))
DELETE FROM {schema}.graphledger_subjects WHERE ref = ANY($1::text[])
"""


class ErasureStatements:
    def __init__(self, schema: str) -> None:
        self.record_subjects = render(RECORD_SUBJECTS_SQL, schema)
        self.names = render(NAMES_SQL, schema)
        self.tenant_refs = render(TENANT_REFS_SQL, schema)
        self.tenants = render(TENANTS_SQL, schema)
        self.delete_traces = render(DELETE_TRACES_SQL, schema)


async def record_subjects(conn: asyncpg.Connection, sql: ErasureStatements, subjects: Iterable[SealedSubject]) -> None:
    unique = {s.ref: s for s in subjects}
    if unique:
        rows = unique.values()
        await conn.execute(
            sql.record_subjects,
            [s.ref for s in rows],
            [s.kind for s in rows],
            [s.tenant for s in rows],
            [s.name for s in rows],
        )


async def names_of(
    conn: asyncpg.Connection, sql: ErasureStatements, kind: str, refs: Sequence[str]
) -> list[tuple[str, str]]:
    """The name and tenant of the subjects of `kind` behind `refs` (an unknown reference: nothing to erase)."""
    return [(r["name"], r["tenant"]) for r in await conn.fetch(sql.names, kind, list(refs))]


async def tenants_of(
    conn: asyncpg.Connection, sql: ErasureStatements, kind: str, names: Sequence[str]
) -> dict[str, str]:
    """The tenant of each subject named (absent: no sealed event of it was applied, so it is in the clear)."""
    return {r["name"]: r["tenant"] for r in await conn.fetch(sql.tenants, kind, list(names))}


async def tenant_refs(conn: asyncpg.Connection, sql: ErasureStatements, kind: str, tenant: str) -> list[str]:
    return [r["ref"] for r in await conn.fetch(sql.tenant_refs, kind, tenant)]


async def delete_traces(conn: asyncpg.Connection, sql: ErasureStatements, refs: Sequence[str]) -> None:
    if refs:
        await conn.execute(sql.delete_traces, list(refs))
