"""The checkpoint reads: the official saver's get, list and DeltaChannel history, each reflecting what the log
held when it arrived (`consistency/read_barrier.py`).

A get and a DeltaChannel history of a thread with records the projection has not applied answer at the
log's end at once: the projection's answer read in one snapshot with its applied offset, and the thread's
records since, folded as the projector applies them (`consistency/read_through.py`,
`graphledger.folds.thread`). When the fold cannot (a record that needs rows of other partitions, or the
read API does not hold the records), they wait for the projection of the thread's records (less, on a
get, the client's own that it names in `X-Graphledger-Own-Writes`), as a list of a thread does; a list
across threads waits for the whole topic. The rows themselves are read and assembled by the official
saver (`saver.py`); the statements beside its own are in `checkpoint_sql.py`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, NamedTuple

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import DeltaChannelHistory
from psycopg import AsyncConnection

from graphledger.answers import (
    Basis,
    ChannelHistory,
    DeltaHistoryAnswer,
    GetAnswer,
    Holding,
    ListAnswer,
    RefusedWrite,
    VerdictsAnswer,
    WireTuple,
    WireWrite,
)
from graphledger.erasure.sealing import ERASED
from graphledger.events.checkpoint import CheckpointEvent
from graphledger.folds import thread
from graphledger.tasks import drop_speculative
from graphledger.wire import Token, typed
from graphledger_server.api.consistency.read_barrier import KeyedRead, OwnWrites, Settled
from graphledger_server.api.consistency.read_through import KeptView, thread_events_to_fold
from graphledger_server.api.db import snapshot
from graphledger_server.api.errors import ApiError
from graphledger_server.api.models import DeltaHistoryRequest, GetRequest, ListRequest, VerdictsRequest
from graphledger_server.api.reads.checkpoint_sql import (
    BLOB_CEILINGS_SQL,
    EARLY_WRITES_SQL,
    LATER_WRITES_SQL,
    MAX_LATER_WRITES,
    MAX_NAMESPACES,
    NAMESPACES_AND_CEILINGS_SQL,
    REFUSALS_SQL,
    THREAD_BASIS_SQL,
    through_newest_sql,
)
from graphledger_server.api.reads.saver import TenantSaver, saver_for, to_wire, wire_tuple
from graphledger_server.api.state import ApiState
from graphledger_server.api.tenant import Tenant
from graphledger_server.log.offsets import snapshot_offset

log = logging.getLogger(__name__)

LaterWrites = dict[str, list[WireWrite]]
"""The pending writes of checkpoints whose puts are still to come, by checkpoint id (`Holding.later_writes`)."""

EARLY_WRITES = "the projection holds writes of a checkpoint newer than the namespace's newest, before their put"
"""Why a get or a DeltaChannel history waits that the fold cannot start from the projection's answer: a put of
that checkpoint among the thread's unprojected records comes with writes the fold does not know."""


class Base(NamedTuple):
    """What a get of a namespace's newest checkpoint folds the thread's unprojected records onto: the
    projection as of one snapshot (`THROUGH_NEWEST_SQL`)."""

    applied: int
    """The projection's applied offset on the thread's partition."""
    answer: WireTuple | None
    """The namespace's newest checkpoint (None: none)."""
    namespaces: list[str] | None
    """The thread's namespaces (None: too many)."""
    ceilings: dict[str, int]
    """The namespace's blob ceilings."""
    erased: bool
    """Whether the key store records the thread as erased."""
    basis: Basis
    """What the one-writer rule held of the thread."""


class CheckpointReads:
    """The checkpoint reads of one request: its tenant's threads, and its consistency token."""

    def __init__(self, state: ApiState, tenant: Tenant, token: Token) -> None:
        self._state = state
        self._tenant = tenant
        self._token = token

    # -- get ----------------------------------------------------------------------------------------

    async def get_tuple(self, body: GetRequest, own: OwnWrites | None, cached: int | None) -> GetAnswer:
        """`AsyncPostgresSaver.aget_tuple`, with what a client holding the thread needs besides (`own`: the
        client's records it adds itself; `cached`: the offset it holds the newest checkpoint as of)."""
        base = await self._newest_base_started(body)
        # A thread the read API holds no view of is often a new one, whose answer (none) says whether it was
        # erased: the projection's answer brings that too, in the same statement.
        erased = None
        if base is not None:
            erased = asyncio.create_task(self._erased_in(base, body.thread_id), name="a get's erasure check")
        try:
            return await self._get(body, own, cached, base, erased)
        finally:
            await drop_speculative(log, base, erased)

    async def _get(
        self,
        body: GetRequest,
        own: OwnWrites | None,
        cached: int | None,
        base: asyncio.Task[Base | thread.Underivable] | None,
        erased_started: asyncio.Task[bool] | None,
    ) -> GetAnswer:
        state, tenant = self._state, self._tenant
        stored = tenant.thread(body.thread_id)
        settled = await self._settle_thread(stored, own, cached, through=True)
        partition, end = settled.partition, settled.end
        heeded = own is not None and own.partition == partition  # else the client's records were not
        if settled.current:
            return GetAnswer(partition, end, None, own_writes_from=settled.applied if heeded else None, current=True)
        if settled.tail is not None and (body.checkpoint_id is None or settled.need is not None):
            folded = await self._get_through(body, settled, base, erased_started)
            if not isinstance(folded, thread.Underivable):
                # The answer holds every record of the thread below `log_end` (the projection may have
                # applied past the end the read learned), the client's named ones too.
                return replace(folded, own_writes_from=folded.log_end) if heeded else folded
            log.debug("a get of thread %r waits for the projection: %s", body.thread_id, folded.reason)
            settled = await state.barrier.wait(settled, state.settings.checkpoint_topic, tenant=tenant.name)
        own_writes_from = settled.applied if heeded else None
        # The rule's basis before the checkpoint: read after it, a write's intent could claim an operation
        # its writer never saw.
        basis = await self._basis(stored, body.checkpoint_ns) if body.checkpoint_id is None else None
        found = await self._saver().aget_tuple(body.config(tenant.thread))
        answered = wire_tuple(found, tenant) if found else None
        if body.checkpoint_id is None:
            # What a client holding the thread from this answer needs besides, each on a connection of its
            # own: the thread's namespaces, and the writes of checkpoints newer than the answer's (their
            # puts are still to come); and, for no checkpoint at all, whether the thread was erased.
            newest = found.config["configurable"]["checkpoint_id"] if found else ""
            (namespaces, ceilings), later, erased = await asyncio.gather(
                self._namespaces_and_ceilings(stored, body.checkpoint_ns),
                self._later_writes(stored, body.checkpoint_ns, newest),
                self._erased_of(body.thread_id, erased_started) if found is None else _false(),
            )
        else:
            namespaces, later, ceilings = None, None, None
            erased = found is None and await self._erased_of(body.thread_id, erased_started)
        holding = Holding(later, ceilings, namespaces) if body.checkpoint_id is None and not erased else None
        return GetAnswer(
            partition, end, answered, own_writes_from=own_writes_from, erased=erased, holding=holding, basis=basis
        )

    async def _newest_base_started(self, body: GetRequest) -> asyncio.Task[Base | thread.Underivable] | None:
        """For a get of the newest checkpoint, the projection's answer, read while the read learns where the
        log ends (the two round trips overlap), unless a view the read API kept of the thread will do."""
        state = self._state
        if body.checkpoint_id is not None or state.views is None or not state.settings.api_read_through_max_bytes:
            return None
        stored = self._tenant.thread(body.thread_id)
        key = await state.record_key_of_thread(self._tenant.name, stored)
        partition = await state.barrier.partition_of(state.settings.checkpoint_topic, key)
        if state.views.usable(key, None, partition) is not None:
            return None
        newest = self._newest_base(stored, body.checkpoint_ns, partition, key)
        return asyncio.create_task(newest, name="a get's read of the projection's newest checkpoint")

    async def _get_through(
        self,
        body: GetRequest,
        settled: Settled,
        started: asyncio.Task[Base | thread.Underivable] | None,
        erased_started: asyncio.Task[bool] | None,
    ) -> GetAnswer | thread.Underivable:
        """The get's answer at the log's end: a view of the thread the read API kept, or the projection's
        answer in a snapshot at its applied offset, with the thread's records since folded in (unless the
        fold cannot: the read then waits).

        A get by id of a checkpoint the projection does not hold yet folds from the newest checkpoint the
        projection holds, through the records, to the one asked for (`thread.fold_to_checkpoint`)."""
        state = self._state
        assert settled.tail is not None and state.views is not None
        stored = self._tenant.thread(body.thread_id)
        ns, checkpoint_id = body.checkpoint_ns, body.checkpoint_id
        key = await state.record_key_of_thread(self._tenant.name, stored)
        if checkpoint_id is None:
            found = await self._newest_view(body, settled, key, started)
        else:
            found = await self._one_view(body, settled)
        if isinstance(found, thread.Underivable):
            return found
        view, through = found
        if view.erased:
            return GetAnswer(settled.partition, through, None, erased=True)
        held = view.namespace(ns)
        if isinstance(held, thread.Underivable):
            return held
        answered = held.answer(body.thread_id, ns, checkpoint_id)
        if isinstance(answered, thread.Underivable):
            return answered
        if checkpoint_id is None:
            state.views.keep(key, KeptView(settled.partition, through, view))
        if answered is None and await self._erased_of(body.thread_id, erased_started):
            return GetAnswer(settled.partition, through, None, erased=True)
        if checkpoint_id is not None:
            return GetAnswer(settled.partition, through, answered)
        ceilings = dict(held.ceilings) if held.ceilings is not None else None
        namespaces = None
        if view.complete:
            namespaces = sorted(n for n, kept in view.namespaces.items() if kept is None or kept.newest or kept.writes)
        holding = Holding(_later_writes_of(held), ceilings, namespaces)
        return GetAnswer(settled.partition, through, answered, holding=holding, basis=thread.basis_of(view, ns))

    async def _newest_view(
        self, body: GetRequest, settled: Settled, key: bytes, started: asyncio.Task[Base | thread.Underivable] | None
    ) -> tuple[thread.View, int] | thread.Underivable:
        """The thread's view at the log's end (or later: as of the offset returned with it), able to answer
        the namespace's newest checkpoint: from the view kept of it, else from the projection (`started`, or
        read now)."""
        state = self._state
        assert settled.tail is not None and state.views is not None
        stored, ns = self._tenant.thread(body.thread_id), body.checkpoint_ns
        kept = state.views.usable(key, settled.tail, settled.partition)
        if kept is not None:
            events = await self._thread_events(settled, stored, kept.through)
            if not isinstance(events, thread.Underivable):
                view = _fold(kept.view, events)
                if not isinstance(view.namespace(ns), thread.Underivable):
                    return view, settled.end
        for _ in range(2):
            if started is None:
                started = asyncio.create_task(self._newest_base(stored, ns, settled.partition, key))
            based = await started
            if isinstance(based, thread.Underivable):
                return based
            if based.applied >= settled.tail.start:
                events = await self._thread_events(settled, stored, based.applied)
                if isinstance(events, thread.Underivable):
                    return events
                view = thread.from_answer(
                    ns, based.answer, based.namespaces, ceilings=based.ceilings, basis=based.basis
                )
                return _fold(view, events), max(based.applied, settled.end)
            started = None  # the projection moved on while the read began: read it again
        return thread.Underivable("the projection moved on twice while the read began")

    async def _one_view(self, body: GetRequest, settled: Settled) -> tuple[thread.View, int] | thread.Underivable:
        """The view of one checkpoint (a get by id) at the log's end (or later: as of the offset returned with
        it)."""
        tenant = self._tenant
        stored, ns, checkpoint_id = tenant.thread(body.thread_id), body.checkpoint_ns, body.checkpoint_id
        assert checkpoint_id is not None
        async with snapshot(self._state.pool) as conn:
            applied = await self._applied(conn, settled.partition)
            cursor = await conn.execute(THREAD_BASIS_SQL, {"thread": stored, "ns": ns}, binary=True)
            basis = _basis(await cursor.fetchone())
            saver = self._saver(conn)
            found = await saver.aget_tuple(body.config(tenant.thread))
            base = wire_tuple(found, tenant) if found else None
            if base is None:
                newest_config: RunnableConfig = {"configurable": {"thread_id": stored, "checkpoint_ns": ns}}
                found = await saver.aget_tuple(newest_config)
                newest = wire_tuple(found, tenant) if found else None
                if await _early_writes(conn, stored, ns, newest):
                    return thread.Underivable(EARLY_WRITES)
                namespaces, ceilings = await _namespaces_and_ceilings_on(conn, stored, ns)
        events = await self._thread_events(settled, stored, applied)
        if isinstance(events, thread.Underivable):
            return events
        through = max(applied, settled.end)
        if base is None:
            start = thread.from_answer(ns, newest, namespaces, ceilings=ceilings, basis=basis)
            one = thread.fold_to_checkpoint(start, events, ns, checkpoint_id)
            return one if isinstance(one, thread.Underivable) else (one, through)
        view = thread.from_answer(ns, base, basis=basis)
        for event in events:
            view = thread.apply_to_checkpoint(view, event, ns, checkpoint_id)
        return view, through

    async def _newest_base(self, stored: str, ns: str, partition: int, key: bytes) -> Base | thread.Underivable:
        """The applied offset, the newest checkpoint's answer, the namespaces, the blob ceilings and whether
        the thread (its record `key`) was erased, in one snapshot; unless the projection holds writes before
        their put, or a checkpoint before format 4, which the fold cannot start from."""
        state = self._state
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
            return thread.Underivable(EARLY_WRITES)
        namespaces = _listed(row["namespaces"])
        basis = _basis(row)
        if row["checkpoint_id"] is None:
            return Base(row["applied"], None, namespaces, row["ceilings"], row["erased"], basis)
        if row["checkpoint"]["v"] < 4 and row["parent_checkpoint_id"]:
            # Read with its parent's pending sends: a second statement, so a second snapshot.
            return thread.Underivable("a checkpoint before format 4 is read with its parent's pending sends")
        found = await self._saver()._load_checkpoint_tuple(row)
        answer = wire_tuple(found, self._tenant)
        return Base(row["applied"], answer, namespaces, row["ceilings"], row["erased"], basis)

    async def _basis(self, stored_thread_id: str, checkpoint_ns: str) -> Basis:
        """What the one-writer rule holds of the thread now, the lead of `checkpoint_ns` with it."""
        async with self._state.pool.connection() as conn:
            cursor = await conn.execute(
                THREAD_BASIS_SQL, {"thread": stored_thread_id, "ns": checkpoint_ns}, binary=True
            )
            return _basis(await cursor.fetchone())

    async def _later_writes(self, stored_thread_id: str, checkpoint_ns: str, newest: str) -> LaterWrites | None:
        """The pending writes of the namespace's checkpoints newer than `newest`, the answer's (None: more
        than `MAX_LATER_WRITES` rows, which the client then does not hold), by checkpoint id."""
        params = {"thread": stored_thread_id, "ns": checkpoint_ns, "newest": newest, "most": MAX_LATER_WRITES + 1}
        async with self._state.pool.connection() as conn:
            rows = await (await conn.execute(LATER_WRITES_SQL, params, binary=True)).fetchall()
        if len(rows) > MAX_LATER_WRITES:
            return None
        later: LaterWrites = {}
        for row in rows:
            later.setdefault(row["checkpoint_id"], []).append(
                [row["task_id"], row["channel"], typed(row["type"], row["blob"]), row["task_path"], row["idx"]]
            )
        return later

    async def _namespaces_and_ceilings(
        self, stored_thread_id: str, checkpoint_ns: str
    ) -> tuple[list[str] | None, dict[str, int]]:
        """Every namespace the thread has a checkpoint or a pending write in (None: more than `MAX_NAMESPACES`),
        and the blob ceilings of `checkpoint_ns`, in one statement. Read after the answer: a namespace or a
        blob row stored since only adds to them."""
        async with self._state.pool.connection() as conn:
            return await _namespaces_and_ceilings_on(conn, stored_thread_id, checkpoint_ns)

    async def _erased_of(self, thread_id: str, started: asyncio.Task[bool] | None) -> bool:
        """`_erased`, asked when the read began (`started`) or now."""
        return await (started if started is not None else self._erased(thread_id))

    async def _erased_in(self, base: asyncio.Task[Base | thread.Underivable], thread_id: str) -> bool:
        """`_erased`, as the projection's snapshot `base` read it (asked on its own when `base` has none)."""
        based = await asyncio.shield(base)
        return based.erased if isinstance(based, Base) else await self._erased(thread_id)

    async def _erased(self, thread_id: str) -> bool:
        """Whether the thread was erased (the client then refuses its writes at once)."""
        state = self._state
        if state.keys is None:
            return False
        stored = self._tenant.thread(thread_id)
        ref = (await state.record_key_of_thread(self._tenant.name, stored)).decode()  # a thread's reference
        return (await state.keys.store.find([ref])).get(ref) is ERASED

    # -- list ---------------------------------------------------------------------------------------

    async def list_tuples(self, body: ListRequest) -> ListAnswer:
        """`AsyncPostgresSaver.alist`, newest first; at most `api_max_result_items` (more: 413, page with
        `limit` and `before_checkpoint_id`)."""
        state, tenant = self._state, self._tenant
        settings = state.settings
        cap = settings.api_max_result_items
        limit = cap + 1 if body.limit is None or body.limit > cap else body.limit
        if body.thread_id is not None:
            await self._settle_thread(tenant.thread(body.thread_id))
        else:
            await state.barrier.before_topic(settings.checkpoint_topic, self._token, tenant=tenant.name)
        saver = self._saver()
        found = [
            t
            async for t in saver.alist(
                body.config(tenant.thread), filter=body.filter, before=body.before(), limit=limit
            )
        ]
        if len(found) > cap:
            raise ApiError(
                413,
                "result_too_large",
                f"more than {cap} checkpoints match (GRAPHLEDGER_API_MAX_RESULT_ITEMS); "
                "page with limit and before_checkpoint_id",
            )
        return ListAnswer([wire_tuple(t, tenant) for t in found])

    # -- the one-writer rule's verdicts ---------------------------------------------------------------

    async def verdicts(self, body: VerdictsRequest) -> VerdictsAnswer:
        """Which of the caller's records of a thread the one-writer rule refused, once the projection applied
        them: how a client that does not read the log (a tenant's) learns its refusals."""
        state, tenant = self._state, self._tenant
        topic, stored = state.settings.checkpoint_topic, tenant.thread(body.thread_id)
        key = await state.record_key_of_thread(tenant.name, stored)
        partition = await state.barrier.partition_of(topic, key)
        if partition != body.partition:
            raise ApiError(
                400, "wrong_partition", f"thread {body.thread_id!r} is on partition {partition}, not {body.partition}"
            )
        await state.barrier.applied_through(topic, partition, max(body.offsets), key, tenant=tenant.name)
        params = {"topic": topic, "partition": partition, "offsets": body.offsets, "thread": stored}
        async with state.pool.connection() as conn:
            cursor = await conn.execute(REFUSALS_SQL, params, binary=True)
            rows = await cursor.fetchall()
        return VerdictsAnswer(
            [
                RefusedWrite(
                    row["offset"], row["reason"], None if row["superseded_by"] is None else bytes(row["superseded_by"])
                )
                for row in rows
            ]
        )

    # -- DeltaChannel history -----------------------------------------------------------------------

    async def delta_history(self, body: DeltaHistoryRequest) -> DeltaHistoryAnswer:
        """`AsyncPostgresSaver.aget_delta_channel_history`."""
        state, tenant = self._state, self._tenant
        settled = await self._settle_thread(tenant.thread(body.thread_id), through=True)
        if settled.tail is not None and settled.need is not None:
            folded = await self._history_through(body, settled)
            if not isinstance(folded, thread.Underivable):
                return DeltaHistoryAnswer(folded)
            log.debug("a DeltaChannel history of thread %r waits for the projection: %s", body.thread_id, folded.reason)
            await state.barrier.wait(settled, state.settings.checkpoint_topic, tenant=tenant.name)
        history = await self._saver().aget_delta_channel_history(
            config=body.config(tenant.thread), channels=body.channels
        )
        return DeltaHistoryAnswer(_history(history))

    async def _history_through(
        self, body: DeltaHistoryRequest, settled: Settled
    ) -> dict[str, ChannelHistory] | thread.Underivable:
        """The DeltaChannel history at the log's end: the projection's newest checkpoint and its history in a
        snapshot at its applied offset, the thread's records since folded in (unless the fold cannot)."""
        tenant = self._tenant
        stored = tenant.thread(body.thread_id)
        ns = body.checkpoint_ns
        newest_config: RunnableConfig = {"configurable": {"thread_id": stored, "checkpoint_ns": ns}}
        async with snapshot(self._state.pool) as conn:
            applied = await self._applied(conn, settled.partition)
            cursor = await conn.execute(THREAD_BASIS_SQL, {"thread": stored, "ns": ns}, binary=True)
            basis = _basis(await cursor.fetchone())
            saver = self._saver(conn)
            found = await saver.aget_tuple(newest_config)
            base = wire_tuple(found, tenant) if found else None
            if await _early_writes(conn, stored, ns, base):
                return thread.Underivable(EARLY_WRITES)  # a child's history holds them, the answer does not
            answered: dict[str, ChannelHistory] = {}
            ceilings = await _ceilings_on(conn, stored, ns)
            if base is not None:
                at_newest = {**newest_config["configurable"], "checkpoint_id": base["config"]["checkpoint_id"]}
                history = await saver.aget_delta_channel_history(
                    config={"configurable": at_newest},
                    channels=body.channels,
                )
                answered = _history(history)
        events = await self._thread_events(settled, stored, applied)
        if isinstance(events, thread.Underivable):
            return events
        held = thread.namespace_of(base, ceilings=ceilings)
        if base is not None:
            held = thread.with_history(held, base["config"]["checkpoint_id"], answered)
        head = base["config"]["checkpoint_id"] if base is not None else None
        ledger = thread.ledger_of(ns, basis, head)
        folded = _fold(thread.view({ns: held}, False, ledger=ledger), events).namespace(ns)
        if isinstance(folded, thread.Underivable):
            return folded
        return folded.delta_history(body.checkpoint_id, body.channels)

    # -- shared -------------------------------------------------------------------------------------

    def _saver(self, conn: AsyncConnection[Any] | None = None) -> TenantSaver:
        """The official saver on the pool, or on `conn` (a snapshot's connection)."""
        return saver_for(self._tenant, self._state.pool if conn is None else conn)

    async def _settle_thread(
        self, thread_id: str, own: OwnWrites | None = None, cached_through: int | None = None, *, through: bool = False
    ) -> Settled:
        """Wait until the projection reflects the thread as the log holds it now (less `own`); `through`:
        unless the read API holds the thread's unprojected records (then `Settled.tail`)."""
        state, tenant = self._state, self._tenant.name
        key = await state.record_key_of_thread(tenant, thread_id)
        read = KeyedRead(state.settings.checkpoint_topic, key, own, cached_through)
        return (await state.barrier.before_keyed([read], self._token, tenant=tenant, through=through))[read]

    async def _applied(self, conn: AsyncConnection[Any], partition: int) -> int:
        settings = self._state.settings
        return await snapshot_offset(conn, settings.projector_group_id, settings.checkpoint_topic, partition)

    async def _thread_events(
        self, settled: Settled, stored_thread_id: str, since: int
    ) -> list[CheckpointEvent] | thread.Underivable:
        """The thread's events among its unprojected records at or after `since`."""
        state = self._state
        assert settled.tail is not None and state.tail_events is not None
        if since < settled.tail.start:
            return thread.Underivable(f"records from {since} on are no longer all held")
        key = await state.record_key_of_thread(self._tenant.name, stored_thread_id)
        events = await state.tail_events.events(settled.tail, since)
        if isinstance(events, thread.Underivable):
            return events
        return thread_events_to_fold(events, stored_thread_id, key.decode())


def _fold(view: thread.View, events: Sequence[CheckpointEvent]) -> thread.View:
    for event in events:
        view = thread.apply(view, event)
    return view


def _later_writes_of(held: thread.Namespace) -> LaterWrites | None:
    """`later_writes` of a folded namespace: the writes of checkpoints newer than its newest, which
    reached the log before their put (None: more than `MAX_LATER_WRITES`, as from the projection)."""
    newest = held.newest.checkpoint_id if held.newest is not None else ""
    later = {cid: [list(row) for row in rows] for cid, rows in held.writes.items() if cid > newest}
    return later if sum(len(rows) for rows in later.values()) <= MAX_LATER_WRITES else None


async def _early_writes(conn: AsyncConnection[Any], stored: str, ns: str, newest: dict[str, Any] | None) -> bool:
    newest_id = newest["config"]["checkpoint_id"] if newest is not None else ""
    cursor = await conn.execute(EARLY_WRITES_SQL, {"thread": stored, "ns": ns, "newest": newest_id})
    row = await cursor.fetchone()
    return row is not None and bool(row["early"])


async def _false() -> bool:
    return False


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


def _basis(row: Mapping[str, Any] | None) -> Basis:
    assert row is not None, "THREAD_BASIS_SQL answers one row for any thread"
    lead, writer = row["lead"], row["lead_writer"]
    return Basis(
        row["operations"],
        None if lead is None else bytes(lead),
        row["lead_run"],
        row["lead_id"],
        None if writer is None else bytes(writer),
    )


def _listed(names: list[str]) -> list[str] | None:
    """The thread's namespaces as a get answers them: None when there are more than `MAX_NAMESPACES`."""
    return names if len(names) <= MAX_NAMESPACES else None


def _history(history: Mapping[str, DeltaChannelHistory]) -> dict[str, ChannelHistory]:
    """The official saver's DeltaChannel history, as the read API answers it."""
    return {
        channel: ChannelHistory(
            [[task_id, ch, to_wire(v)] for task_id, ch, v in entry["writes"]],
            to_wire(entry["seed"]) if "seed" in entry else None,
        )
        for channel, entry in history.items()
    }
