"""`graphledger import --from-postgres`: publish an existing PostgresSaver/PostgresStore database as events.

Two streams, each resumable on its own: threads (in `thread_id` order, a chunk of threads at a time,
threads of a chunk concurrently, each thread's events one after the other so its parents precede its
children on its partition) and store items (in `(prefix, key)` order). After a chunk is acknowledged
by Kafka its last position is recorded (`progress.py`); a rerun continues after it, and a finished
import publishes nothing unless `restart` is asked for. Republishing is harmless anyway: puts are
upserts of the same rows, regular writes never overwrite, special writes overwrite with the same
bytes, and store puts carry the item's original times (`created_ms`, and `updated_at` in the
`gl-appended-ms` header a copy carries), so the projection ends up the same.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import asyncpg
from psycopg.conninfo import conninfo_to_dict

from graphledger.client.publisher import EventPublisher
from graphledger.erasure.sealer import EventSealer
from graphledger.errors import ImportMismatchError
from graphledger.events import Event
from graphledger.events.envelope import new_envelope
from graphledger.settings import Settings
from graphledger_server.importer.plan import store_put, thread_events
from graphledger_server.importer.progress import Progress
from graphledger_server.importer.source import Source
from graphledger_server.keys.key_store import check_key_settings, key_store_for
from graphledger_server.keys.source import StoreKeySource
from graphledger_server.opening.vector_index import VectorIndex, load_vector_index
from graphledger_server.projection.migrate import migrate

log = logging.getLogger(__name__)

THREADS, STORE = "threads", "store"


@dataclass(slots=True)
class ImportReport:
    source: str
    threads: int = 0
    items: int = 0
    events: int = 0
    """Published by this run."""
    finished_before: bool = False
    """Both streams were done before this run: it published nothing."""
    positions: dict[tuple[str, int], int] = field(default_factory=dict)
    """The highest offset this run published per (topic, partition): applied once the projector's
    next offset there is above it."""


def source_name(dsn: str, schema: str) -> str:
    """The import's identity: where the source is, without credentials."""
    info = conninfo_to_dict(dsn)
    host, port, dbname = info.get("host") or "localhost", info.get("port") or "5432", info.get("dbname") or ""
    return f"postgresql://{host}:{port}/{dbname}?schema={schema}"


async def import_postgres(
    settings: Settings,
    source_dsn: str,
    *,
    source_schema: str = "public",
    name: str | None = None,
    restart: bool = False,
    thread_chunk: int = 64,
    item_chunk: int = 256,
) -> ImportReport:
    """Publish the source's threads and store items as events; see the module docstring."""
    check_key_settings(settings)
    await migrate(settings.postgres_dsn, settings.postgres_schema, vectors=VectorIndex.from_settings(settings))
    report = ImportReport(name or source_name(source_dsn, source_schema))
    target = await asyncpg.connect(settings.postgres_dsn)
    source_conn = await connect(source_dsn)
    publisher = EventPublisher(settings)
    keys_pool: asyncpg.Pool | None = None
    try:
        sealer = None
        if settings.encrypt_events:
            keys_pool = await asyncpg.create_pool(settings.postgres_dsn, min_size=0, max_size=1)
            key_store = key_store_for(settings, keys_pool)
            assert key_store is not None  # check_key_settings
            sealer = EventSealer(StoreKeySource(key_store, settings), settings.key_cache_ttl_s)
        source = Source(source_conn, source_schema)
        await source.inspect()
        await _check_vectors(source, target, settings)
        progress = Progress(target, settings.postgres_schema, report.source)
        if restart:
            await progress.reset()
        states = {stream: await progress.load(stream) for stream in (THREADS, STORE)}
        if all(state.done for state in states.values()):
            report.finished_before = True
            return report
        await publisher.start()
        run = _Run(settings, publisher, report, sealer)
        if source.has_checkpoints and not states[THREADS].done:
            await run.threads(source, progress, states[THREADS].cursor, thread_chunk)
        else:
            await progress.advance(THREADS, states[THREADS].cursor, True, 0)
        if source.has_store and not states[STORE].done:
            await run.items(source, progress, states[STORE].cursor, item_chunk)
        else:
            await progress.advance(STORE, states[STORE].cursor, True, 0)
        return report
    finally:
        await publisher.stop()
        if keys_pool is not None:
            await keys_pool.close()
        await source_conn.close()
        await target.close()


async def connect(dsn: str) -> asyncpg.Connection:
    """asyncpg takes URLs only; a libpq key=value DSN (as psycopg and the official saver take) is mapped."""
    if dsn.startswith(("postgresql://", "postgres://")):
        return await asyncpg.connect(dsn)
    info = conninfo_to_dict(dsn)
    names = {"dbname": "database", "host": "host", "port": "port", "user": "user", "password": "password"}
    return await asyncpg.connect(**{names[k]: v for k, v in info.items() if k in names})


async def _check_vectors(source: Source, target: asyncpg.Connection, settings: Settings) -> None:
    dims = await source.vector_dims()
    if dims is None:
        return
    index = await load_vector_index(target, settings.postgres_schema)
    if index is None or index.dims != dims:
        have = "no vector table" if index is None else f"{index.dims}-dim vectors"
        raise ImportMismatchError(
            f"the source's store_vectors hold {dims}-dim vectors but schema {settings.postgres_schema!r} has {have}: "
            f"set GRAPHLEDGER_STORE_VECTOR_DIMS={dims} for a fresh projection (vectors are imported, not re-embedded)"
        )


class _Run:
    def __init__(
        self, settings: Settings, publisher: EventPublisher, report: ImportReport, sealer: EventSealer | None
    ) -> None:
        self.settings = settings
        self.publisher = publisher
        self.report = report
        self.sealer = sealer
        """Seals the imported events as a client would (in the unnamed tenant); None: in the clear."""

    async def _publish(self, topic: str, event: Event, appended_ms: int | None = None) -> None:
        """Publish `event`; a store item carries its source row's `updated_at` as its time (`appended_ms`),
        so it expires as it would have there. A thread's events take the import's time: its activity."""
        env = dataclasses.replace(new_envelope(event.TYPE, event.to_payload()), appended_ms=appended_ms)
        key = event.key
        if self.sealer is not None:
            key, env = await self.sealer.seal(event, "", env)
        for t, partition, offset in await self.publisher.publish(topic, key, env):
            self.report.positions[(t, partition)] = max(offset, self.report.positions.get((t, partition), -1))
        self.report.events += 1

    async def _publish_in_order(self, topic: str, events: Sequence[Event]) -> None:
        for event in events:
            await self._publish(topic, event)

    async def threads(self, source: Source, progress: Progress, cursor: list[str] | None, chunk: int) -> None:
        topic = self.settings.checkpoint_topic
        after = cursor[0] if cursor else None
        while thread_ids := await source.threads_after(after, chunk):
            before = self.report.events
            rows = await source.thread_rows(thread_ids)
            await asyncio.gather(*(self._publish_in_order(topic, thread_events(r)) for r in rows))
            after = thread_ids[-1]
            await progress.advance(THREADS, [after], False, self.report.events - before)
            self.report.threads += len(thread_ids)
            log.info("import: %d threads published (up to %r)", self.report.threads, after)
        await progress.advance(THREADS, [after] if after is not None else None, True, 0)

    async def items(self, source: Source, progress: Progress, cursor: list[str] | None, chunk: int) -> None:
        topic = self.settings.store_topic
        while items := await source.items_after(cursor, chunk):
            before = self.report.events
            puts = [store_put(row, vectors) for row, vectors in items]
            await asyncio.gather(*(self._publish(topic, event, updated_ms) for event, updated_ms in puts))
            last = items[-1][0]
            cursor = [last["prefix"], last["key"]]
            await progress.advance(STORE, cursor, False, self.report.events - before)
            self.report.items += len(items)
            log.info("import: %d store items published", self.report.items)
        await progress.advance(STORE, cursor, True, 0)
