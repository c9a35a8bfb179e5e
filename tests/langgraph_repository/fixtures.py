"""The checkpointer fixtures of LangGraph's own test suite, for a run on KafkaSaver (`run.py` copies this file
into the suite's `tests/` and imports it at the end of its `conftest.py`, so these definitions win).

Each test gets a saver of its own, as each gets a fresh database from the suite's Postgres fixtures; the
suite reuses thread ids ("1") from test to test, so every thread a test wrote is deleted after it
(`delete_thread`, through the log, as a user would). `GRAPHLEDGER_SUITE_CHECKPOINTER=memory` yields the
suite's own `InMemorySaver` instead, for the reference run; the parameter's id is `memory` then, as in the
suite's own runs, whose snapshots are named by it (the suite checks snapshots on `InMemorySaver` only).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator

import pytest
from langgraph.checkpoint.base import BaseCheckpointSaver
from tests.conftest_checkpointer import _checkpointer_memory

CHECKPOINTER = os.environ.get("GRAPHLEDGER_SUITE_CHECKPOINTER", "kafka")


@pytest.fixture(scope="function", params=[CHECKPOINTER])
def sync_checkpointer(request: pytest.FixtureRequest) -> Iterator[BaseCheckpointSaver]:
    if CHECKPOINTER == "memory":
        with _checkpointer_memory() as memory:
            yield memory
        return
    from graphledger import KafkaSaver

    with KafkaSaver.from_env() as saver:
        try:
            yield saver
        finally:
            for thread_id in {t.config["configurable"]["thread_id"] for t in saver.list(None)}:
                saver.delete_thread(thread_id)


@pytest.fixture(scope="function", params=[CHECKPOINTER])
async def async_checkpointer(request: pytest.FixtureRequest) -> AsyncIterator[BaseCheckpointSaver]:
    if CHECKPOINTER == "memory":
        with _checkpointer_memory() as memory:
            yield memory
        return
    from graphledger import KafkaSaver

    async with KafkaSaver.from_env() as saver:
        try:
            yield saver
        finally:
            threads = {t.config["configurable"]["thread_id"] async for t in saver.alist(None)}
            for thread_id in threads:
                await saver.adelete_thread(thread_id)
