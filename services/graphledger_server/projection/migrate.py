"""Schema migrations: numbered SQL files in `migrations/`, applied once each, in order.

A file `NNNN_name.sql` is version NNNN; `{schema}` in it becomes the projection schema. Applied
versions are recorded in `{schema}.graphledger_migrations`. Everything runs in one transaction
behind an advisory lock keyed on the schema, so two processes migrating at once (two projector
replicas starting together) serialize: the second waits, then finds nothing left to do.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from importlib import resources

import asyncpg
from langgraph.checkpoint.postgres.base import MIGRATIONS as OFFICIAL_MIGRATIONS
from langgraph.store.postgres.base import MIGRATIONS as OFFICIAL_STORE_MIGRATIONS

from graphledger_server.opening.vector_index import VectorIndex, ensure_vector_index
from graphledger_server.sql import XACT_LOCK_SQL, check_schema, lock_key, render

log = logging.getLogger(__name__)

_FILE_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")

# langgraph-checkpoint-postgres migrations whose end state 0001_checkpoints.sql creates. When the
# dependency adds one, a test fails here rather than `setup()` being skipped over a changed layout.
OFFICIAL_MIGRATIONS_MIRRORED = 10
# The same for the store's migrations, whose end state 0002_store.sql creates.
OFFICIAL_STORE_MIGRATIONS_MIRRORED = 4

# One key for every schema: CREATE EXTENSION is per database, and two schemas migrating at once
# would otherwise race on it.
_EXTENSION_LOCK_KEY = "graphledger:extensions"

CREATE_SCHEMA_SQL = "CREATE SCHEMA IF NOT EXISTS {schema}"

# pgvector: the store projection's `store_vectors` needs it; the embedded Postgres ships it.
CREATE_EXTENSIONS_SQL = "CREATE EXTENSION IF NOT EXISTS vector"

CREATE_MIGRATIONS_TABLE_SQL = """
CREATE TABLE IF NOT EXISTS {schema}.graphledger_migrations (
    version INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
)
"""

APPLIED_VERSIONS_SQL = "SELECT version FROM {schema}.graphledger_migrations"

RECORD_MIGRATION_SQL = "INSERT INTO {schema}.graphledger_migrations (version, name) VALUES ($1::int, $2::text)"

# $1 -> generate_series(0, $1 - 1): every official migration version, so `setup()` finds none to run.
FILL_OFFICIAL_MIGRATIONS_SQL = """
INSERT INTO {schema}.checkpoint_migrations (v)
SELECT generate_series(0, $1::int - 1)
ON CONFLICT (v) DO NOTHING
"""

FILL_OFFICIAL_STORE_MIGRATIONS_SQL = """
INSERT INTO {schema}.store_migrations (v)
SELECT generate_series(0, $1::int - 1)
ON CONFLICT (v) DO NOTHING
"""


@dataclass(frozen=True, slots=True)
class Migration:
    """One numbered SQL file."""

    version: int
    name: str
    sql: str


def load_migrations() -> list[Migration]:
    """The packaged migration files, ordered by version; duplicate versions are a packaging error."""
    found: dict[int, Migration] = {}
    for entry in resources.files("graphledger_server.projection").joinpath("migrations").iterdir():
        match = _FILE_NAME.match(entry.name)
        if not match:
            continue
        version = int(match.group(1))
        if version in found:
            raise RuntimeError(f"two migrations share version {version}: {found[version].name}, {entry.name}")
        found[version] = Migration(version, match.group(2), entry.read_text(encoding="utf-8"))
    return [found[v] for v in sorted(found)]


async def migrate(dsn: str, schema: str, *, vectors: VectorIndex | None = None) -> list[int]:
    """Bring `schema` up to the newest migration; returns the versions applied by this call.

    `vectors` (`VectorIndex.from_settings`) creates the store's vector table if the schema has none,
    or checks that the one it has is of that shape (`VectorIndexMismatchError` otherwise).
    """
    check_schema(schema)
    if len(OFFICIAL_MIGRATIONS) != OFFICIAL_MIGRATIONS_MIRRORED:
        raise RuntimeError(
            f"langgraph-checkpoint-postgres has {len(OFFICIAL_MIGRATIONS)} migrations; graphledger's "
            f"checkpoint tables mirror {OFFICIAL_MIGRATIONS_MIRRORED}. Add a graphledger migration first."
        )
    if len(OFFICIAL_STORE_MIGRATIONS) != OFFICIAL_STORE_MIGRATIONS_MIRRORED:
        raise RuntimeError(
            f"langgraph-checkpoint-postgres has {len(OFFICIAL_STORE_MIGRATIONS)} store migrations; graphledger's "
            f"store table mirrors {OFFICIAL_STORE_MIGRATIONS_MIRRORED}. Add a graphledger migration first."
        )
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            await conn.execute(XACT_LOCK_SQL, lock_key(f"graphledger:migrate:{schema}"))
            await conn.execute(XACT_LOCK_SQL, lock_key(_EXTENSION_LOCK_KEY))
            await conn.execute(render(CREATE_SCHEMA_SQL, schema))
            await conn.execute(CREATE_EXTENSIONS_SQL)
            await conn.execute(render(CREATE_MIGRATIONS_TABLE_SQL, schema))
            done = {r["version"] for r in await conn.fetch(render(APPLIED_VERSIONS_SQL, schema))}
            applied = []
            for migration in load_migrations():
                if migration.version in done:
                    continue
                log.info("applying migration %04d_%s to schema %s", migration.version, migration.name, schema)
                await conn.execute(render(migration.sql, schema))
                await conn.execute(render(RECORD_MIGRATION_SQL, schema), migration.version, migration.name)
                applied.append(migration.version)
            await conn.execute(render(FILL_OFFICIAL_MIGRATIONS_SQL, schema), len(OFFICIAL_MIGRATIONS))
            await conn.execute(render(FILL_OFFICIAL_STORE_MIGRATIONS_SQL, schema), len(OFFICIAL_STORE_MIGRATIONS))
            if await ensure_vector_index(conn, schema, vectors):
                assert vectors is not None
                log.info("created the store's vector table in schema %s: %s", schema, vectors.describe())
        return applied
    finally:
        await conn.close()
