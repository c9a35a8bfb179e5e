"""The store projection: store events applied set-based into `store` and `store_vectors`.

A batch's store events are one run: puts and deletes of different items commute, and the events of
one item are merged here (pure) into the effect applying them one by one would have, so the run costs
one statement per table however many events it holds.

Merging one item's events in log order:
- the last event decides whether the item exists (a delete) or what it holds (a put);
- `created_at` is the first put after the item's last delete in the run (its `created_ms` if it
  carries one, as an imported item does, else its time); without a delete in the run, an existing
  row keeps its own (`reset` says which);
- vectors: the last put that carried a list replaces every vector row of the item; puts with
  `vectors` null keep what is there (as both official stores do on `index=False`), unless a delete in
  the run removed it.

`store.refresh` and `store.expire` depend on the row they find, so they apply after the puts before
them (`plan_segments`): a refresh restarts the TTL at its event's time, an expire deletes only what
is still expired at its decision time. Both compare event times, never `now()`, so a replay
computes the same `expires_at` and removes the same items.

Timestamps come from each event's time, the broker's at its first append (`envelope.append_time_ms`):
never `now()`, so a replay writes identical rows whatever its batch boundaries, and never the writer's
clock (the envelope's `ts`), so a writer whose clock is off neither shortens nor stretches a TTL. Vector
rows take the time of the put that wrote them for both `created_at` and `updated_at` (the official store
keeps a vector row's `created_at` across re-puts, which would make it depend on how a replay batches). A
put whose vectors do not fit the schema's vector table (other dims, or no table at all) is refused in
`to_event`, so it is dead-lettered with a reason naming the dims instead of failing its batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, assert_never

import asyncpg

from graphledger.erasure.subjects import LABEL_SEPARATOR, namespace_subject_depth
from graphledger.events.envelope import Envelope
from graphledger.events.erasure import NamespaceErase, TenantErase
from graphledger.events.store import (
    StoreDelete,
    StoreExpire,
    StorePut,
    StoreRefresh,
    Vector,
)
from graphledger.settings import DEFAULT_ERASURE_NAMESPACE_DEPTH
from graphledger_server.opening.store_events import StoreEvents, TimedStoreEvent, prefix_of
from graphledger_server.opening.vector_index import (
    VectorIndex,
    load_extension_schema,
)
from graphledger_server.projection import erasure
from graphledger_server.sql import render

# $1/$2 -> unnest(prefix, key) of the items whose last event is a delete (their vectors cascade).
# $3..$8 -> unnest(prefix, key, value, ts_ms, created_ms, ttl_minutes) of the items whose last event is
# a put; $9/$10 -> unnest(prefix, key) of those put after a delete in the run, whose existing row's
# created_at is replaced (a hashed subplan, usually empty). The two parts touch disjoint rows, so
# one statement applies both.
APPLY_ITEMS_SQL = """
WITH deleted AS (
    DELETE FROM {schema}.store s
    USING unnest($1::text[], $2::text[]) AS d(prefix, key)
    WHERE s.prefix = d.prefix AND s.key = d.key
)
INSERT INTO {schema}.store AS s
    (prefix, key, value, created_at, updated_at, expires_at, ttl_minutes, graphledger_ttl_minutes)
SELECT u.prefix, u.key, u.value::jsonb,
       'epoch'::timestamptz + u.created_ms * interval '1 millisecond',
       'epoch'::timestamptz + u.ts_ms * interval '1 millisecond',
       'epoch'::timestamptz + u.ts_ms * interval '1 millisecond' + u.ttl * interval '1 minute',
       u.ttl::int, u.ttl
FROM unnest($3::text[], $4::text[], $5::text[], $6::bigint[], $7::bigint[], $8::float8[])
    AS u(prefix, key, value, ts_ms, created_ms, ttl)
ON CONFLICT (prefix, key) DO UPDATE SET
    value = EXCLUDED.value,
    created_at = CASE
        WHEN (s.prefix, s.key) IN (SELECT * FROM unnest($9::text[], $10::text[])) THEN EXCLUDED.created_at
        ELSE s.created_at
    END,
    updated_at = EXCLUDED.updated_at,
    expires_at = EXCLUDED.expires_at,
    ttl_minutes = EXCLUDED.ttl_minutes,
    graphledger_ttl_minutes = EXCLUDED.graphledger_ttl_minutes
"""

# store.refresh: the TTL restarts at the event's time, for items with a TTL still live then; never
# shorter (a later put's lifetime stays). The exact TTL, else the official INT one (rows written
# before migration 0003). $1..$3 -> unnest(prefix, key, ts_ms), distinct items.
REFRESH_SQL = """
UPDATE {schema}.store s
SET expires_at = greatest(
    s.expires_at,
    'epoch'::timestamptz + u.ts_ms * interval '1 millisecond'
        + coalesce(s.graphledger_ttl_minutes, s.ttl_minutes) * interval '1 minute'
)
FROM unnest($1::text[], $2::text[], $3::bigint[]) AS u(prefix, key, ts_ms)
WHERE s.prefix = u.prefix AND s.key = u.key
  AND s.expires_at > 'epoch'::timestamptz + u.ts_ms * interval '1 millisecond'
"""

# store.expire: the item (and, by cascade, its vectors) only if it is still expired at the sweeper's
# decision time; a put or refresh applied since has moved expires_at past it, or cleared it.
# $1..$3 -> unnest(prefix, key, at_ms), distinct items.
EXPIRE_SQL = """
DELETE FROM {schema}.store s
USING unnest($1::text[], $2::text[], $3::bigint[]) AS u(prefix, key, at_ms)
WHERE s.prefix = u.prefix AND s.key = u.key
  AND s.expires_at <= 'epoch'::timestamptz + u.at_ms * interval '1 millisecond'
"""

# The vector rows of items whose vectors are replaced: $1..$4 -> unnest(prefix, key, field_name, ts_ms)
# of the new rows, $5 all their embeddings concatenated (dims $6 each), $7/$8 -> unnest(prefix, key)
# of every replaced item (some have no new rows). Rows of a replaced item that no new row overwrites
# are deleted; the others are upserted: disjoint rows, one statement. `{ext}` is pgvector's schema
# and `{vector_type}` the column's type, both validated.
REPLACE_VECTORS_SQL = """
WITH fresh AS MATERIALIZED (
    SELECT u.prefix, u.key, u.field_name, u.ts_ms,
           ($5::real[])[(u.i - 1) * $6::int + 1 : u.i * $6::int] AS embedding
    FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[]) WITH ORDINALITY
        AS u(prefix, key, field_name, ts_ms, i)
), stale AS (
    DELETE FROM {schema}.store_vectors sv
    USING unnest($7::text[], $8::text[]) AS r(prefix, key)
    WHERE sv.prefix = r.prefix AND sv.key = r.key
      AND NOT EXISTS (
          SELECT 1 FROM fresh f WHERE f.prefix = sv.prefix AND f.key = sv.key AND f.field_name = sv.field_name
      )
)
INSERT INTO {schema}.store_vectors AS sv (prefix, key, field_name, embedding, created_at, updated_at)
SELECT f.prefix, f.key, f.field_name, f.embedding::{ext}.{vector_type},
       'epoch'::timestamptz + f.ts_ms * interval '1 millisecond',
       'epoch'::timestamptz + f.ts_ms * interval '1 millisecond'
FROM fresh f
ON CONFLICT (prefix, key, field_name) DO UPDATE SET
    embedding = EXCLUDED.embedding,
    created_at = EXCLUDED.created_at,
    updated_at = EXCLUDED.updated_at
"""


# Erasure ($1, $2 -> prefixes as `store.prefix` holds them): the items of each $1 prefix and of the
# namespaces below it (a full-depth subject, a tenant), and the items right in each $2 prefix (a shorter
# subject: those below are subjects of their own). Their vectors go by cascade.
ERASE_PREFIXES_SQL = """
DELETE FROM {schema}.store s
WHERE s.prefix = ANY($1::text[]) OR s.prefix = ANY($2::text[])
   OR EXISTS (SELECT 1 FROM unnest($1::text[]) AS e(prefix) WHERE starts_with(s.prefix, e.prefix || '.'))
"""


# --- plan -------------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Merged:
    """One item's events of a run, merged as sequential application would leave the item."""

    put: StorePut | None
    ts_ms: int
    created_ms: int = 0
    reset: bool = False
    vectors: tuple[Vector, ...] | None = None
    vectors_ms: int = 0


@dataclass(slots=True)
class StoreRun:
    """A run of store events as the column lists of its (at most) two statements."""

    deletes: list[list[Any]] = field(default_factory=lambda: [[], []])
    puts: list[list[Any]] = field(default_factory=lambda: [[], [], [], [], [], []])
    resets: list[list[Any]] = field(default_factory=lambda: [[], []])
    vector_rows: list[list[Any]] = field(default_factory=lambda: [[], [], [], []])
    embeddings: list[float] = field(default_factory=list)
    dims: int = 0
    replaced: list[list[Any]] = field(default_factory=lambda: [[], []])
    events: int = 0


@dataclass(slots=True)
class Maintenance:
    """Consecutive refresh and expire events of distinct items (they commute): two statements."""

    refreshes: list[list[Any]] = field(default_factory=lambda: [[], [], []])
    expires: list[list[Any]] = field(default_factory=lambda: [[], [], []])
    items: set[tuple[str, str]] = field(default_factory=set)


@dataclass(frozen=True, slots=True)
class Erasure:
    """`namespace.erase` (by reference) or `tenant.erase`: their items, then their traces."""

    event: NamespaceErase | TenantErase


Segment = StoreRun | Maintenance | Erasure


def plan_segments(items: Sequence[tuple[str, int, int, TimedStoreEvent]]) -> list[Segment]:
    """Cut a batch into runs of puts/deletes and of refresh/expire events, in log order (pure).

    A refresh or an expire depends on the row it finds, so it waits for the puts before it; an item
    met twice in one maintenance segment starts the next one, so each applies as in sequence.
    """
    segments: list[Segment] = []
    data: list[tuple[str, int, int, TimedStoreEvent]] = []
    upkeep: Maintenance | None = None

    def close_data() -> None:
        nonlocal data
        if data:
            segments.append(plan_run(data))
            data = []

    def close_upkeep() -> None:
        nonlocal upkeep
        if upkeep is not None:
            segments.append(upkeep)
            upkeep = None

    def maintenance(event: StoreRefresh | StoreExpire) -> tuple[Maintenance, tuple[str, str]]:
        """The segment the event joins (a new one if its item is in the open one), and its item."""
        nonlocal upkeep
        close_data()
        target = (prefix_of(event.namespace), event.item_key)
        if upkeep is not None and target in upkeep.items:
            close_upkeep()
        if upkeep is None:
            upkeep = Maintenance()
        upkeep.items.add(target)
        return upkeep, target

    for item in items:
        timed = item[3]
        event = timed.event
        match event:
            case StorePut() | StoreDelete():
                close_upkeep()
                data.append(item)
            case NamespaceErase() | TenantErase():
                close_data()
                close_upkeep()
                segments.append(Erasure(event))
            case StoreRefresh():
                segment, target = maintenance(event)
                _append_row(segment.refreshes, (*target, timed.ts_ms))
            case StoreExpire():
                segment, target = maintenance(event)
                _append_row(segment.expires, (*target, event.at_ms))
            case _:
                assert_never(event)
    close_data()
    close_upkeep()
    return segments


def _append_row(columns: list[list[Any]], row: tuple[Any, ...]) -> None:
    for column, value in zip(columns, row, strict=True):
        column.append(value)


def plan_run(items: Sequence[tuple[str, int, int, TimedStoreEvent]]) -> StoreRun:
    """Merge a run of puts and deletes per item (pure); `items` are in log order."""
    merged: dict[tuple[str, str], _Merged] = {}
    for _topic, _partition, _offset, timed in items:
        event, ts = timed.event, timed.ts_ms
        assert isinstance(event, StorePut | StoreDelete), "refresh and expire are planned by plan_segments"
        item = (prefix_of(event.namespace), event.item_key)
        current = merged.get(item)
        match event:
            case StoreDelete():
                merged[item] = _Merged(None, ts)
            case StorePut() if current is None or current.put is None:
                # The first put of a chain: a new item, or one deleted earlier in this run (reset).
                created = ts if event.created_ms is None else event.created_ms
                merged[item] = _Merged(event, ts, created, current is not None, event.vectors, ts)
            case StorePut():
                current.put, current.ts_ms = event, ts
                if event.vectors is not None:
                    current.vectors, current.vectors_ms = event.vectors, ts
            case _:
                assert_never(event)
    run = StoreRun(events=len(items))
    for (prefix, key), m in merged.items():
        if m.put is None:
            run.deletes[0].append(prefix)
            run.deletes[1].append(key)
            continue
        for column, value in zip(
            run.puts, (prefix, key, m.put.value_json.decode(), m.ts_ms, m.created_ms, m.put.ttl_minutes), strict=True
        ):
            column.append(value)
        if m.reset:
            run.resets[0].append(prefix)
            run.resets[1].append(key)
        if m.vectors is not None or m.reset:
            run.replaced[0].append(prefix)
            run.replaced[1].append(key)
            for field_name, embedding in m.vectors or ():
                row: tuple[Any, ...] = (prefix, key, field_name, m.vectors_ms)
                for column, value in zip(run.vector_rows, row, strict=True):
                    column.append(value)
                run.embeddings.extend(embedding)
                run.dims = len(embedding)
    return run


# --- apply ------------------------------------------------------------------------------------------


class StoreProjection:
    """The store topic's projection, as the batch applier drives it.

    `prepare` must run once before events are classified: it reads the shape of the schema's vector
    table, which `to_event` checks every put against.
    """

    def __init__(self, schema: str, namespace_depth: int = DEFAULT_ERASURE_NAMESPACE_DEPTH) -> None:
        self.schema = schema
        self.namespace_depth = namespace_depth
        """Labels of a namespace subject (`GRAPHLEDGER_ERASURE_NAMESPACE_DEPTH`): what a namespace erasure drops."""
        self.apply_items_sql = render(APPLY_ITEMS_SQL, schema)
        self.refresh_sql = render(REFRESH_SQL, schema)
        self.expire_sql = render(EXPIRE_SQL, schema)
        self.erase_prefixes_sql = render(ERASE_PREFIXES_SQL, schema)
        self.erasure = erasure.ErasureStatements(schema)
        self.events = StoreEvents(schema)
        self._replace_vectors_sql: str | None = None

    async def prepare(self, conn: asyncpg.Connection) -> None:
        """Read the vector table's shape (after `migrate`, before the first batch)."""
        await self.events.prepare(conn)
        if self.index is not None:
            ext = await load_extension_schema(conn)
            self._replace_vectors_sql = (
                render(REPLACE_VECTORS_SQL, self.schema).replace("{ext}", ext).replace("{vector_type}",
                                                                                       self.index.vector_type)
            )  # fmt: skip

    @property
    def index(self) -> VectorIndex | None:
        """The shape of the schema's vector table (None: it has none), as `prepare` read it."""
        return self.events.index

    def requires(self, event: TimedStoreEvent) -> None:
        """A store event requires nothing of other partitions."""
        return None

    def to_event(self, env: Envelope, appended_ms: int) -> TimedStoreEvent:
        return self.events.to_event(env, appended_ms)

    async def apply(self, conn: asyncpg.Connection, items: Sequence[tuple[str, int, int, TimedStoreEvent]]) -> None:
        """Apply a batch's store events inside the caller's transaction."""
        for segment in plan_segments(items):
            match segment:
                case StoreRun():
                    await apply_run(conn, self, segment)
                case Maintenance():
                    await apply_maintenance(conn, self, segment)
                case Erasure():
                    await apply_erasure(conn, self, segment.event)
                case _:
                    assert_never(segment)


async def apply_erasure(
    conn: asyncpg.Connection, projection: StoreProjection, event: NamespaceErase | TenantErase
) -> None:
    sql = projection.erasure
    subtrees: list[str] = []
    exact: list[str] = []
    match event:
        case NamespaceErase():
            refs = [event.ref]
            for name, tenant in await erasure.names_of(conn, sql, "namespace", refs):  # names are store prefixes
                full = len(name.split(LABEL_SEPARATOR)) == namespace_subject_depth(tenant, projection.namespace_depth)
                (subtrees if full else exact).append(name)
        case TenantErase():
            refs = await erasure.tenant_refs(conn, sql, "namespace", event.tenant)
            subtrees.append(event.tenant)
        case _:
            assert_never(event)
    if subtrees or exact:
        await conn.execute(projection.erase_prefixes_sql, subtrees, exact)
    await erasure.delete_traces(conn, sql, refs)


async def apply_maintenance(conn: asyncpg.Connection, projection: StoreProjection, upkeep: Maintenance) -> None:
    if upkeep.refreshes[0]:
        await conn.execute(projection.refresh_sql, *upkeep.refreshes)
    if upkeep.expires[0]:
        await conn.execute(projection.expire_sql, *upkeep.expires)


async def apply_run(conn: asyncpg.Connection, projection: StoreProjection, run: StoreRun) -> None:
    if run.deletes[0] or run.puts[0]:
        await conn.execute(projection.apply_items_sql, *run.deletes, *run.puts, *run.resets)
    if run.replaced[0]:
        if projection._replace_vectors_sql is None:
            # Only puts with `vectors` [] or a delete-then-put reach here without a vector table;
            # with no table there are no rows to replace.
            return
        await conn.execute(
            projection._replace_vectors_sql,
            *run.vector_rows,
            run.embeddings,
            run.dims or 1,
            *run.replaced,
        )
