"""The reads of one `/v1/store/batch` request, each reflecting what the log held when the batch arrived
(`consistency/read_barrier.py`).

A get of an item with records the projection has not applied answers at the log's end without waiting: the
projection's row and the item's records since, folded (`store_through.py`); one the fold cannot answer waits
for them. A search or listing waits for the end of every store partition (and then the batch's gets are
answered by the projection alone), unless the batch asks for `own_writes` consistency (then only its
consistency token, the caller's own writes). The statements run on `StoreReader` (`store_reader.py`).
"""

from __future__ import annotations

import asyncio
import logging

from graphledger.answers import StoreResult
from graphledger.folds import thread
from graphledger.tasks import drop_speculative
from graphledger.wire import Token
from graphledger_server.api.consistency.read_barrier import KeyedRead, Settled
from graphledger_server.api.reads.store_through import items_through
from graphledger_server.api.state import ApiState
from graphledger_server.api.store_models import GetOp
from graphledger_server.api.tenant import StoreOp
from graphledger_server.telemetry import api as telemetry

log = logging.getLogger(__name__)


class StoreBatchReads:
    """The store reads of one request: its tenant's (`tenant`, the name), and its consistency token."""

    def __init__(self, state: ApiState, tenant: str, token: Token) -> None:
        self._state = state
        self._tenant = tenant
        self._token = token

    async def read(self, ops: list[StoreOp], *, own_writes: bool) -> list[StoreResult]:
        """The ops' results, each reflecting what it must (the module docstring); `own_writes`: searches and
        listings reflect only the consistency token."""
        state, tenant = self._state, self._tenant
        topic = state.settings.store_topic
        if not own_writes and any(not isinstance(op, GetOp) for op in ops):
            return await self._read_at_topic_end(ops)
        gets = {
            i: KeyedRead(topic, await state.item_key(tenant, tuple(op.namespace), op.key))
            for i, op in enumerate(ops)
            if isinstance(op, GetOp)
        }
        reads = list(dict.fromkeys(gets.values()))
        settled = await state.barrier.before_keyed(reads, self._token, tenant=tenant, through=True)
        through = {i: settled[read] for i, read in gets.items() if settled[read].need is not None}
        return await self._results(ops, through)

    async def _read_at_topic_end(self, ops: list[StoreOp]) -> list[StoreResult]:
        """Ops that wait for the end of every store partition (a search or listing, and the gets beside it).

        They run on the projection while the log's end is fetched, the two round trips overlapping: if the
        projection had reached that end already when they began (steady state, and between bursts of
        writes), their answer stands; else they wait for it and run again. What is left of a search's cost
        beside the official store's is the HTTP hop and the log-end fetch beyond the query's own time."""
        state, token = self._state, self._token
        topic = state.settings.store_topic
        since = await state.barrier.positions(topic)
        # Nothing awaited between reading the positions and starting the ops: they see at least that much.
        searches: list[tuple[str, float]] = []
        early = None
        if not state.offsets.missing(token):
            early = asyncio.create_task(state.store_reader.run(ops, searches), name="a store batch read ahead")
        try:
            at_end = await state.barrier.before_topic(topic, token, tenant=self._tenant, since=since)
        except BaseException:
            await drop_speculative(log, early, cancel=False)
            raise
        if early is not None:
            if at_end:
                answer = await early
                telemetry.store_searches(searches)
                return answer
            await drop_speculative(log, early, cancel=False)
        return await state.store_reader.run(ops)

    async def _results(self, ops: list[StoreOp], through: dict[int, Settled]) -> list[StoreResult]:
        """The ops' results: the projection's, and for the gets in `through` the folded item (or, when the fold
        cannot answer, the projection's once it applied the item's records)."""
        state = self._state
        results: list[StoreResult] = [None] * len(ops)
        plain = [i for i in range(len(ops)) if i not in through]
        if through:
            assert state.tail_events is not None and state.store_events is not None
            gets = [
                (op, settled) for i, settled in through.items() if isinstance(op := ops[i], GetOp)
            ]  # `through` holds gets only
            folded = await items_through(state.settings, state.store_pool, state.tail_events, state.store_events, gets)
            for (i, settled), found in zip(through.items(), folded, strict=True):
                if isinstance(found, thread.Underivable):
                    await state.barrier.wait(settled, state.settings.store_topic, tenant=self._tenant)
                    plain.append(i)
                else:
                    results[i] = found
        if plain:
            plain.sort()
            for i, result in zip(plain, await state.store_reader.run([ops[i] for i in plain]), strict=True):
                results[i] = result
        return results
