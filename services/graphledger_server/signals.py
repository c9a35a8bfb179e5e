"""How a long-running service stops: SIGTERM (Kubernetes, `graphledger dev`) or SIGINT (Ctrl-C) sets an
event its loop watches, so the step in flight finishes and the service returns instead of dying mid-batch."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Iterator

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[asyncio.Event]:
    """An event that a stop signal sets while the block runs on this thread's event loop; the loop's
    handlers are removed when it ends."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop.set)
    try:
        yield stop
    finally:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)
