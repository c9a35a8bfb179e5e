"""Integration-test fixtures besides the session's servers and databases (tests/conftest.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest


@pytest.fixture
async def conn(fresh_database: str) -> AsyncIterator[asyncpg.Connection]:
    """A connection to the test's `fresh_database` (the projection contract's tests take it)."""
    connection = await asyncpg.connect(fresh_database)
    yield connection
    await connection.close()
