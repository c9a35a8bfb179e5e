"""Entry points of the projector: `run_projector` (for the CLI and tests) and `main` (a process).

Stopping is cooperative: `stop` ends the loop between batches. A batch in flight either commits or
rolls back as a whole (it is one transaction), so stopping at any moment, or SIGKILL, never leaves
half of a batch applied.
"""

from __future__ import annotations

import asyncio
import logging

from graphledger.settings import Settings
from graphledger_server import telemetry
from graphledger_server.collector import collecting_fully, freeze_and_defer_full_collections
from graphledger_server.health.server import serving
from graphledger_server.opening.vector_index import VectorIndex
from graphledger_server.projection.migrate import migrate
from graphledger_server.projector.worker import ProjectorWorker
from graphledger_server.signals import stop_on_signals

log = logging.getLogger(__name__)


async def run_projector(settings: Settings, stop: asyncio.Event | None = None, *, migrate_first: bool = True) -> None:
    """Consume and apply until `stop` is set (forever without one).

    `migrate_first` brings the schema up to date before consuming; migrations are idempotent and
    serialized across processes, so every replica may do it. The worker's `/livez` and `/readyz` are
    served from the start (with `GRAPHLEDGER_HEALTH_PORT`), so a migration that hangs shows too.
    """
    stop = stop or asyncio.Event()
    worker = ProjectorWorker(settings)
    with serving(settings, worker.health):
        if migrate_first:
            applied = await migrate(
                settings.postgres_dsn, settings.postgres_schema, vectors=VectorIndex.from_settings(settings)
            )
            if applied:
                log.info("migrated schema %s: applied %s", settings.postgres_schema, applied)
        try:
            await worker.start()
            await worker.run(stop)
        finally:
            await worker.close()
            log.info("projector stopped after %d batches, %d events", worker.batches, worker.events)


def main(settings: Settings | None = None) -> None:
    """Run the projector in this process until SIGTERM or SIGINT, then stop cleanly; without `settings`
    (`python -m graphledger_server.projector`), from `GRAPHLEDGER_*` variables."""
    settings = telemetry.setup("graphledger-projector", settings)

    freeze_and_defer_full_collections()

    async def _run() -> None:
        with stop_on_signals() as stop:
            await collecting_fully(run_projector(settings, stop))

    asyncio.run(_run())
