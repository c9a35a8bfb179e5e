"""`graphledger sweeper`: a placeholder process until TTL and retention sweeping land (issue 4).

It runs so deployments and `graphledger dev` already have the sweeper's process in place, but it does no
work and says so once; it pretends nothing. SIGTERM or SIGINT ends it with exit status 0.
"""

from __future__ import annotations

import asyncio
import logging
import signal

from graphledger import telemetry
from graphledger.settings import Settings
from graphledger.telemetry import sweeper as sweeper_telemetry

log = logging.getLogger(__name__)

IDLE_MESSAGE = "sweeper: TTL and retention sweeping are not implemented yet (issue 4); idling"


def main(settings: Settings) -> None:
    """Log that nothing is swept yet, then wait for SIGTERM/SIGINT and return."""
    telemetry.setup("graphledger-sweeper", settings)
    sweeper_telemetry.started()
    asyncio.run(_idle())  # settings: the sweep intervals will come from here


async def _idle() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    with sweeper_telemetry.root_span("sweeper start"):
        log.info(IDLE_MESSAGE)
    await stop.wait()
    log.info("sweeper: stopping")
