"""The Postgres projections: SQL migrations and the set-based apply of event batches (asyncpg)."""

from graphledger.projection.batch import BatchApplier, BatchResult
from graphledger.projection.checkpoints import CheckpointProjection, apply_checkpoint_batch, plan_batch
from graphledger.projection.migrate import migrate

__all__ = ["BatchApplier", "BatchResult", "CheckpointProjection", "apply_checkpoint_batch", "migrate", "plan_batch"]
