"""What the read API's routes share for the life of the process."""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg
from fastapi import Request
from psycopg_pool import AsyncConnectionPool

from graphledger.settings import Settings
from graphledger_server.api.consistency import AppliedOffsets
from graphledger_server.api.read_barrier import ReadBarrier


@dataclass(frozen=True)
class ApiState:
    settings: Settings
    pool: AsyncConnectionPool
    """psycopg: the checkpoint reads (the official saver's queries) and readiness."""
    store_pool: asyncpg.Pool
    """asyncpg: the store reads (`store_reader`)."""
    offsets: AppliedOffsets
    barrier: ReadBarrier
    """What each read waits for: the log's end, from the broker, against the applied offsets."""


def api_state(request: Request) -> ApiState:
    """The state the lifespan stored on the app."""
    return request.app.state.api
