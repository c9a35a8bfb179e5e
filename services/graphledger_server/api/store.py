"""`POST /v1/store/batch`: the reads of a `KafkaStore.batch` (get, search, list_namespaces), in op order.

The client embeds a search's query before asking (as it embeds values before publishing), so a
search arrives with `query_vector`; this route never calls an embedder.

Every read reflects what the log held when the batch arrived (`read_barrier.py`). A get of an item with
records the projection has not applied answers at the log's end without waiting: the projection's row
and the item's records since, folded (`store_through.py`); one the fold cannot answer waits for them.
A search or listing waits for the end of every store partition (and then the batch's gets are answered
by the projection alone), unless the batch asks for `own_writes` consistency in
`X-Graphledger-Search-Consistency` (then only its consistency token, the caller's own writes).

Namespaces are the request tenant's (`tenant.py`): the tenant label is prepended to every namespace
and pattern on the way in and removed from every answer.

Errors beyond the shared ones: 400 `query_vector_dims` (the vector's length is not the projection's
dims), 400 `no_vector_index` (a query vector for a projection without a vector table), and 413
`result_too_large` (a search or listing matching more than `api_max_result_items`).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from fastapi import APIRouter, Request, Response

from graphledger.wire import CONSISTENCY_HEADER, JSON, MSGPACK, OWN_WRITES, SEARCH_CONSISTENCY_HEADER, Token
from graphledger_server.api.auth import tenant_of
from graphledger_server.api.codec import decode, respond
from graphledger_server.api.consistency import token_of
from graphledger_server.api.errors import ApiError
from graphledger_server.api.models import ErrorBody
from graphledger_server.api.read_barrier import KeyedRead, Settled
from graphledger_server.api.state import api_state
from graphledger_server.api.store_models import GetOp, StoreBatchRequest, StoreBatchResponse
from graphledger_server.api.store_reader import StoreReader
from graphledger_server.api.store_through import WAIT, items_through
from graphledger_server.api.tenant import StoreOp
from graphledger_server.telemetry import api as telemetry

router = APIRouter(prefix="/v1/store", tags=["store"])

_SCHEMA = StoreBatchRequest.model_json_schema()
_ERRORS = {"model": ErrorBody, "content": {MSGPACK: {}}}


def _reader(request: Request) -> StoreReader:
    """The process's store reader, made on first use (it lives on the app, beside the API state)."""
    reader: StoreReader | None = getattr(request.app.state, "store_reader", None)
    if reader is None:
        state = api_state(request)
        settings = state.settings
        reader = StoreReader(state.store_pool, settings.postgres_schema, acquire_timeout_s=settings.api_pool_timeout_s)
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
            },
            {
                "name": SEARCH_CONSISTENCY_HEADER,
                "in": "header",
                "required": False,
                "schema": {"type": "string", "enum": [OWN_WRITES]},
                "description": "own_writes: searches and listings wait only for the consistency token.",
            },
        ],
    },
    responses={
        200: {"model": StoreBatchResponse, "content": {MSGPACK: {}}},
        **{status: _ERRORS for status in (400, 401, 413, 415, 422, 503)},
    },
)
async def store_batch(request: Request) -> Response:
    """`BaseStore.batch` reads: get -> item or null, search -> ranked items, list_namespaces -> namespaces."""
    tenant = tenant_of(request)
    state = api_state(request)
    body = await decode(request, StoreBatchRequest, state.settings.api_max_body_bytes)
    cap = state.settings.api_max_result_items
    ops = [_capped(op, cap) for op in tenant.store_ops(body.ops)]
    results = await _read(request, ops)
    for i, (op, result) in enumerate(zip(ops, results, strict=True)):
        if not isinstance(op, GetOp) and len(result) > cap:
            raise ApiError(
                413,
                "result_too_large",
                f"ops.{i} matches more than {cap} results (GRAPHLEDGER_API_MAX_RESULT_ITEMS); "
                "page with limit and offset",
            )
    answer = {"results": tenant.store_results(ops, results)}
    return respond(request, answer, max_bytes=state.settings.api_max_response_bytes)


async def _read(request: Request, ops: list[StoreOp]) -> list[Any]:
    """The ops' results, each reflecting what it must (the module docstring)."""
    state = api_state(request)
    topic = state.settings.store_topic
    token = token_of(request.headers.get(CONSISTENCY_HEADER))
    level = request.headers.get(SEARCH_CONSISTENCY_HEADER)
    if level not in (None, OWN_WRITES):
        raise ApiError(
            400, "invalid_search_consistency", f"{SEARCH_CONSISTENCY_HEADER}: {level[:40]!r} is not {OWN_WRITES}"
        )
    tenant = tenant_of(request).name
    if level != OWN_WRITES and any(not isinstance(op, GetOp) for op in ops):
        return await _read_at_topic_end(request, ops, token, tenant)
    gets = {
        i: KeyedRead(topic, await state.item_key(tenant, tuple(op.namespace), op.key))
        for i, op in enumerate(ops)
        if isinstance(op, GetOp)
    }
    settled = await state.barrier.before_keyed(list(dict.fromkeys(gets.values())), token, tenant=tenant, through=True)
    through = {i: settled[read] for i, read in gets.items() if settled[read].need is not None}
    return await _results(request, ops, through)


async def _read_at_topic_end(request: Request, ops: list[StoreOp], token: Token, tenant: str) -> list[Any]:
    """Ops that wait for the end of every store partition (a search or listing, and the gets beside it).

    They run on the projection while the log's end is fetched, the two round trips overlapping: if the
    projection had reached that end already when they began (steady state, and between bursts of
    writes), their answer stands; else they wait for it and run again. What is left of a search's cost
    beside the official store's is the HTTP hop and the log-end fetch beyond the query's own time."""
    state = api_state(request)
    topic = state.settings.store_topic
    since = await state.barrier.positions(topic)
    # Nothing awaited between reading the positions and starting the ops: they see at least that much.
    searches: list[tuple[str, float]] = []
    early = None if state.offsets.missing(token) else asyncio.create_task(_reader(request).run(ops, searches))
    try:
        at_end = await state.barrier.before_topic(topic, token, tenant=tenant, since=since)
    except BaseException:
        await _finished(early)
        raise
    if early is not None:
        if at_end:
            answer = await early
            telemetry.store_searches(searches)
            return answer
        await _finished(early)
    return await _reader(request).run(ops)


async def _finished(task: asyncio.Task[Any] | None) -> None:
    """Let a read that is no longer needed finish (cancelling a statement costs Postgres more), unheard."""
    if task is not None:
        with contextlib.suppress(Exception):
            await task


async def _results(request: Request, ops: list[StoreOp], through: dict[int, Settled]) -> list[Any]:
    """The ops' results: the projection's, and for the gets in `through` the folded item (or, when the fold
    cannot answer, the projection's once it applied the item's records)."""
    state = api_state(request)
    results: list[Any] = [None] * len(ops)
    plain = [i for i in range(len(ops)) if i not in through]
    if through:
        assert state.tail_events is not None and state.store_events is not None
        gets = [
            (op, settled) for i, settled in through.items() if isinstance(op := ops[i], GetOp)
        ]  # `through` holds gets only
        folded = await items_through(state.settings, state.store_pool, state.tail_events, state.store_events, gets)
        for (i, settled), found in zip(through.items(), folded, strict=True):
            if found is WAIT:
                await state.barrier.wait(settled, state.settings.store_topic, tenant=tenant_of(request).name)
                plain.append(i)
            else:
                results[i] = found
    if plain:
        plain.sort()
        for i, found in zip(plain, await _reader(request).run([ops[i] for i in plain]), strict=True):
            results[i] = found
    return results


def _capped(op: StoreOp, cap: int) -> StoreOp:
    """A search or listing asks Postgres for at most one row more than the API answers."""
    if isinstance(op, GetOp) or op.limit <= cap:
        return op
    return op.model_copy(update={"limit": cap + 1})
