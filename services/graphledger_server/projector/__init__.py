"""The projector: a consumer-group worker applying event batches to the Postgres projections."""

from graphledger_server.projector.main import main, run_projector

__all__ = ["main", "run_projector"]
