"""Store gets at the log's end: the projection's rows and the items' unprojected records, folded.

A get whose item has records the projection has not applied (`consistency/read_barrier.Settled.tail`)
reads the item's row (expired or not) and the projection's applied offsets in one repeatable-read
snapshot, then folds the item's records since (`graphledger.folds.store_item`), decoded as the projector
decodes them (`consistency/read_through.TailEvents`, with the store projection's own validation,
`opening/store_events.py`). A get the fold cannot answer (a namespace's erasure among the records, or
records no longer all held) is `thread.Underivable`: it waits for the projection, as every store search and
listing does.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import assert_never

import asyncpg

from graphledger.answers import ItemAnswer
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


async def items_through(
    settings: Settings,
    pool: asyncpg.Pool,
    tail_events: TailEvents,
    events: StoreEvents,
    gets: Sequence[tuple[GetOp, Settled]],
) -> list[ItemAnswer | thread.Underivable | None]:
    """Each get's item at the log's end (the read API's answer; None: none), or why the fold cannot answer it."""
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
    answers: list[ItemAnswer | thread.Underivable | None] = []
    for (op, settled), item in zip(gets, items, strict=True):
        row = rows[item]
        found = await _folded(tail_events, op, settled, applied.get((topic, settled.partition), 0), row)
        match found:
            case thread.Underivable(reason):
                log.debug("a store get of %s waits for the projection: %s", item, reason)
                answers.append(found)
            case store_item.Item():
                answers.append(found.answer() if found.visible(row["now"]) else None)
            case None:
                answers.append(None)
            case _:
                assert_never(found)
    return answers


async def _folded(
    tail_events: TailEvents, op: GetOp, settled: Settled, since: int, row: asyncpg.Record
) -> store_item.Item | thread.Underivable | None:
    tail = settled.tail
    assert tail is not None
    if since < tail.start:
        return thread.Underivable(f"records from {since} on are no longer all held")
    item: store_item.Item | None = None
    if row["created_at"] is not None:
        item = store_item.Item(
            row["prefix"], row["key"], row["value"], row["created_at"], row["updated_at"], row["expires_at"], row["ttl"]
        )
    namespace = tuple(op.namespace)
    events = await tail_events.events(tail, since)
    if isinstance(events, thread.Underivable):
        return events
    for _, timed in events:
        event = timed.event
        match event:
            case StorePut() | StoreDelete() | StoreRefresh() | StoreExpire():
                if (event.namespace, event.item_key) != (namespace, op.key):
                    continue  # keyed like the item, but another's (a hash collision, a hostile producer)
            case NamespaceErase() | TenantErase():
                pass  # keyless: every item's
            case _:
                assert_never(event)
        applied = store_item.apply(item, event, timed.ts_ms)
        if isinstance(applied, thread.Underivable):
            return applied
        item = applied
    return item
