"""`/v1/checkpoints/{get,list,delta-history}`: the official saver's reads over HTTP, answered in the wire format
of `graphledger.wire` (the reads themselves: `reads/checkpoints.py`); `verdicts`, the one-writer rule's for a
client that does not read the log.

Each route parses its body (msgpack or JSON) and the consistency headers, and encodes the answer as the
request accepts it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel

from graphledger.answers import DeltaHistoryAnswer, GetAnswer, ListAnswer, VerdictsAnswer
from graphledger.wire import (
    CACHED_THROUGH_HEADER,
    CONSISTENCY_HEADER,
    MSGPACK,
    OWN_WRITES_HEADER,
    THREAD_KEY_HEADER,
    THREAD_KEY_WANTED,
)
from graphledger_server.api.auth import caller_of, tenant_of
from graphledger_server.api.codec import decode, respond
from graphledger_server.api.consistency.read_barrier import OwnWrites
from graphledger_server.api.consistency.tokens import token_of
from graphledger_server.api.errors import ApiError
from graphledger_server.api.models import (
    ERROR_RESPONSE,
    DeltaHistoryRequest,
    DeltaHistoryResponse,
    GetRequest,
    GetResponse,
    ListRequest,
    ListResponse,
    VerdictsRequest,
    VerdictsResponse,
    consistency_parameter,
    header_parameter,
    request_body,
)
from graphledger_server.api.reads.checkpoints import CheckpointReads
from graphledger_server.api.routes.keys import offered_thread_key
from graphledger_server.api.state import api_state

router = APIRouter(prefix="/v1/checkpoints", tags=["checkpoints"])


def _doc(request_model: type[BaseModel], response_model: type[BaseModel]) -> dict[str, Any]:
    """OpenAPI for a route that parses its own body (to accept msgpack as well as JSON)."""
    return {
        "openapi_extra": {
            "requestBody": request_body(request_model),
            "parameters": [
                consistency_parameter("graphledger.checkpoints:3:1041"),
                header_parameter(
                    OWN_WRITES_HEADER,
                    {"type": "string", "example": "3:1041,1042"},
                    "get only: partition:offset,... of the caller's own records of the thread, which it adds to "
                    "the answer itself (see own_writes_from).",
                ),
                header_parameter(
                    CACHED_THROUGH_HEADER,
                    {"type": "integer", "minimum": 0, "example": 1040},
                    "get of the newest checkpoint, with the own-writes header: the caller holds the answer as of this "
                    "offset; when only its own records came since, the answer is `current`.",
                ),
                header_parameter(
                    THREAD_KEY_HEADER,
                    {"type": "string", "enum": [THREAD_KEY_WANTED]},
                    "get only, from a client that seals: answer an existing thread's own data key (thread_key) "
                    "when the token has the keys permission.",
                ),
            ],
        },
        "responses": {
            200: {"model": response_model, "content": {MSGPACK: {}}},
            **{status: ERROR_RESPONSE for status in (400, 401, 413, 415, 422, 501, 503)},  # 503 with Retry-After
        },
    }


def _reads(request: Request) -> CheckpointReads:
    """The request's reads: its tenant, its consistency token."""
    return CheckpointReads(api_state(request), tenant_of(request), token_of(request.headers.get(CONSISTENCY_HEADER)))


def _answer(request: Request, answer: GetAnswer | ListAnswer | DeltaHistoryAnswer | VerdictsAnswer) -> Response:
    return respond(request, answer.to_wire(), max_bytes=api_state(request).settings.api_max_response_bytes)


@router.post("/get", **_doc(GetRequest, GetResponse))
async def get_tuple(request: Request) -> Response:
    """`AsyncPostgresSaver.aget_tuple`."""
    body = await decode(request, GetRequest, api_state(request).settings.api_max_body_bytes)
    own = _own_writes(request)
    cached = _cached_through(request) if own is not None and body.checkpoint_id is None else None
    answer = await _reads(request).get_tuple(body, own, cached)
    if request.headers.get(THREAD_KEY_HEADER) == THREAD_KEY_WANTED and _exists(answer):
        stored = tenant_of(request).thread(body.thread_id)
        answer = replace(answer, thread_key=await offered_thread_key(api_state(request), caller_of(request), stored))
    return _answer(request, answer)


def _exists(answer: GetAnswer) -> bool:
    """Whether the answer shows the thread has records: a checkpoint, or a namespace with one."""
    if answer.erased:
        return False
    namespaces = answer.holding.namespaces if answer.holding is not None else None
    return answer.current or answer.tuple is not None or bool(namespaces)


@router.post("/list", **_doc(ListRequest, ListResponse))
async def list_tuples(request: Request) -> Response:
    """`AsyncPostgresSaver.alist`, newest first; at most `api_max_result_items` (more: 413, page with
    `limit` and `before_checkpoint_id`)."""
    body = await decode(request, ListRequest, api_state(request).settings.api_max_body_bytes)
    return _answer(request, await _reads(request).list_tuples(body))


@router.post("/delta-history", **_doc(DeltaHistoryRequest, DeltaHistoryResponse))
async def delta_history(request: Request) -> Response:
    """`AsyncPostgresSaver.aget_delta_channel_history`."""
    body = await decode(request, DeltaHistoryRequest, api_state(request).settings.api_max_body_bytes)
    return _answer(request, await _reads(request).delta_history(body))


@router.post("/verdicts", **_doc(VerdictsRequest, VerdictsResponse))
async def verdicts(request: Request) -> Response:
    """The one-writer rule's verdicts of the caller's records of a thread, once the projection applied them
    (503 while it has not, with Retry-After): a client that does not read the log learns its refusals here."""
    body = await decode(request, VerdictsRequest, api_state(request).settings.api_max_body_bytes)
    return _answer(request, await _reads(request).verdicts(body))


def _own_writes(request: Request) -> OwnWrites | None:
    header = request.headers.get(OWN_WRITES_HEADER)
    if header is None:
        return None
    try:
        return OwnWrites.parse(header)
    except ValueError as exc:
        raise ApiError(400, "invalid_own_writes", f"{OWN_WRITES_HEADER}: {exc}") from None


def _cached_through(request: Request) -> int | None:
    header = request.headers.get(CACHED_THROUGH_HEADER)
    if header is None:
        return None
    try:
        through = int(header)
    except ValueError:
        through = -1
    if through < 0:
        raise ApiError(400, "invalid_cached_through", f"{CACHED_THROUGH_HEADER}: {header[:40]!r} is not an offset")
    return through
