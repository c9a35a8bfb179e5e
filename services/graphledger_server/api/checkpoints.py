"""`/v1/checkpoints/*`: the official saver's reads, answered in the wire format of `graphledger.wire`.

The rows are read and assembled by `AsyncPostgresSaver` itself with a pass-through serde, for parity
with the official saver bit for bit (`passthrough.py` says why). Each request gets its own saver over
the shared pool: constructing one is cheap, and a shared instance would serialize every request on
the saver's per-instance lock. Thread ids are the request tenant's (`tenant.py`): prefixed on the way
in, unprefixed on the way out, and a list without a thread only ever sees the tenant's threads.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from langgraph.checkpoint.base import CheckpointTuple
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from pydantic import BaseModel

from graphledger.wire import CONSISTENCY_HEADER, JSON, MSGPACK
from graphledger_server.api.auth import tenant_of
from graphledger_server.api.codec import decode, respond
from graphledger_server.api.consistency import hold
from graphledger_server.api.errors import ApiError
from graphledger_server.api.models import (
    DeltaHistoryRequest,
    DeltaHistoryResponse,
    ErrorBody,
    GetRequest,
    GetResponse,
    ListRequest,
    ListResponse,
)
from graphledger_server.api.passthrough import PassThroughSerde, to_wire
from graphledger_server.api.state import api_state
from graphledger_server.api.tenant import Tenant

router = APIRouter(prefix="/v1/checkpoints", tags=["checkpoints"])


def _doc(request_model: type[BaseModel], response_model: type[BaseModel]) -> dict[str, Any]:
    """OpenAPI for a route that parses its own body (to accept msgpack as well as JSON)."""
    schema = request_model.model_json_schema()
    errors = {"model": ErrorBody, "content": {MSGPACK: {}}}
    return {
        "openapi_extra": {
            "requestBody": {"required": True, "content": {JSON: {"schema": schema}, MSGPACK: {"schema": schema}}},
            "parameters": [
                {
                    "name": CONSISTENCY_HEADER,
                    "in": "header",
                    "required": False,
                    "schema": {"type": "string", "example": "graphledger.checkpoints:3:1041"},
                    "description": "topic:partition:offset,...; answer only once the projection applied them.",
                }
            ],
        },
        "responses": {
            200: {"model": response_model, "content": {MSGPACK: {}}},
            **{status: errors for status in (400, 401, 413, 415, 422, 501, 503)},  # 503 with Retry-After
        },
    }


class TenantSaver(AsyncPostgresSaver):
    """The official saver, with every list narrowed to the threads of one tenant."""

    def __init__(self, *args: Any, thread_prefix: str | None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.thread_prefix = thread_prefix

    def _search_where(self, config: Any, filter: Any, before: Any = None) -> tuple[str, list[Any]]:
        where, params = super()._search_where(config, filter, before)
        if self.thread_prefix is None:
            return where, params
        # starts_with, not LIKE: a tenant name may hold `_`, a LIKE wildcard.
        narrowed = "starts_with(thread_id, %s)"
        return (f"{where} AND {narrowed}" if where else f"WHERE {narrowed}"), [*params, self.thread_prefix]


async def _saver(request: Request, tenant: Tenant) -> AsyncPostgresSaver:
    """The reader for this request, once the projection has reached the request's consistency token."""
    state = api_state(request)
    await hold(request.headers.get(CONSISTENCY_HEADER), state.offsets, state.settings)
    return TenantSaver(conn=state.pool, serde=PassThroughSerde(), thread_prefix=tenant.thread_prefix)


def _config(config: Any, tenant: Tenant) -> dict[str, Any]:
    configurable = dict(config["configurable"])
    configurable["thread_id"] = tenant.unthread(configurable["thread_id"])
    return configurable


def _tuple(found: CheckpointTuple, tenant: Tenant) -> dict[str, Any]:
    checkpoint: dict[str, Any] = dict(found.checkpoint)
    checkpoint["channel_values"] = {k: to_wire(v) for k, v in found.checkpoint["channel_values"].items()}
    return {
        "config": _config(found.config, tenant),
        "checkpoint": checkpoint,
        "metadata": found.metadata,
        "parent_config": _config(found.parent_config, tenant) if found.parent_config else None,
        "pending_writes": [[task_id, channel, to_wire(v)] for task_id, channel, v in found.pending_writes or ()],
    }


def _answer(request: Request, body: dict[str, Any]) -> Response:
    return respond(request, body, max_bytes=api_state(request).settings.api_max_response_bytes)


@router.post("/get", **_doc(GetRequest, GetResponse))
async def get_tuple(request: Request) -> Response:
    """`AsyncPostgresSaver.aget_tuple`."""
    tenant = tenant_of(request)
    body = await decode(request, GetRequest, api_state(request).settings.api_max_body_bytes)
    found = await (await _saver(request, tenant)).aget_tuple(body.config(tenant.thread))
    return _answer(request, {"tuple": _tuple(found, tenant) if found else None})


@router.post("/list", **_doc(ListRequest, ListResponse))
async def list_tuples(request: Request) -> Response:
    """`AsyncPostgresSaver.alist`, newest first; at most `api_max_result_items` (more: 413, page with
    `limit` and `before_checkpoint_id`)."""
    tenant = tenant_of(request)
    settings = api_state(request).settings
    body = await decode(request, ListRequest, settings.api_max_body_bytes)
    cap = settings.api_max_result_items
    limit = cap + 1 if body.limit is None or body.limit > cap else body.limit
    saver = await _saver(request, tenant)
    found = [
        t async for t in saver.alist(body.config(tenant.thread), filter=body.filter, before=body.before(), limit=limit)
    ]
    if len(found) > cap:
        raise ApiError(
            413,
            "result_too_large",
            f"more than {cap} checkpoints match (GRAPHLEDGER_API_MAX_RESULT_ITEMS); "
            "page with limit and before_checkpoint_id",
        )
    return _answer(request, {"tuples": [_tuple(t, tenant) for t in found]})


@router.post("/delta-history", **_doc(DeltaHistoryRequest, DeltaHistoryResponse))
async def delta_history(request: Request) -> Response:
    """`AsyncPostgresSaver.aget_delta_channel_history`."""
    tenant = tenant_of(request)
    body = await decode(request, DeltaHistoryRequest, api_state(request).settings.api_max_body_bytes)
    saver = await _saver(request, tenant)
    history = await saver.aget_delta_channel_history(config=body.config(tenant.thread), channels=body.channels)
    answer: dict[str, Any] = {}
    for channel, entry in history.items():
        answer[channel] = {"writes": [[task_id, ch, to_wire(v)] for task_id, ch, v in entry["writes"]]}
        if "seed" in entry:
            answer[channel]["seed"] = to_wire(entry["seed"])
    return _answer(request, {"history": answer})
