"""The HTTP read API: checkpoint reads from the Postgres projection (see docs/architecture.md)."""
