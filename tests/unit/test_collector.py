"""The batch services' garbage collection (`collector.py`): CPython's full collection never runs on its own,
and `collecting_fully` runs one on its clock while the service does."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from typing import Any

import pytest

from graphledger_server.collector import (
    NO_AUTOMATIC_FULL_COLLECTION,
    collecting_fully,
    freeze_and_defer_full_collections,
)


@pytest.fixture
def restored_collector() -> Iterator[None]:
    previous = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*previous)


def test_young_generations_keep_their_thresholds_and_the_oldest_waits_for_the_clock(restored_collector: None) -> None:
    young, middle, _ = gc.get_threshold()
    freeze_and_defer_full_collections()
    assert gc.get_threshold() == (young, middle, NO_AUTOMATIC_FULL_COLLECTION)
    assert gc.get_freeze_count() > 0


async def test_a_full_collection_runs_on_the_clock_while_the_service_runs(restored_collector: None) -> None:
    full = asyncio.Event()
    loop = asyncio.get_running_loop()

    def noted(phase: str, info: dict[str, Any]) -> None:
        if phase == "stop" and info["generation"] == 2:
            loop.call_soon_threadsafe(full.set)

    async def service() -> str:
        await asyncio.wait_for(full.wait(), timeout=10)
        return "done"

    freeze_and_defer_full_collections()
    gc.callbacks.append(noted)
    try:
        assert await collecting_fully(service(), interval_s=0.01) == "done"
    finally:
        gc.callbacks.remove(noted)
