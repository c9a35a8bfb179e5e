"""How the batch services (projector, replay) collect garbage: young generations as CPython does, the full
collection on a clock of their own.

A batch holds thousands of records, their events and their rows alive at once, two batches overlap, and
each allocates millions of short-lived objects. CPython's automatic full collection then runs every few
hundred milliseconds and walks every live object, to find almost nothing: cycles that outlive two young
collections are rare here (asyncio's, an exception's traceback). Measured on the rebuild of 200,000
sealed events (2 cores): 60 full collections took 7.8 s of the load's 32.7 s and freed 57 objects; with
them on this clock, 22.7 s. What was imported before the service starts is frozen besides, so no
collection rescans it.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Awaitable
from typing import Final, TypeVar

T = TypeVar("T")

FULL_COLLECTION_INTERVAL_S: Final = 30.0
"""How often a full collection runs: cyclic garbage in the oldest generation waits at most this long."""
NO_AUTOMATIC_FULL_COLLECTION: Final = 2**30
"""The oldest generation's threshold that CPython's own full collection then never reaches."""


def freeze_and_defer_full_collections() -> None:
    """Freeze what lives now, and leave full collections to `collecting_fully`; the young generations keep
    CPython's thresholds. Call once, before the service's loop starts."""
    gc.collect()
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, NO_AUTOMATIC_FULL_COLLECTION)


async def collecting_fully(main: Awaitable[T], interval_s: float = FULL_COLLECTION_INTERVAL_S) -> T:
    """`main`'s result, with a full collection every `interval_s` while it runs."""
    task = asyncio.create_task(_collect_every(interval_s), name="full garbage collections")
    try:
        return await main
    finally:
        task.cancel()


async def _collect_every(interval_s: float) -> None:
    while True:
        await asyncio.sleep(interval_s)
        gc.collect()
