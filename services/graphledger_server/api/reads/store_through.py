"""Store gets at the log's end: the projection's rows and the items' unprojected records, folded.

A get whose item has records the projection has not applied (`consistency/read_barrier.Settled.tail`)
reads the item's row (expired or not) and the projection's applied offsets in one repeatable-read
snapshot, then folds the item's records since (`graphledger.folds.store_item`), decoded as the projector
decodes them (`consistency/read_through.TailEvents`, with the store projection's own validation,
`opening/store_events.py`). A get the fold cannot answer (a namespace's erasure among the records, or
records no longer all held) is `WAIT`: it waits for the projection, as every store search and listing does.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Final, assert_never

import asyncpg

from graphledger.events.erasure import NamespaceErase, TenantErase
from graphledger.events.store import StoreDelete, StoreExpire, StorePut, StoreRefresh
from graphledger.folds import store_item, thread
from graphledger.settings import Settings
from graphledger_server.api.consistency.read_barrier import Settled
from graphledger_server.api.consistency.read_through import TailEvents
from graphledger_server.api.reads import store_sql
from graphledger_server.api.store_models import GetOp
from graphledger_server.log.offsets import OffsetStatements, next_offsets
from graphledger_server.opening.store_events import StoreEvents

log = logging.getLogger(__name__)

WAIT: Final = object()
"""A get the fold cannot answer: it waits for the projection."""


async def items_through(
    settings: Settings,
    pool: asyncpg.Pool,
    tail_events: TailEvents,
    events: StoreEvents,
    gets: Sequence[tuple[GetOp, Settled]],
) -> list[Any]:
    """Each get's item (the read API's answer, None: none) at the log's end, or `WAIT`."""
    if not events.prepared:
        async with pool.acquire() as conn:
            await events.prepare(conn)
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
            found = await _folded(tail_events, op, settled, applied.get((topic, settled.partition), 0), row)
        except thread.Underivable as exc:
            log.debug("a store get of %s waits for the projection: %s", item, exc)
            answers.append(WAIT)
            continue
        answers.append(found.answer() if found is not None and found.visible(row["now"]) else None)
    return answers


async def _folded(
    tail_events: TailEvents, op: GetOp, settled: Settled, since: int, row: asyncpg.Record
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
    for _, timed in await tail_events.events(tail, since):
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
