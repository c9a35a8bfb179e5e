"""The Postgres projections: SQL migrations and the set-based apply of event batches (asyncpg)."""
