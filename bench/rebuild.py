"""Rebuild rows of `make bench`: how fast `graphledger replay` rebuilds projections from the log, against
the two limits of any loader in the same run.

A realistic mix is produced straight to fresh topics with the real event encoders (not through
LangGraph, to keep setup fast): per thread, checkpoint puts (two blobs each) each followed by a
pending-writes event (two writes), and store puts (a fifth of the events; without vectors). Then:
- the load: the replay's `Rebuilder` applies all of it into a fresh schema without secondary indexes,
  capped at the produced offsets (what the acknowledgements said, not the broker's reported end offsets);
- the read-only limit: the same `Rebuilder` fetching and opening every record (decode, and unseal where
  sealed) with nothing applied, since the broker and the decoding can be what bounds a rebuild;
- the COPY limit: the rows the load wrote, copied with one binary COPY per table (asyncpg
  `copy_records_to_table`, one connection) into a schema migrated as the rebuild's (primary keys, no
  secondary indexes); the rows are read out before the clock starts;
- the whole `replay run`: the load's schema, given the secondary indexes a migrated schema has, stands as
  the live projection of the same log, and `run_replay` rebuilds it (preflight, load, index builds, the last
  catch-up, verify, switch).
Each rate is events per second from its start to its last batch; the load's ratio is against the lower of
the two limits. The process's resident memory is sampled after every batch of the load and reported at the
load's start and at its peak: the rise is bounded by the batches alive at once (two lanes applying, one
being opened; `GRAPHLEDGER_REPLAY_BATCH_MAX_EVENTS` and `GRAPHLEDGER_BATCH_MAX_BYTES` each), not by the
log's length. Runs alone too: `python -m bench.rebuild --events 100000 [--kinds sealed]`.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import asyncpg
from aiokafka import TopicPartition

from graphledger.client.producer import new_producer
from graphledger.client.tenant import scope_event
from graphledger.erasure.sealer import EventSealer
from graphledger.events import chunks, envelope, to_envelope
from graphledger.events.checkpoint import Blob, CheckpointPut, CheckpointWrites, Write
from graphledger.events.store import StorePut
from graphledger.log.records import LogRecord
from graphledger.opening.records import Classified
from graphledger.settings import Settings
from graphledger_server.collector import collecting_fully, freeze_and_defer_full_collections
from graphledger_server.keys.key_store import key_store_for
from graphledger_server.keys.ring import new_key_entry
from graphledger_server.keys.source import StoreKeySource
from graphledger_server.log.topics import ensure_topics
from graphledger_server.projection.batch import BatchResult
from graphledger_server.projection.migrate import migrate
from graphledger_server.replay import indexes, schemas
from graphledger_server.replay.progress import Progress
from graphledger_server.replay.rebuild import TP, Rebuilder
from graphledger_server.replay.run import run_replay

DEFAULT_EVENTS = int(os.environ.get("GRAPHLEDGER_BENCH_REBUILD_EVENTS", "1000000"))
THREADS = 2_000
SCHEMA = "bench_rebuild"
COPY_SCHEMA = "bench_rebuild_copy"
READ_SCHEMA = "bench_rebuild_read"
INDEXED_SCHEMA = "bench_rebuild_indexed"
KINDS = ("clear", "sealed")
WORKERS = (2, 1)
"""`replay run --workers` of the whole runs, in this order (the last one switches)."""
MIB = 1024 * 1024


def _version(n: int) -> str:
    return f"{n:032}.{0.5:016}"


def _events(total: int) -> Iterator[tuple[str, object]]:
    """(topic kind, event): rounds over THREADS threads of put, writes, and every other round a store put."""
    step = 0
    produced = 0
    while True:
        for t in range(THREADS):
            thread = f"thread-{t}"
            cid = f"1f000000-0000-6000-8000-{step:06d}{t:06d}"
            parent = f"1f000000-0000-6000-8000-{step - 1:06d}{t:06d}" if step else None
            v = _version(step + 1)
            checkpoint = {
                "v": 4, "ts": "2026-01-01T00:00:00+00:00", "id": cid, "channel_values": {"step": step},
                "channel_versions": {"messages": v, "step": v, "scratch": v}, "versions_seen": {"agent": {"step": v}},
                "updated_channels": ["messages", "scratch"],
            }  # fmt: skip
            metadata = {"source": "loop", "step": step, "parents": {}, "run_id": f"run-{t}"}
            blobs = (Blob("messages", v, "msgpack", os.urandom(160)), Blob("scratch", v, "msgpack", os.urandom(40)))
            items: list[tuple[str, object]] = [
                ("checkpoint", CheckpointPut(thread, "", cid, parent, json.dumps(checkpoint).encode(),
                                             json.dumps(metadata).encode(), blobs)),
                ("checkpoint", CheckpointWrites(thread, "", cid, f"task-{step}", "", False,
                                                (Write(0, "messages", "msgpack", os.urandom(80)),
                                                 Write(1, "step", "msgpack", b"\x01")))),
            ]  # fmt: skip
            if (step + t) % 3 == 0:
                value = {"text": f"memory {step} of user {t}: likes kafka and postgres", "rank": step % 100}
                items.append(("store", StorePut(("users", str(t), "memories"), f"m{step % 50}",
                                                json.dumps(value).encode(), None, None)))  # fmt: skip
            for item in items:
                yield item
                produced += 1
                if produced == total:
                    return
        step += 1


async def produce(settings: Settings, total: int, *, sealed: bool = False) -> dict[TP, int]:
    """Publish `total` events (`sealed`: as a client of the unnamed tenant seals them, each subject under its
    own key from the key store); returns each partition's next offset, from the acknowledgements."""
    topics = {"checkpoint": settings.checkpoint_topic, "store": settings.store_topic}
    pool = await asyncpg.create_pool(settings.postgres_dsn, min_size=1, max_size=2) if sealed else None
    sealer = None
    if pool is not None:
        store = key_store_for(settings, pool)
        assert store is not None, "sealed events need GRAPHLEDGER_KEY_ENCRYPTION_KEYS"
        sealer = EventSealer(StoreKeySource(store, settings), settings.key_cache_ttl_s)
    producer = new_producer(settings, linger_ms=20)
    await producer.start()
    ends: dict[TP, int] = {}
    try:
        pending = []
        for kind, event in _events(total):
            if sealer is None:
                env, record_key = to_envelope(event), event.key  # type: ignore[arg-type, attr-defined]
            else:
                record_key, env = await sealer.seal(scope_event(event, ""), "")  # type: ignore[arg-type]
            key = record_key.encode() if record_key is not None else None
            value, headers = envelope.encode(env), envelope.headers_for(env)
            for r in chunks.frame(value, headers, settings.max_message_bytes, env.event_id):
                pending.append(await producer.send(topics[kind], r.value, key=key, headers=r.headers))
            if len(pending) >= 20_000:
                for meta in await asyncio.gather(*pending):
                    tp = (meta.topic, meta.partition)
                    ends[tp] = max(ends.get(tp, 0), meta.offset + 1)
                pending.clear()
        for meta in await asyncio.gather(*pending):
            tp = (meta.topic, meta.partition)
            ends[tp] = max(ends.get(tp, 0), meta.offset + 1)
    finally:
        await producer.stop()
        if pool is not None:
            await pool.close()
    return ends


async def rebuild(
    settings: Settings, ends: dict[TP, int], out: object = sys.stdout
) -> tuple[int, float, tuple[int, int]]:
    """Rebuild everything up to `ends` into a fresh schema; returns (events, seconds, (RSS at start, peak))."""
    await _fresh_schema(settings, SCHEMA)  # as `replay run` loads: indexes come after
    return await _drained(Rebuilder(settings, SCHEMA), ends, Progress(out))  # type: ignore[arg-type]


def _rss_bytes() -> int:
    """This process's resident memory now (Linux)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def _drained(
    rebuilder: Rebuilder, ends: dict[TP, int], progress: Progress | None = None
) -> tuple[int, float, tuple[int, int]]:
    """Run `rebuilder` up to `ends`; returns (events, seconds, the process's RSS at the start and its peak)."""
    start = time.perf_counter()
    peak = first = _rss_bytes()
    await rebuilder.start()
    try:
        rebuilder.set_caps(ends)
        while rebuilder.lag() > 0:
            await rebuilder.step()
            peak = max(peak, _rss_bytes())
            if progress is not None:
                progress.update("bench", rebuilder.records, rebuilder.lag(), rebuilder.positions, rebuilder.caps)
        await rebuilder.flush()
    finally:
        await rebuilder.close()
    return rebuilder.records, time.perf_counter() - start, (first, peak)


class _ReadOnly(Rebuilder):
    """The rebuild's fetch and opening of every record, with no batch applied: each partition moves past
    what it fetched."""

    async def _apply(self, records: list[LogRecord], classified: list[Classified]) -> BatchResult:
        return BatchResult(next_offsets={TopicPartition(r.topic, r.partition): r.offset + 1 for r in records})


async def read_only(settings: Settings, ends: dict[TP, int]) -> tuple[int, float]:
    """Fetch and open everything up to `ends`, applying nothing; returns (events, seconds). Its schema (where
    a rebuild starts from: no offsets stored) is migrated before the clock starts."""
    await _fresh_schema(settings, READ_SCHEMA)
    records, seconds, _ = await _drained(_ReadOnly(settings, READ_SCHEMA), ends)
    await _drop_schemas(settings, READ_SCHEMA)
    return records, seconds


COLUMNS_SQL = """
SELECT table_name, array_agg(column_name::text ORDER BY ordinal_position) AS columns
FROM information_schema.columns
WHERE table_schema = $1 AND is_generated = 'NEVER' AND identity_generation IS NULL
GROUP BY table_name
"""


async def copy_limit(settings: Settings) -> tuple[int, float]:
    """Binary COPY of every row the load wrote into `COPY_SCHEMA` (migrated, secondary indexes dropped);
    returns (rows, seconds), the rows read out before the clock starts."""
    await _fresh_schema(settings, COPY_SCHEMA)
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        tables = {r["table_name"]: r["columns"] for r in await conn.fetch(COLUMNS_SQL, SCHEMA)}
        rows = {}
        for table, columns in tables.items():
            if await conn.fetchval(f'SELECT EXISTS (SELECT FROM {COPY_SCHEMA}."{table}")'):
                continue  # the migrations' own bookkeeping, which the migrated schema holds already
            listed = ", ".join(f'"{c}"' for c in columns)
            rows[table] = await conn.fetch(f'SELECT {listed} FROM {SCHEMA}."{table}"')
        await conn.execute("SET synchronous_commit = off")  # as the rebuild's connections
        start = time.perf_counter()
        for table, records in rows.items():
            if records:
                await conn.copy_records_to_table(table, records=records, columns=tables[table], schema_name=COPY_SCHEMA)
        seconds = time.perf_counter() - start
        counts = ", ".join(f"{table} {len(r):,}" for table, r in sorted(rows.items(), key=lambda i: -len(i[1])) if r)
        print(f"  rows the load wrote: {counts}", flush=True)
        return sum(len(r) for r in rows.values()), seconds
    finally:
        await conn.execute(f"DROP SCHEMA IF EXISTS {COPY_SCHEMA} CASCADE")
        await conn.close()


async def replay_runs(settings: Settings) -> dict[int, tuple[int, float]]:
    """The whole `graphledger replay run` of the load's schema, standing as the live projection of the same
    log once it has the secondary indexes a migrated schema has (built before the clock starts), with
    `--workers 2` and then with one worker; returns workers -> (events, seconds). The run of two verifies
    without switching, so the live schema stands for the run of one, which switches. The schemas they leave
    are dropped."""
    await migrate(settings.postgres_dsn, INDEXED_SCHEMA)
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        await indexes.create_like_live(conn, INDEXED_SCHEMA, SCHEMA)
    finally:
        await conn.close()
    await _drop_schemas(settings, INDEXED_SCHEMA)
    live = settings.model_copy(update={"postgres_schema": SCHEMA})
    runs, retired = {}, None
    for workers in WORKERS:
        # `restart`: a rebuild an interrupted bench run (or the run before) left behind is never resumed.
        report = await run_replay(live, restart=True, switch=workers == 1, out=None, workers=workers)
        runs[workers], retired = (report.events, report.seconds), report.retired
    await _drop_schemas(settings, *(s for s in (retired, SCHEMA, schemas.rebuild_name(SCHEMA)) if s is not None))
    return runs


async def _drop_schemas(settings: Settings, *schemas: str) -> None:
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        for schema in schemas:
            await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    finally:
        await conn.close()


async def _fresh_schema(settings: Settings, schema: str) -> None:
    """`schema` migrated anew, without its secondary indexes (as `replay run` loads)."""
    await _drop_schemas(settings, schema)
    await migrate(settings.postgres_dsn, schema)
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        await indexes.drop_secondary(conn, schema)
    finally:
        await conn.close()


async def run(base: Settings, events: int, kinds: tuple[str, ...] = KINDS) -> list[str]:
    """The rebuild rows (Markdown) on fresh topics of `base`'s broker and database: clear events, then sealed
    ones (when `base` has a key store), each against its read-only limit and the COPY limit of its rows, then
    the whole replay run. The process collects garbage as `graphledger replay run` does meanwhile."""
    previous = gc.get_threshold()
    freeze_and_defer_full_collections()
    try:
        return await collecting_fully(_rows(base, events, kinds))
    finally:
        gc.unfreeze()
        gc.set_threshold(*previous)


async def _rows(base: Settings, events: int, kinds: tuple[str, ...]) -> list[str]:
    rows = []
    for kind in kinds:
        sealed = kind == "sealed"
        if sealed and not base.key_encryption_keys:
            continue
        prefix = f"rebuild-bench-{kind}-{uuid.uuid4().hex[:8]}"
        # Clear events are a log written with sealing off, applied so (with sealing on they are dead letters).
        settings = base.model_copy(update={"topic_prefix": prefix, "encrypt_events": sealed})
        await ensure_topics(settings)
        started = time.perf_counter()
        ends = await produce(settings, events, sealed=sealed)
        print(f"  rebuild bench: produced {events:,} {kind} events in {time.perf_counter() - started:.0f}s", flush=True)
        gc.collect()  # the producer's garbage, before the load's resident memory is first read
        done, seconds, (first, peak) = await rebuild(settings, ends)
        fetched, read_seconds = await read_only(settings, ends)
        copied, copy_seconds = await copy_limit(settings)
        runs = await replay_runs(settings)
        replayed, replay_seconds = runs[1]
        rate, read_rate, copy_rate = done / seconds, fetched / read_seconds, done / copy_seconds
        limit = min(read_rate, copy_rate)
        print(f"  rebuild ({kind})    {rate:9.0f} events/s ({done:,} events in {seconds:.1f}s, RSS "
              f"{first / MIB:,.0f} -> {peak / MIB:,.0f} MiB): {rate / limit:.2f}x its limit; read-only "
              f"{read_rate:.0f}/s, COPY {copy_rate:.0f} events/s ({copied:,} rows in {copy_seconds:.1f}s); replay run "
              f"{replayed / replay_seconds:.0f} events/s ({replay_seconds:.1f}s)", flush=True)  # fmt: skip
        loaded = f"{rate:,.0f} events/s ({rate / limit:.2f}x its limit), RSS {first / MIB:,.0f} → {peak / MIB:,.0f} MiB"
        whole = {w: f"{n / t:,.0f} events/s ({t:,.0f} s)" for w, (n, t) in runs.items()}
        print(f"  replay run --workers 2 ({kind}): {whole[2]}", flush=True)
        rows += [
            f"| replay rebuild, {kind} ({done:,} events) | – | {loaded} | – | – |",
            f"| its limits: read-only / COPY of its rows | – | {read_rate:,.0f} / {copy_rate:,.0f} events/s | – | – |",
            f"| whole `replay run`: load, indexes, verify, switch | – | {whole[1]} | – | – |",
            f"| whole `replay run --workers 2` (verified, not switched) | – | {whole[2]} | – | – |",
        ]
    return rows


async def _standalone(events: int, kinds: tuple[str, ...]) -> None:
    from graphledger_server.devstack.broker import EmbeddedBroker
    from graphledger_server.devstack.postgres import EmbeddedPostgres

    workdir = Path(tempfile.mkdtemp(prefix="graphledger-rebuild-bench-"))
    pg = EmbeddedPostgres.start(workdir / "pg", keep=False)
    broker = EmbeddedBroker.start(workdir / "broker")
    try:
        settings = Settings(
            postgres_dsn=pg.dsn,
            kafka_bootstrap_servers=broker.bootstrap_servers,
            kafka_idempotence=False,
            topic_partitions=4,
            topic_replication_factor=1,
            topic_allow_single_broker_acks=True,
            # The rebuild opens the key store, as `graphledger replay run` does with sealing on (the default):
            # this Postgres's key store gets a key of its own, as the dev stack's does.
            key_encryption_keys=new_key_entry("bench"),
        )
        print("\n".join(await run(settings, events, kinds)))
    finally:
        broker.stop()
        pg.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=DEFAULT_EVENTS, help="events to produce and rebuild")
    parser.add_argument("--kinds", default=",".join(KINDS), help="which loads, comma-separated: clear, sealed")
    args = parser.parse_args()
    kinds = tuple(k for k in args.kinds.split(",") if k)
    if unknown := set(kinds) - set(KINDS):
        parser.error(f"--kinds: unknown {sorted(unknown)}; choose from {', '.join(KINDS)}")
    asyncio.run(_standalone(args.events, kinds))
