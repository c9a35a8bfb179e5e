"""The migration files: one graphledger migration for each of the official saver's, numbered from 1.
Applying them is `integration/test_migrations.py`."""

from __future__ import annotations

from langgraph.checkpoint.postgres.base import MIGRATIONS

from graphledger_server.projection.migrate import OFFICIAL_MIGRATIONS_MIRRORED, load_migrations


def test_the_sql_files_mirror_every_official_migration() -> None:
    # A new official migration must get a graphledger migration before the dependency pin moves.
    assert len(MIGRATIONS) == OFFICIAL_MIGRATIONS_MIRRORED
    assert [m.version for m in load_migrations()][:1] == [1]
