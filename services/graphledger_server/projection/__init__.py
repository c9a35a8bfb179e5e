"""The Postgres projections: SQL migrations and the set-based apply of event batches (asyncpg)."""

from graphledger_server.projection.batch import BatchApplier, BatchResult
from graphledger_server.projection.checkpoints import CheckpointProjection, plan_batch
from graphledger_server.projection.migrate import migrate

__all__ = ["BatchApplier", "BatchResult", "CheckpointProjection", "migrate", "plan_batch"]
