"""`/v1/checkpoints/*`: the official saver's reads, answered in the wire format of `graphledger.wire`.

The rows are read and assembled by `AsyncPostgresSaver` itself with a pass-through serde, for parity
with the official saver bit for bit (`passthrough.py` says why). Each request gets its own saver over
the shared pool: constructing one is cheap, and a shared instance would serialize every request on
the saver's per-instance lock.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from langgraph.checkpoint.base import CheckpointTuple
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from pydantic import BaseModel

from graphledger.wire import CONSISTENCY_HEADER, JSON, MSGPACK
from graphledger_server.api.codec import decode, respond
from graphledger_server.api.consistency import hold
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
            **{status: errors for status in (400, 401, 413, 415, 422, 501, 503)},
        },
    }


async def _saver(request: Request) -> AsyncPostgresSaver:
    """The reader for this request, once the projection has reached the request's consistency token."""
    state = api_state(request)
    await hold(request.headers.get(CONSISTENCY_HEADER), state.offsets, state.settings.consistency_timeout_s)
    return AsyncPostgresSaver(conn=state.pool, serde=PassThroughSerde())


def _config(config: Any) -> dict[str, Any]:
    return dict(config["configurable"])


def _tuple(found: CheckpointTuple) -> dict[str, Any]:
    checkpoint: dict[str, Any] = dict(found.checkpoint)
    checkpoint["channel_values"] = {k: to_wire(v) for k, v in found.checkpoint["channel_values"].items()}
    return {
        "config": _config(found.config),
        "checkpoint": checkpoint,
        "metadata": found.metadata,
        "parent_config": _config(found.parent_config) if found.parent_config else None,
        "pending_writes": [[task_id, channel, to_wire(v)] for task_id, channel, v in found.pending_writes or ()],
    }


@router.post("/get", **_doc(GetRequest, GetResponse))
async def get_tuple(request: Request) -> Response:
    """`AsyncPostgresSaver.aget_tuple`."""
    body = await decode(request, GetRequest)
    found = await (await _saver(request)).aget_tuple(body.config())
    return respond(request, {"tuple": _tuple(found) if found else None})


@router.post("/list", **_doc(ListRequest, ListResponse))
async def list_tuples(request: Request) -> Response:
    """`AsyncPostgresSaver.alist`, newest first."""
    body = await decode(request, ListRequest)
    saver = await _saver(request)
    found = saver.alist(body.config(), filter=body.filter, before=body.before(), limit=body.limit)
    return respond(request, {"tuples": [_tuple(t) async for t in found]})


@router.post("/delta-history", **_doc(DeltaHistoryRequest, DeltaHistoryResponse))
async def delta_history(request: Request) -> Response:
    """`AsyncPostgresSaver.aget_delta_channel_history`."""
    body = await decode(request, DeltaHistoryRequest)
    saver = await _saver(request)
    history = await saver.aget_delta_channel_history(config=body.config(), channels=body.channels)
    answer: dict[str, Any] = {}
    for channel, entry in history.items():
        answer[channel] = {"writes": [[task_id, ch, to_wire(v)] for task_id, ch, v in entry["writes"]]}
        if "seed" in entry:
            answer[channel]["seed"] = to_wire(entry["seed"])
    return respond(request, {"history": answer})
