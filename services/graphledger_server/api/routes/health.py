"""`/healthz` (the process answers) and `/readyz` (Postgres answers and the schema is migrated)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from graphledger_server.api.codec import respond
from graphledger_server.api.db import not_ready_reason
from graphledger_server.api.errors import unavailable
from graphledger_server.api.models import ErrorBody
from graphledger_server.api.state import api_state

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz(request: Request) -> Response:
    """Liveness: no dependency is checked, so a database outage never restarts the process."""
    return respond(request, {"status": "ok"})


@router.get("/readyz", responses={503: {"model": ErrorBody}})
async def readyz(request: Request) -> Response:
    """Readiness: route traffic here only when reads can be answered."""
    reason = await not_ready_reason(api_state(request).pool)
    if reason is not None:
        raise unavailable("not_ready", reason)
    return respond(request, {"status": "ready"})
