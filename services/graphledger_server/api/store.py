"""`POST /v1/store/batch`: the reads of a `KafkaStore.batch` (get, search, list_namespaces), in op order.

The client embeds a search's query before asking (as it embeds values before publishing), so a
search arrives with `query_vector`; this route never calls an embedder. The consistency header is
honoured exactly as on the checkpoint routes; a store write's token lists store-topic partitions.

Errors beyond the shared ones: 400 `query_vector_dims` (the vector's length is not the projection's
dims) and 400 `no_vector_index` (a query vector for a projection without a vector table).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from graphledger.wire import CONSISTENCY_HEADER, JSON, MSGPACK
from graphledger_server.api.codec import decode, respond
from graphledger_server.api.consistency import hold
from graphledger_server.api.models import ErrorBody
from graphledger_server.api.state import api_state
from graphledger_server.api.store_models import StoreBatchRequest, StoreBatchResponse
from graphledger_server.api.store_reader import StoreReader

router = APIRouter(prefix="/v1/store", tags=["store"])

_SCHEMA = StoreBatchRequest.model_json_schema()
_ERRORS = {"model": ErrorBody, "content": {MSGPACK: {}}}


def _reader(request: Request) -> StoreReader:
    """The process's store reader, made on first use (it lives on the app, beside the API state)."""
    reader: StoreReader | None = getattr(request.app.state, "store_reader", None)
    if reader is None:
        state = api_state(request)
        reader = StoreReader(state.pool, state.settings.postgres_schema, ef_search=state.settings.store_hnsw_ef_search)
        request.app.state.store_reader = reader
    return reader


@router.post(
    "/batch",
    openapi_extra={
        "requestBody": {"required": True, "content": {JSON: {"schema": _SCHEMA}, MSGPACK: {"schema": _SCHEMA}}},
        "parameters": [
            {
                "name": CONSISTENCY_HEADER,
                "in": "header",
                "required": False,
                "schema": {"type": "string", "example": "graphledger.store:2:87"},
                "description": "topic:partition:offset,...; answer only once the projection applied them.",
            }
        ],
    },
    responses={
        200: {"model": StoreBatchResponse, "content": {MSGPACK: {}}},
        **{status: _ERRORS for status in (400, 401, 413, 415, 422, 503)},  # type: ignore[dict-item]
    },
)
async def store_batch(request: Request) -> Response:
    """`BaseStore.batch` reads: get -> item or null, search -> ranked items, list_namespaces -> namespaces."""
    body = await decode(request, StoreBatchRequest)
    state = api_state(request)
    await hold(request.headers.get(CONSISTENCY_HEADER), state.offsets, state.settings.consistency_timeout_s)
    results: list[Any] = await _reader(request).run(body.ops)
    return respond(request, {"results": results})
