"""`/v1/checkpoints/*`: the official saver's reads, answered in the wire format of `graphledger.wire`.

The rows are read and assembled by `AsyncPostgresSaver` itself with a pass-through serde, for parity
with the official saver bit for bit (`passthrough.py` says why). Each request gets its own saver over
the shared pool: constructing one is cheap, and a shared instance would serialize every request on
the saver's per-instance lock. Thread ids are the request tenant's (`tenant.py`): prefixed on the way
in, unprefixed on the way out, and a list without a thread only ever sees the tenant's threads.

Every read first waits until the projection reflects what the log held when it arrived
(`read_barrier.py`): a thread's reads for the thread's unprojected records (less, on a get, the
client's own that it names in `X-Graphledger-Own-Writes`), a list across threads for the whole topic.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request, Response
from langgraph.checkpoint.base import CheckpointTuple, writes_sort_key
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from pydantic import BaseModel

from graphledger.erasure.sealing import ERASED
from graphledger.wire import CACHED_THROUGH_HEADER, CONSISTENCY_HEADER, JSON, MSGPACK, OWN_WRITES_HEADER, typed
from graphledger_server.api.auth import tenant_of
from graphledger_server.api.codec import decode, respond
from graphledger_server.api.consistency import token_of
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
from graphledger_server.api.read_barrier import KeyedRead, OwnWrites, Settled
from graphledger_server.api.state import api_state
from graphledger_server.api.tenant import Tenant

router = APIRouter(prefix="/v1/checkpoints", tags=["checkpoints"])

# Every namespace of a thread, by a skip scan of the checkpoints' primary key: one index probe per
# namespace, however many checkpoints each holds. %(thread)s -> the stored thread id.
THREAD_NAMESPACES_SQL = """
WITH RECURSIVE ns AS (
    (SELECT checkpoint_ns FROM checkpoints WHERE thread_id = %(thread)s ORDER BY checkpoint_ns LIMIT 1)
    UNION ALL
    SELECT (SELECT c.checkpoint_ns FROM checkpoints c
            WHERE c.thread_id = %(thread)s AND c.checkpoint_ns > ns.checkpoint_ns
            ORDER BY c.checkpoint_ns LIMIT 1)
    FROM ns WHERE ns.checkpoint_ns IS NOT NULL
)
SELECT checkpoint_ns FROM ns WHERE checkpoint_ns IS NOT NULL LIMIT %(most)s
"""
# The writes of a namespace's checkpoints newer than an answer's: writes that reached the log before
# their put. %(thread)s, %(ns)s, %(newest)s -> the stored thread id, the namespace, the answer's checkpoint
# id ('' for none). Given the id, not found again here: a put applied since would hide its writes.
LATER_WRITES_SQL = """
SELECT checkpoint_id, task_id, task_path, idx, channel, type, blob FROM checkpoint_writes
WHERE thread_id = %(thread)s AND checkpoint_ns = %(ns)s AND checkpoint_id > %(newest)s
ORDER BY checkpoint_id, task_path, task_id, idx
LIMIT %(most)s
"""
MAX_LATER_WRITES = 1000
MAX_NAMESPACES = 1000
"""Most namespaces a get names; a thread with more answers without the list (the client then asks for each)."""


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
                },
                {
                    "name": OWN_WRITES_HEADER,
                    "in": "header",
                    "required": False,
                    "schema": {"type": "string", "example": "3:1041,1042"},
                    "description": "get only: partition:offset,... of the caller's own records of the thread, "
                    "which it adds to the answer itself (see own_writes_from).",
                },
                {
                    "name": CACHED_THROUGH_HEADER,
                    "in": "header",
                    "required": False,
                    "schema": {"type": "integer", "minimum": 0, "example": 1040},
                    "description": "get of the newest checkpoint, with the own-writes header: the caller holds the "
                    "answer as of this offset; when only its own records came since, the answer is `current`.",
                },
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

    def _load_writes(self, writes: Any) -> list[Any]:
        """The official order and values, keeping each write's task path and index: a client adding its
        own writes to an answer merges them by `(task_id, idx)` and sorts them as the saver does."""
        return [
            (tid.decode(), channel.decode(), self.serde.loads_typed((t.decode(), v)), path.decode(), int(idx))
            for tid, channel, t, v, path, idx in sorted(
                writes or [], key=lambda w: writes_sort_key(w[4].decode(), w[0].decode(), int(w[5]))
            )
        ]

    def _search_where(self, config: Any, filter: Any, before: Any = None) -> tuple[str, list[Any]]:
        where, params = super()._search_where(config, filter, before)
        if self.thread_prefix is None:
            return where, params
        # starts_with, not LIKE: a tenant name may hold `_`, a LIKE wildcard.
        narrowed = "starts_with(thread_id, %s)"
        return (f"{where} AND {narrowed}" if where else f"WHERE {narrowed}"), [*params, self.thread_prefix]


def _saver(request: Request, tenant: Tenant) -> AsyncPostgresSaver:
    return TenantSaver(conn=api_state(request).pool, serde=PassThroughSerde(), thread_prefix=tenant.thread_prefix)


async def _settle_thread(
    request: Request, thread_id: str, own: OwnWrites | None = None, cached_through: int | None = None
) -> Settled:
    """Wait until the projection reflects the thread as the log holds it now (less `own`)."""
    state = api_state(request)
    tenant = tenant_of(request).name
    key = await state.record_key_of_thread(tenant, thread_id)
    read = KeyedRead(state.settings.checkpoint_topic, key, own, cached_through)
    token = token_of(request.headers.get(CONSISTENCY_HEADER))
    return (await state.barrier.before_keyed([read], token, tenant=tenant))[read]


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


def _config(config: Any, tenant: Tenant) -> dict[str, Any]:
    configurable = dict(config["configurable"])
    configurable["thread_id"] = tenant.unthread(configurable["thread_id"])
    return configurable


def _tuple(found: CheckpointTuple, tenant: Tenant) -> dict[str, Any]:
    writes: list[Any] = found.pending_writes or []  # five-tuples: `TenantSaver._load_writes`
    checkpoint: dict[str, Any] = dict(found.checkpoint)
    checkpoint["channel_values"] = {k: to_wire(v) for k, v in found.checkpoint["channel_values"].items()}
    return {
        "config": _config(found.config, tenant),
        "checkpoint": checkpoint,
        "metadata": found.metadata,
        "parent_config": _config(found.parent_config, tenant) if found.parent_config else None,
        "pending_writes": [[task_id, channel, to_wire(v), path, idx] for task_id, channel, v, path, idx in writes],
    }


def _answer(request: Request, body: dict[str, Any]) -> Response:
    return respond(request, body, max_bytes=api_state(request).settings.api_max_response_bytes)


@router.post("/get", **_doc(GetRequest, GetResponse))
async def get_tuple(request: Request) -> Response:
    """`AsyncPostgresSaver.aget_tuple`."""
    tenant = tenant_of(request)
    body = await decode(request, GetRequest, api_state(request).settings.api_max_body_bytes)
    own = _own_writes(request)
    cached = _cached_through(request) if own is not None and body.checkpoint_id is None else None
    settled = await _settle_thread(request, tenant.thread(body.thread_id), own, cached)
    answer: dict[str, Any] = {"log_partition": settled.partition, "log_end": settled.end}
    if own is not None and own.partition == settled.partition:  # else the client's records were not heeded
        answer["own_writes_from"] = settled.applied
    if settled.current:
        answer.update(tuple=None, current=True)
    else:
        found = await _saver(request, tenant).aget_tuple(body.config(tenant.thread))
        answer["tuple"] = _tuple(found, tenant) if found else None
        if body.checkpoint_id is None:
            # What a client holding the thread from this answer needs besides, each on a connection of its
            # own: the thread's namespaces, and the writes of checkpoints newer than the answer's (their
            # puts are still to come); and, for no checkpoint at all, whether the thread was erased.
            stored = tenant.thread(body.thread_id)
            newest = found.config["configurable"]["checkpoint_id"] if found else ""
            namespaces, later, erased = await asyncio.gather(
                _namespaces(request, stored),
                _later_writes(request, stored, body.checkpoint_ns, newest),
                _erased(request, tenant, body.thread_id) if found is None else _false(),
            )
        else:
            namespaces, later = None, None
            erased = found is None and await _erased(request, tenant, body.thread_id)
        if erased:
            answer["erased"] = True
        elif body.checkpoint_id is None:
            answer["later_writes"] = later
            if namespaces is not None:
                answer["namespaces"] = namespaces
    return _answer(request, answer)


async def _false() -> bool:
    return False


async def _later_writes(request: Request, stored_thread_id: str, checkpoint_ns: str, newest: str) -> Any:
    """The pending writes of the namespace's checkpoints newer than `newest`, the answer's (None: more
    than `MAX_LATER_WRITES` rows, which the client then does not hold), by checkpoint id."""
    params = {"thread": stored_thread_id, "ns": checkpoint_ns, "newest": newest, "most": MAX_LATER_WRITES + 1}
    async with api_state(request).pool.connection() as conn:
        rows = await (await conn.execute(LATER_WRITES_SQL, params, binary=True)).fetchall()
    if len(rows) > MAX_LATER_WRITES:
        return None
    later: dict[str, list[Any]] = {}
    for row in rows:
        later.setdefault(row["checkpoint_id"], []).append(
            [row["task_id"], row["channel"], typed(row["type"], row["blob"]), row["task_path"], row["idx"]]
        )
    return later


async def _namespaces(request: Request, stored_thread_id: str) -> list[str] | None:
    """Every namespace the thread has a checkpoint in (None: more than `MAX_NAMESPACES`)."""
    async with api_state(request).pool.connection() as conn:
        cursor = await conn.execute(THREAD_NAMESPACES_SQL, {"thread": stored_thread_id, "most": MAX_NAMESPACES + 1})
        rows = await cursor.fetchall()
    names = [row["checkpoint_ns"] for row in rows]
    return names if len(names) <= MAX_NAMESPACES else None


async def _erased(request: Request, tenant: Tenant, thread_id: str) -> bool:
    """Whether the thread was erased (the client then refuses its writes at once)."""
    state = api_state(request)
    if state.keys is None:
        return False
    ref = (await state.record_key_of_thread(tenant.name, tenant.thread(thread_id))).decode()  # a thread's reference
    return (await state.keys.store.find([ref])).get(ref) is ERASED


@router.post("/list", **_doc(ListRequest, ListResponse))
async def list_tuples(request: Request) -> Response:
    """`AsyncPostgresSaver.alist`, newest first; at most `api_max_result_items` (more: 413, page with
    `limit` and `before_checkpoint_id`)."""
    tenant = tenant_of(request)
    settings = api_state(request).settings
    body = await decode(request, ListRequest, settings.api_max_body_bytes)
    cap = settings.api_max_result_items
    limit = cap + 1 if body.limit is None or body.limit > cap else body.limit
    if body.thread_id is not None:
        await _settle_thread(request, tenant.thread(body.thread_id))
    else:
        token = token_of(request.headers.get(CONSISTENCY_HEADER))
        await api_state(request).barrier.before_topic(settings.checkpoint_topic, token, tenant=tenant.name)
    saver = _saver(request, tenant)
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
    await _settle_thread(request, tenant.thread(body.thread_id))
    saver = _saver(request, tenant)
    history = await saver.aget_delta_channel_history(config=body.config(tenant.thread), channels=body.channels)
    answer: dict[str, Any] = {}
    for channel, entry in history.items():
        answer[channel] = {"writes": [[task_id, ch, to_wire(v)] for task_id, ch, v in entry["writes"]]}
        if "seed" in entry:
            answer[channel]["seed"] = to_wire(entry["seed"])
    return _answer(request, {"history": answer})
