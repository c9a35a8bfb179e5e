"""What the read API's routes share for the life of the process."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request
from psycopg_pool import AsyncConnectionPool

from graphledger.settings import Settings
from graphledger_server.api.consistency import AppliedOffsets


@dataclass(frozen=True)
class ApiState:
    settings: Settings
    pool: AsyncConnectionPool
    offsets: AppliedOffsets


def api_state(request: Request) -> ApiState:
    """The state the lifespan stored on the app."""
    return request.app.state.api
