"""Store gets at the log's end: the projection's rows and the items' unprojected records, folded.

A get whose item has records the projection has not applied (`read_barrier.Settled.tail`) reads the
item's row (expired or not) and the projection's applied offsets in one repeatable-read snapshot, then
folds the item's records since (`graphledger.folds.store_item`), decoded as the projector decodes them
(`read_through.RecordOpener`, with the store projection's own validation, `StoreEvents`). A get the
fold cannot answer (a namespace's erasure among the records, or records no longer all held) is
`WAIT`: it waits for the projection, as every store search and listing does.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Final, assert_never

import asyncpg

from graphledger.events.envelope import Envelope
from graphledger.events.erasure import NamespaceErase, TenantErase
from graphledger.events.store import StoreDelete, StoreExpire, StorePut, StoreRefresh
from graphledger.folds import store_item, thread
from graphledger.settings import Settings
from graphledger_server.api import store_sql
from graphledger_server.api.read_barrier import Settled
from graphledger_server.api.read_through import RecordOpener
from graphledger_server.api.store_models import GetOp
from graphledger_server.log.offsets import OffsetStatements, next_offsets
from graphledger_server.projection.store import StoreProjection, TimedStoreEvent

log = logging.getLogger(__name__)

WAIT: Final = object()
"""A get the fold cannot answer: it waits for the projection."""


class StoreEvents:
    """The store projection's `to_event` (what it refuses is dead-lettered, so it folds nothing), ready
    once the schema's vector table is known (`ready`)."""

    def __init__(self, settings: Settings, pool: asyncpg.Pool) -> None:
        self._projection = StoreProjection(settings.postgres_schema, settings.erasure_namespace_depth)
        self._pool = pool
        self._prepared = False

    async def ready(self) -> None:
        if not self._prepared:
            async with self._pool.acquire() as conn:
                await self._projection.prepare(conn)
            self._prepared = True

    def to_event(self, env: Envelope, appended_ms: int) -> TimedStoreEvent:
        return self._projection.to_event(env, appended_ms)


async def items_through(
    settings: Settings,
    pool: asyncpg.Pool,
    opener: RecordOpener,
    events: StoreEvents,
    gets: Sequence[tuple[GetOp, Settled]],
) -> list[Any]:
    """Each get's item (the read API's answer, None: none) at the log's end, or `WAIT`."""
    await events.ready()
    topic, schema = settings.store_topic, settings.postgres_schema
    items = [(".".join(op.namespace), op.key) for op, _ in gets]
    async with pool.acquire() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
        partitions = {(topic, settled.partition) for _, settled in gets}
        applied = await next_offsets(conn, OffsetStatements(schema), settings.projector_group_id, partitions)
        sql, args = store_sql.item_rows_statement(schema, list(dict.fromkeys(items)))
        rows = {(row["prefix"], row["key"]): row for row in await conn.fetch(sql, *args)}
    answers: list[Any] = []
    for (op, settled), item in zip(gets, items, strict=True):
        row = rows[item]
        try:
            found = await _folded(opener, op, settled, applied.get((topic, settled.partition), 0), row)
        except thread.Underivable as exc:
            log.debug("a store get of %s waits for the projection: %s", item, exc)
            answers.append(WAIT)
            continue
        answers.append(found.answer() if found is not None and found.visible(row["now"]) else None)
    return answers


async def _folded(
    opener: RecordOpener, op: GetOp, settled: Settled, since: int, row: asyncpg.Record
) -> store_item.Item | None:
    tail = settled.tail
    assert tail is not None
    if since < tail.start:
        raise thread.Underivable(f"records from {since} on are no longer all held")
    item = None
    if row["created_at"] is not None:
        item = store_item.Item(
            row["prefix"], row["key"], row["value"], row["created_at"], row["updated_at"], row["expires_at"], row["ttl"]
        )
    namespace = tuple(op.namespace)
    for _, timed in await opener.events(tail, since):
        event = timed.event
        match event:
            case StorePut() | StoreDelete() | StoreRefresh() | StoreExpire():
                if (event.namespace, event.item_key) != (namespace, op.key):
                    continue  # keyed like the item, but another's (a hash collision, a hostile producer)
            case NamespaceErase() | TenantErase():
                pass  # keyless: every item's
            case _:
                assert_never(event)
        item = store_item.apply(item, event, timed.ts_ms)
    return item
