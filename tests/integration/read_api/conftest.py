"""Fixtures of the read API's tests: the session's empty topics, which `settings_for` names (the read
API learns from them that nothing is unprojected); a projection per module, filled by the official saver
(`read_api_helpers.populate`); the read API over it, and the official saver on it.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

from graphledger_server.projection.migrate import migrate
from read_api_helpers import LOG, SCHEMA, Api, official_saver, populate, running, settings_for


@pytest.fixture(autouse=True, scope="module")
def _empty_log(empty_log: dict[str, Any]) -> None:
    LOG.update(empty_log)


@pytest.fixture(scope="module")
async def projection(pg: Any) -> str:
    """DSN of a migrated database whose projection the official saver filled; shared by the module."""
    dsn = pg.create_database(f"t_{uuid.uuid4().hex[:12]}")
    await migrate(dsn, SCHEMA)
    async with official_saver(dsn) as saver:
        await populate(saver)
    return dsn


@pytest.fixture(scope="module")
async def api(projection: str) -> AsyncIterator[Api]:
    async with running(settings_for(projection)) as running_api:
        yield running_api


@pytest.fixture(scope="module")
async def saver(projection: str) -> AsyncIterator[AsyncPostgresSaver]:
    async with official_saver(projection) as official:
        yield official
