"""`/v1/checkpoints/*`: the official saver's reads, answered in the wire format of `graphledger.wire`.

The rows are read and assembled by `AsyncPostgresSaver` itself with a pass-through serde, for parity
with the official saver bit for bit (`passthrough.py` says why). Each request gets its own saver over
the shared pool: constructing one is cheap, and a shared instance would serialize every request on
the saver's per-instance lock. Thread ids are the request tenant's (`tenant.py`): prefixed on the way
in, unprefixed on the way out, and a list without a thread only ever sees the tenant's threads.

Every read reflects what the log held when it arrived (`read_barrier.py`). A get and a DeltaChannel
history of a thread with records the projection has not applied answer at the log's end at once: the
projection's answer read in one snapshot with its applied offset, and the thread's records since,
folded as the projector applies them (`read_through.py`, `graphledger.folds.thread`). When the fold cannot
(a record that needs rows of other partitions, or the read API does not hold the records), they wait
for the projection of the thread's records (less, on a get, the client's own that it names in
`X-Graphledger-Own-Writes`), as a list of a thread does; a list across threads waits for the whole
topic.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter, Request, Response
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import CheckpointTuple, writes_sort_key
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from psycopg import AsyncConnection
from pydantic import BaseModel

from graphledger.erasure.sealing import ERASED
from graphledger.folds import thread
from graphledger.wire import CACHED_THROUGH_HEADER, CONSISTENCY_HEADER, JSON, MSGPACK, OWN_WRITES_HEADER, typed
from graphledger_server.api.auth import tenant_of
from graphledger_server.api.codec import decode, respond
from graphledger_server.api.consistency import token_of
from graphledger_server.api.db import snapshot
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
from graphledger_server.api.read_through import KeptView, thread_events_to_fold
from graphledger_server.api.state import api_state
from graphledger_server.api.tenant import Tenant
from graphledger_server.log.offsets import SNAPSHOT_OFFSET_SQL, snapshot_offset

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1/checkpoints", tags=["checkpoints"])


def _skip_scan(table: str, name: str) -> str:
    """The CTE `name` of the thread's namespaces in `table`, by a skip scan of its primary key: one index
    probe per namespace however many rows each holds (and a final null)."""
    return f"""{name} AS (
    (SELECT checkpoint_ns FROM {table} WHERE thread_id = %(thread)s ORDER BY checkpoint_ns LIMIT 1)
    UNION ALL
    SELECT (SELECT n.checkpoint_ns FROM {table} n
            WHERE n.thread_id = %(thread)s AND n.checkpoint_ns > {name}.checkpoint_ns
            ORDER BY n.checkpoint_ns LIMIT 1)
    FROM {name} WHERE {name}.checkpoint_ns IS NOT NULL
)"""


# Every namespace of a thread, a checkpoint's or a pending write's (writes can reach a namespace before
# any put there: a put of their checkpoint must then be read with them). %(thread)s -> the stored thread
# id; at most %(most)s.
THREAD_NAMESPACES_SQL = f"""
WITH RECURSIVE {_skip_scan("checkpoints", "c")}, {_skip_scan("checkpoint_writes", "w")}
SELECT checkpoint_ns FROM (
    (SELECT checkpoint_ns FROM c WHERE checkpoint_ns IS NOT NULL LIMIT %(most)s)
    UNION
    (SELECT checkpoint_ns FROM w WHERE checkpoint_ns IS NOT NULL LIMIT %(most)s)
) named ORDER BY checkpoint_ns LIMIT %(most)s
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

# Whether the projection holds writes of a checkpoint newer than the namespace's newest (writes that
# reached the log before their put): a put of it among the unprojected records would come with them,
# which the fold does not know. %(thread)s, %(ns)s, %(newest)s -> the newest id ('': none).
EARLY_WRITES_SQL = """
SELECT EXISTS (
    SELECT 1 FROM checkpoint_writes
    WHERE thread_id = %(thread)s AND checkpoint_ns = %(ns)s AND checkpoint_id > %(newest)s
) AS early
"""

# Per channel of a namespace, the counter of its blob rows' highest version (`thread.version_counter`;
# 2^63 when that version has no counter), as one jsonb object: a put naming a version with a counter
# above it names no row, so a client holding the namespace answers it without asking. Versions with a
# counter sort by it, and above them only versions without one: one skip scan of the primary key over
# the channels and one backward index probe each, however many rows the namespace holds. %(thread)s, %(ns)s.
BLOB_CEILINGS_SQL = """
WITH RECURSIVE channels AS (
    (SELECT channel FROM checkpoint_blobs WHERE thread_id = %(thread)s AND checkpoint_ns = %(ns)s
     ORDER BY channel LIMIT 1)
    UNION ALL
    SELECT (SELECT b.channel FROM checkpoint_blobs b
            WHERE b.thread_id = %(thread)s AND b.checkpoint_ns = %(ns)s AND b.channel > channels.channel
            ORDER BY b.channel LIMIT 1)
    FROM channels WHERE channels.channel IS NOT NULL
)
SELECT coalesce(jsonb_object_agg(
    channel,
    CASE WHEN top ~ '^[0-9]{32}([.]|$)' THEN left(top, 32)::numeric ELSE 9223372036854775808 END
), '{}'::jsonb) AS ceilings
FROM (
    SELECT channel, (
        SELECT b.version FROM checkpoint_blobs b
        WHERE b.thread_id = %(thread)s AND b.checkpoint_ns = %(ns)s AND b.channel = channels.channel
        ORDER BY b.version DESC LIMIT 1
    ) AS top
    FROM channels WHERE channel IS NOT NULL
) tops
"""

# A get's namespaces and blob ceilings, on one connection. %(thread)s, %(ns)s, %(most)s.
NAMESPACES_AND_CEILINGS_SQL = f"SELECT ARRAY({THREAD_NAMESPACES_SQL}) AS namespaces, ({BLOB_CEILINGS_SQL}) AS ceilings"

# What a get of a namespace's newest checkpoint folds the thread's unprojected records onto, in one
# statement, so in one snapshot (a projector batch commits rows and offsets at once): the projection's
# applied offset on the thread's partition, every namespace of the thread (at most %(most)s), the newest
# checkpoint's row as the official saver selects it (its columns null without one), whether writes
# of a newer checkpoint wait for their put (as EARLY_WRITES_SQL), the blob ceilings and whether the
# thread was erased (ERASED_SQL). One round trip: the reads that hop between processes pay for each.
# %(group)s, %(topic)s, %(partition)s, %(thread)s, %(ns)s, %(most)s, %(ref)s (the thread's reference).
THROUGH_NEWEST_SQL = f"""
SELECT o.applied, n.namespaces, t.*, e.early, b.ceilings, ({{erased}}) AS erased
FROM (SELECT coalesce(({SNAPSHOT_OFFSET_SQL}), 0) AS applied) o
CROSS JOIN LATERAL (SELECT ARRAY({THREAD_NAMESPACES_SQL}) AS namespaces) n
LEFT JOIN LATERAL (
    {AsyncPostgresSaver.SELECT_SQL} WHERE thread_id = %(thread)s AND checkpoint_ns = %(ns)s
    ORDER BY checkpoint_id DESC LIMIT 1
) t ON true
CROSS JOIN LATERAL (
    SELECT EXISTS (
        SELECT 1 FROM checkpoint_writes w
        WHERE w.thread_id = %(thread)s AND w.checkpoint_ns = %(ns)s AND w.checkpoint_id > coalesce(t.checkpoint_id, '')
    ) AS early
) e
CROSS JOIN LATERAL ({BLOB_CEILINGS_SQL}) b
"""
# The key store's record of an erased subject: its data key row, the key gone (`keys/key_store.py`).
ERASED_SQL = "EXISTS (SELECT 1 FROM {schema}.data_keys k WHERE k.ref = %(ref)s AND k.wrapped IS NULL)"
NOT_SEALED_SQL = "false"
"""Without a key store nothing records an erasure: a thread's rows are dropped, and it reads as new."""


@functools.cache
def through_newest_sql(key_store_schema: str | None) -> str:
    """THROUGH_NEWEST_SQL asking the key store in `key_store_schema` (None: none) whether the thread was erased."""
    erased = ERASED_SQL.format(schema=key_store_schema) if key_store_schema is not None else NOT_SEALED_SQL
    return THROUGH_NEWEST_SQL.replace("{erased}", erased)  # not format: the statement has braces of its own


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


def _saver(request: Request, tenant: Tenant, conn: AsyncConnection[Any] | None = None) -> AsyncPostgresSaver:
    """The official saver on the pool, or on `conn` (a snapshot's connection)."""
    on = api_state(request).pool if conn is None else conn
    return TenantSaver(conn=on, serde=PassThroughSerde(), thread_prefix=tenant.thread_prefix)


async def _settle_thread(
    request: Request,
    thread_id: str,
    own: OwnWrites | None = None,
    cached_through: int | None = None,
    *,
    through: bool = False,
) -> Settled:
    """Wait until the projection reflects the thread as the log holds it now (less `own`); `through`:
    unless the read API holds the thread's unprojected records (then `Settled.tail`)."""
    state = api_state(request)
    tenant = tenant_of(request).name
    key = await state.record_key_of_thread(tenant, thread_id)
    read = KeyedRead(state.settings.checkpoint_topic, key, own, cached_through)
    token = token_of(request.headers.get(CONSISTENCY_HEADER))
    return (await state.barrier.before_keyed([read], token, tenant=tenant, through=through))[read]


async def _applied(request: Request, conn: AsyncConnection[Any], partition: int) -> int:
    settings = api_state(request).settings
    return await snapshot_offset(conn, settings.projector_group_id, settings.checkpoint_topic, partition)


async def _thread_events(request: Request, settled: Settled, stored_thread_id: str, since: int) -> list[Any]:
    """The thread's events among its unprojected records at or after `since`; raises `thread.Underivable`."""
    state = api_state(request)
    assert settled.tail is not None and state.tail_events is not None
    if since < settled.tail.start:
        raise thread.Underivable(f"records from {since} on are no longer all held")
    key = await state.record_key_of_thread(tenant_of(request).name, stored_thread_id)
    return thread_events_to_fold(await state.tail_events.events(settled.tail, since), stored_thread_id, key.decode())


def _fold(view: thread.View, events: Sequence[Any]) -> thread.View:
    for event in events:
        view = thread.apply(view, event)
    return view


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


def wire_tuple(found: CheckpointTuple, tenant: Tenant) -> dict[str, Any]:
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
    state = api_state(request)
    body = await decode(request, GetRequest, state.settings.api_max_body_bytes)
    own = _own_writes(request)
    cached = _cached_through(request) if own is not None and body.checkpoint_id is None else None
    base = await _newest_base_started(request, tenant, body)
    # A thread the read API holds no view of is often a new one, whose answer (none) says whether it was
    # erased: the projection's answer brings that too, in the same statement.
    erased = asyncio.create_task(_erased_in(base, request, tenant, body.thread_id)) if base is not None else None
    try:
        return await _get(request, tenant, body, own, cached, base, erased)
    finally:
        await _cancelled(base)
        await _cancelled(erased)


async def _get(
    request: Request,
    tenant: Tenant,
    body: GetRequest,
    own: OwnWrites | None,
    cached: int | None,
    base: asyncio.Task[Base | None] | None,
    erased_started: asyncio.Task[bool] | None,
) -> Response:
    state = api_state(request)
    stored = tenant.thread(body.thread_id)
    settled = await _settle_thread(request, stored, own, cached, through=True)
    answer: dict[str, Any] = {"log_partition": settled.partition, "log_end": settled.end}
    heeded = own is not None and own.partition == settled.partition  # else the client's records were not
    if settled.current:
        if heeded:
            answer["own_writes_from"] = settled.applied
        answer.update(tuple=None, current=True)
        return _answer(request, answer)
    if settled.tail is not None and (body.checkpoint_id is None or settled.need is not None):
        folded = await _get_through(request, tenant, body, settled, base, erased_started)
        if folded is not None:
            # The answer holds every record of the thread below `log_end` (the projection may have
            # applied past the end the read learned), the client's named ones too.
            if heeded:
                answer["own_writes_from"] = folded["log_end"]
            answer.update(folded)
            return _answer(request, answer)
        settled = await state.barrier.wait(settled, state.settings.checkpoint_topic, tenant=tenant.name)
    if heeded:
        answer["own_writes_from"] = settled.applied
    found = await _saver(request, tenant).aget_tuple(body.config(tenant.thread))
    answer["tuple"] = wire_tuple(found, tenant) if found else None
    if body.checkpoint_id is None:
        # What a client holding the thread from this answer needs besides, each on a connection of its
        # own: the thread's namespaces, and the writes of checkpoints newer than the answer's (their
        # puts are still to come); and, for no checkpoint at all, whether the thread was erased.
        newest = found.config["configurable"]["checkpoint_id"] if found else ""
        (namespaces, ceilings), later, erased = await asyncio.gather(
            _namespaces_and_ceilings(request, stored, body.checkpoint_ns),
            _later_writes(request, stored, body.checkpoint_ns, newest),
            _erased_of(request, tenant, body.thread_id, erased_started) if found is None else _false(),
        )
    else:
        namespaces, later, ceilings = None, None, None
        erased = found is None and await _erased_of(request, tenant, body.thread_id, erased_started)
    if erased:
        answer["erased"] = True
    elif body.checkpoint_id is None:
        answer["later_writes"] = later
        answer["blob_ceilings"] = ceilings
        if namespaces is not None:
            answer["namespaces"] = namespaces
    return _answer(request, answer)


Base = tuple[int, dict[str, Any] | None, list[str] | None, dict[str, int], bool]
"""The projection's applied offset on a thread's partition, the answer of a namespace's newest checkpoint,
the thread's namespaces (None: too many), the namespace's blob ceilings and whether the key store records
the thread as erased, as of one snapshot."""


async def _newest_base_started(request: Request, tenant: Tenant, body: GetRequest) -> asyncio.Task[Base | None] | None:
    """For a get of the newest checkpoint, the projection's answer, read while the read learns where the
    log ends (the two round trips overlap), unless a view the read API kept of the thread will do."""
    state = api_state(request)
    if body.checkpoint_id is not None or state.views is None or not state.settings.api_read_through_max_bytes:
        return None
    stored = tenant.thread(body.thread_id)
    key = await state.record_key_of_thread(tenant.name, stored)
    partition = await state.barrier.partition_of(state.settings.checkpoint_topic, key)
    if state.views.usable(key, None, partition) is not None:
        return None
    return asyncio.create_task(_newest_base(request, tenant, stored, body.checkpoint_ns, partition, key))


async def _cancelled(task: asyncio.Task[Any] | None) -> None:
    if task is not None and not task.done():
        task.cancel()
    if task is not None:
        with contextlib.suppress(BaseException):
            await task


async def _get_through(
    request: Request,
    tenant: Tenant,
    body: GetRequest,
    settled: Settled,
    started: asyncio.Task[Base | None] | None,
    erased_started: asyncio.Task[bool] | None,
) -> dict[str, Any] | None:
    """The get's answer at the log's end: a view of the thread the read API kept, or the projection's
    answer in a snapshot at its applied offset, with the thread's records since folded in (None: the
    fold cannot, and the read waits).

    A get by id of a checkpoint the projection does not hold yet folds from the newest checkpoint the
    projection holds, through the records, to the one asked for (`thread.fold_to_checkpoint`)."""
    state = api_state(request)
    assert settled.tail is not None and state.views is not None
    stored = tenant.thread(body.thread_id)
    ns, checkpoint_id = body.checkpoint_ns, body.checkpoint_id
    key = await state.record_key_of_thread(tenant.name, stored)
    through = settled.end
    try:
        if checkpoint_id is None:
            found = await _newest_view(request, tenant, body, settled, key, started)
            if found is None:
                return None
            view, through = found
        else:
            found = await _one_view(request, tenant, body, settled)
            if found is None:
                return None
            view, through = found
        if view.erased:
            return {"tuple": None, "erased": True, "log_end": through}
        held = view.namespace(ns)
        answered = held.answer(body.thread_id, ns, checkpoint_id)
    except thread.Underivable as exc:
        log.debug("a get of thread %r waits for the projection: %s", body.thread_id, exc)
        return None
    if checkpoint_id is None:
        state.views.keep(key, KeptView(settled.partition, through, view))
    folded: dict[str, Any] = {"tuple": answered, "log_end": through}
    if answered is None and await _erased_of(request, tenant, body.thread_id, erased_started):
        folded["erased"] = True
    elif checkpoint_id is None:
        folded["later_writes"] = _later_writes_of(held)
        if held.ceilings is not None:
            folded["blob_ceilings"] = dict(held.ceilings)
        if view.complete:
            folded["namespaces"] = sorted(
                n for n, kept in view.namespaces.items() if kept is None or kept.newest or kept.writes
            )
    return folded


def _later_writes_of(held: thread.Namespace) -> dict[str, list[list[Any]]] | None:
    """`later_writes` of a folded namespace: the writes of checkpoints newer than its newest, which
    reached the log before their put (None: more than `MAX_LATER_WRITES`, as from the projection)."""
    newest = held.newest.checkpoint_id if held.newest is not None else ""
    later = {cid: [list(row) for row in rows] for cid, rows in held.writes.items() if cid > newest}
    return later if sum(len(rows) for rows in later.values()) <= MAX_LATER_WRITES else None


async def _newest_view(
    request: Request,
    tenant: Tenant,
    body: GetRequest,
    settled: Settled,
    key: bytes,
    started: asyncio.Task[Base | None] | None,
) -> tuple[thread.View, int] | None:
    """The thread's view at the log's end (or later: as of the offset returned with it), able to answer
    the namespace's newest checkpoint: from the view kept of it, else from the projection (`started`, or
    read now); raises `thread.Underivable`."""
    state = api_state(request)
    assert settled.tail is not None and state.views is not None
    stored, ns = tenant.thread(body.thread_id), body.checkpoint_ns
    kept = state.views.usable(key, settled.tail, settled.partition)
    if kept is not None:
        with contextlib.suppress(thread.Underivable):
            view = _fold(kept.view, await _thread_events(request, settled, stored, kept.through))
            view.namespace(ns).answer(body.thread_id, ns, None)  # raises when it does not hold the namespace
            return view, settled.end
    for _ in range(2):
        if started is None:
            started = asyncio.create_task(_newest_base(request, tenant, stored, ns, settled.partition, key))
        based = await started
        if based is None:
            return None
        applied, base, namespaces, ceilings, _ = based
        if applied >= settled.tail.start:
            events = await _thread_events(request, settled, stored, applied)
            view = thread.from_answer(ns, base, namespaces, ceilings=ceilings)
            return _fold(view, events), max(applied, settled.end)
        started = None  # the projection moved on while the read began: read it again
    return None


async def _one_view(
    request: Request, tenant: Tenant, body: GetRequest, settled: Settled
) -> tuple[thread.View, int] | None:
    """The view of one checkpoint (a get by id) at the log's end (or later: as of the offset returned with
    it); raises `thread.Underivable`."""
    stored, ns, checkpoint_id = tenant.thread(body.thread_id), body.checkpoint_ns, body.checkpoint_id
    assert checkpoint_id is not None
    async with snapshot(api_state(request).pool) as conn:
        applied = await _applied(request, conn, settled.partition)
        saver = _saver(request, tenant, conn)
        found = await saver.aget_tuple(body.config(tenant.thread))
        base = wire_tuple(found, tenant) if found else None
        if base is None:
            newest_config: RunnableConfig = {"configurable": {"thread_id": stored, "checkpoint_ns": ns}}
            found = await saver.aget_tuple(newest_config)
            newest = wire_tuple(found, tenant) if found else None
            if await _early_writes(conn, stored, ns, newest):
                return None
            namespaces, ceilings = await _namespaces_and_ceilings_on(conn, stored, ns)
    events = await _thread_events(request, settled, stored, applied)
    through = max(applied, settled.end)
    if base is None:
        start = thread.from_answer(ns, newest, namespaces, ceilings=ceilings)
        return thread.fold_to_checkpoint(start, events, ns, checkpoint_id), through
    view = thread.from_answer(ns, base)
    for event in events:
        view = thread.apply_to_checkpoint(view, event, ns, checkpoint_id)
    return view, through


async def _newest_base(
    request: Request, tenant: Tenant, stored: str, ns: str, partition: int, key: bytes
) -> Base | None:
    """The applied offset, the newest checkpoint's answer, the namespaces, the blob ceilings and whether
    the thread (its record `key`) was erased, in one snapshot (None: the projection holds writes before
    their put, or a checkpoint before format 4: the read waits)."""
    state = api_state(request)
    settings = state.settings
    params = {
        "group": settings.projector_group_id,
        "topic": settings.checkpoint_topic,
        "partition": partition,
        "thread": stored,
        "ns": ns,
        "most": MAX_NAMESPACES + 1,
        "ref": key.decode(),  # a thread's reference is its record key (`_erased`)
    }
    sql = through_newest_sql(settings.key_store_schema if state.keys is not None else None)
    async with state.pool.connection() as conn:
        cursor = await conn.execute(sql, params, binary=True)
        row: dict[str, Any] = await cursor.fetchone()
    if row["early"]:
        log.info("thread %r has writes before their put in the projection: the read waits", stored)
        return None
    namespaces = _listed(row["namespaces"])
    if row["checkpoint_id"] is None:
        return row["applied"], None, namespaces, row["ceilings"], row["erased"]
    if row["checkpoint"]["v"] < 4 and row["parent_checkpoint_id"]:
        return None  # read with its parent's pending sends: a second statement, so a second snapshot
    found = await _saver(request, tenant)._load_checkpoint_tuple(row)
    return row["applied"], wire_tuple(found, tenant), namespaces, row["ceilings"], row["erased"]


async def _early_writes(conn: AsyncConnection[Any], stored: str, ns: str, newest: dict[str, Any] | None) -> bool:
    newest_id = newest["config"]["checkpoint_id"] if newest is not None else ""
    cursor = await conn.execute(EARLY_WRITES_SQL, {"thread": stored, "ns": ns, "newest": newest_id})
    row = await cursor.fetchone()
    return row is not None and bool(row["early"])


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


async def _namespaces_and_ceilings(
    request: Request, stored_thread_id: str, checkpoint_ns: str
) -> tuple[list[str] | None, dict[str, int]]:
    """Every namespace the thread has a checkpoint or a pending write in (None: more than `MAX_NAMESPACES`),
    and the blob ceilings of `checkpoint_ns`, in one statement. Read after the answer: a namespace or a
    blob row stored since only adds to them."""
    async with api_state(request).pool.connection() as conn:
        return await _namespaces_and_ceilings_on(conn, stored_thread_id, checkpoint_ns)


async def _namespaces_and_ceilings_on(
    conn: AsyncConnection[Any], stored_thread_id: str, checkpoint_ns: str
) -> tuple[list[str] | None, dict[str, int]]:
    params = {"thread": stored_thread_id, "ns": checkpoint_ns, "most": MAX_NAMESPACES + 1}
    row = await (await conn.execute(NAMESPACES_AND_CEILINGS_SQL, params)).fetchone()
    assert row is not None
    return _listed(row["namespaces"]), row["ceilings"]


async def _ceilings_on(conn: AsyncConnection[Any], stored_thread_id: str, checkpoint_ns: str) -> dict[str, int]:
    row = await (await conn.execute(BLOB_CEILINGS_SQL, {"thread": stored_thread_id, "ns": checkpoint_ns})).fetchone()
    assert row is not None
    ceilings: dict[str, int] = row["ceilings"]
    return ceilings


def _listed(names: list[str]) -> list[str] | None:
    """The thread's namespaces as a get answers them: None when there are more than `MAX_NAMESPACES`."""
    return names if len(names) <= MAX_NAMESPACES else None


async def _erased_of(request: Request, tenant: Tenant, thread_id: str, started: asyncio.Task[bool] | None) -> bool:
    """`_erased`, asked when the read began (`started`) or now."""
    return await (started if started is not None else _erased(request, tenant, thread_id))


async def _erased_in(base: asyncio.Task[Base | None], request: Request, tenant: Tenant, thread_id: str) -> bool:
    """`_erased`, as the projection's snapshot `base` read it (asked on its own when `base` has none)."""
    based = await asyncio.shield(base)
    return based[4] if based is not None else await _erased(request, tenant, thread_id)


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
    return _answer(request, {"tuples": [wire_tuple(t, tenant) for t in found]})


@router.post("/delta-history", **_doc(DeltaHistoryRequest, DeltaHistoryResponse))
async def delta_history(request: Request) -> Response:
    """`AsyncPostgresSaver.aget_delta_channel_history`."""
    tenant = tenant_of(request)
    state = api_state(request)
    body = await decode(request, DeltaHistoryRequest, state.settings.api_max_body_bytes)
    settled = await _settle_thread(request, tenant.thread(body.thread_id), through=True)
    if settled.tail is not None and settled.need is not None:
        folded = await _history_through(request, tenant, body, settled)
        if folded is not None:
            return _answer(request, {"history": folded})
        await state.barrier.wait(settled, state.settings.checkpoint_topic, tenant=tenant.name)
    saver = _saver(request, tenant)
    history = await saver.aget_delta_channel_history(config=body.config(tenant.thread), channels=body.channels)
    return _answer(request, {"history": _history(history)})


def _history(history: Any) -> dict[str, Any]:
    answer: dict[str, Any] = {}
    for channel, entry in history.items():
        answer[channel] = {"writes": [[task_id, ch, to_wire(v)] for task_id, ch, v in entry["writes"]]}
        if "seed" in entry:
            answer[channel]["seed"] = to_wire(entry["seed"])
    return answer


async def _history_through(
    request: Request, tenant: Tenant, body: DeltaHistoryRequest, settled: Settled
) -> dict[str, Any] | None:
    """The DeltaChannel history at the log's end: the projection's newest checkpoint and its history in a
    snapshot at its applied offset, the thread's records since folded in (None: the fold cannot)."""
    stored = tenant.thread(body.thread_id)
    ns = body.checkpoint_ns
    newest_config: RunnableConfig = {"configurable": {"thread_id": stored, "checkpoint_ns": ns}}
    async with snapshot(api_state(request).pool) as conn:
        applied = await _applied(request, conn, settled.partition)
        saver = _saver(request, tenant, conn)
        found = await saver.aget_tuple(newest_config)
        base = wire_tuple(found, tenant) if found else None
        answered: dict[str, Any] = {}
        ceilings = await _ceilings_on(conn, stored, ns)
        if base is not None:
            at_newest = {**newest_config["configurable"], "checkpoint_id": base["config"]["checkpoint_id"]}
            history = await saver.aget_delta_channel_history(
                config={"configurable": at_newest},
                channels=body.channels,
            )
            answered = _history(history)
    try:
        events = await _thread_events(request, settled, stored, applied)
        start = thread.from_answer(ns, base, ceilings=ceilings)
        if base is not None:
            held = thread.with_history(start.namespace(ns), base["config"]["checkpoint_id"], answered)
            start = thread.view({ns: held}, False)
        return _fold(start, events).namespace(ns).delta_history(body.checkpoint_id, body.channels)
    except thread.Underivable as exc:
        log.debug("a DeltaChannel history of thread %r waits for the projection: %s", body.thread_id, exc)
        return None
