"""`POST /v1/store/batch`: the reads of a `KafkaStore.batch` (get, search, list_namespaces), in op order (the
reads themselves: `reads/store_batch.py`).

The client embeds a search's query before asking (as it embeds values before publishing), so a
search arrives with `query_vector`; this route never calls an embedder.

Namespaces are the request tenant's (`api/tenant.py`): the tenant label is prepended to every namespace
and pattern on the way in and removed from every answer.

Errors beyond the shared ones: 400 `query_vector_dims` (the vector's length is not the projection's
dims), 400 `no_vector_index` (a query vector for a projection without a vector table), and 413
`result_too_large` (a search or listing matching more than `api_max_result_items`).
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from graphledger.answers import StoreBatchAnswer
from graphledger.wire import CONSISTENCY_HEADER, MSGPACK, OWN_WRITES, SEARCH_CONSISTENCY_HEADER
from graphledger_server.api.auth import tenant_of
from graphledger_server.api.codec import decode, respond
from graphledger_server.api.consistency.tokens import token_of
from graphledger_server.api.errors import ApiError
from graphledger_server.api.models import ERROR_RESPONSE, consistency_parameter, header_parameter, request_body
from graphledger_server.api.reads.store_batch import StoreBatchReads
from graphledger_server.api.state import api_state
from graphledger_server.api.store_models import GetOp, StoreBatchRequest, StoreBatchResponse
from graphledger_server.api.tenant import StoreOp

router = APIRouter(prefix="/v1/store", tags=["store"])


@router.post(
    "/batch",
    openapi_extra={
        "requestBody": request_body(StoreBatchRequest),
        "parameters": [
            consistency_parameter("graphledger.store:2:87"),
            header_parameter(
                SEARCH_CONSISTENCY_HEADER,
                {"type": "string", "enum": [OWN_WRITES]},
                "own_writes: searches and listings wait only for the consistency token.",
            ),
        ],
    },
    responses={
        200: {"model": StoreBatchResponse, "content": {MSGPACK: {}}},
        **{status: ERROR_RESPONSE for status in (400, 401, 413, 415, 422, 503)},
    },
)
async def store_batch(request: Request) -> Response:
    """`BaseStore.batch` reads: get -> item or null, search -> ranked items, list_namespaces -> namespaces."""
    tenant = tenant_of(request)
    state = api_state(request)
    body = await decode(request, StoreBatchRequest, state.settings.api_max_body_bytes)
    cap = state.settings.api_max_result_items
    ops = [_capped(op, cap) for op in tenant.store_ops(body.ops)]
    token = token_of(request.headers.get(CONSISTENCY_HEADER))
    level = request.headers.get(SEARCH_CONSISTENCY_HEADER)
    if level not in (None, OWN_WRITES):
        raise ApiError(
            400, "invalid_search_consistency", f"{SEARCH_CONSISTENCY_HEADER}: {level[:40]!r} is not {OWN_WRITES}"
        )
    reads = StoreBatchReads(state, tenant.name, token)
    results = await reads.read(ops, own_writes=level == OWN_WRITES)
    for i, result in enumerate(results):
        if isinstance(result, list) and len(result) > cap:
            raise ApiError(
                413,
                "result_too_large",
                f"ops.{i} matches more than {cap} results (GRAPHLEDGER_API_MAX_RESULT_ITEMS); "
                "page with limit and offset",
            )
    answer = StoreBatchAnswer(tenant.store_results(ops, results))
    return respond(request, answer.to_wire(), max_bytes=state.settings.api_max_response_bytes)


def _capped(op: StoreOp, cap: int) -> StoreOp:
    """A search or listing asks Postgres for at most one row more than the API answers."""
    if isinstance(op, GetOp) or op.limit <= cap:
        return op
    return op.model_copy(update={"limit": cap + 1})
