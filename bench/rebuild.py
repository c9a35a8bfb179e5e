"""Rebuild row of `make bench`: how fast `graphledger replay` rebuilds projections from the log.

A realistic mix is produced straight to fresh topics with the real event encoders (not through
LangGraph, to keep setup fast): per thread, checkpoint puts (two blobs each) each followed by a
pending-writes event (two writes), and store puts (a fifth of the events; without vectors). Then the
replay's `Rebuilder` applies all of it into a fresh schema, capped at the produced offsets (what the
acknowledgements said, not the broker's reported end offsets), and the rate is events per second
from its start to the last batch. Runs alone too: `python -m bench.rebuild --events 100000`.
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

from graphledger.client.producer import new_producer
from graphledger.events import chunks, envelope, to_envelope
from graphledger.events.checkpoint import Blob, CheckpointPut, CheckpointWrites, Write
from graphledger.events.store import StorePut
from graphledger.settings import Settings
from graphledger_server.keys.ring import new_key_entry
from graphledger_server.log.topics import ensure_topics
from graphledger_server.projection.migrate import migrate
from graphledger_server.replay import indexes
from graphledger_server.replay.progress import Progress
from graphledger_server.replay.rebuild import TP, Rebuilder

DEFAULT_EVENTS = int(os.environ.get("GRAPHLEDGER_BENCH_REBUILD_EVENTS", "1000000"))
THREADS = 2_000
SCHEMA = "bench_rebuild"


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


async def produce(settings: Settings, total: int) -> dict[TP, int]:
    """Publish `total` events; returns each partition's next offset, from the acknowledgements."""
    topics = {"checkpoint": settings.checkpoint_topic, "store": settings.store_topic}
    producer = new_producer(settings, linger_ms=20)
    await producer.start()
    ends: dict[TP, int] = {}
    try:
        pending = []
        for kind, event in _events(total):
            env = to_envelope(event)  # type: ignore[arg-type]
            key = event.key.encode()  # type: ignore[attr-defined]
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
    return ends


async def rebuild(settings: Settings, ends: dict[TP, int], out: object = sys.stdout) -> tuple[int, float]:
    """Rebuild everything up to `ends` into a fresh schema; returns (events, seconds)."""
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        await conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
    finally:
        await conn.close()
    await migrate(settings.postgres_dsn, SCHEMA)
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        await indexes.drop_secondary(conn, SCHEMA)  # as `replay run` loads, indexes come after
    finally:
        await conn.close()
    rebuilder = Rebuilder(settings, SCHEMA)
    progress = Progress(out)  # type: ignore[arg-type]
    start = time.perf_counter()
    await rebuilder.start()
    try:
        rebuilder.set_caps(ends)
        while rebuilder.lag() > 0:
            await rebuilder.step()
            progress.update("bench", rebuilder.records, rebuilder.lag(), rebuilder.positions, rebuilder.caps)
        await rebuilder.flush()
    finally:
        await rebuilder.close()
    return rebuilder.records, time.perf_counter() - start


async def run(base: Settings, events: int) -> list[str]:
    """The rebuild row (Markdown) on fresh topics of `base`'s broker and database."""
    settings = base.model_copy(update={"topic_prefix": f"rebuild-bench-{uuid.uuid4().hex[:8]}"})
    await ensure_topics(settings)
    started = time.perf_counter()
    ends = await produce(settings, events)
    print(f"  rebuild bench: produced {events:,} events in {time.perf_counter() - started:.0f}s", flush=True)
    done, seconds = await rebuild(settings, ends)
    rate = done / seconds
    print(f"  rebuild            {rate:9.0f} events/s ({done:,} events in {seconds:.1f}s)", flush=True)
    return [f"| replay rebuild ({done:,} events) | – | {rate:,.0f} events/s | – | – |"]


async def _standalone(events: int) -> None:
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
        print("\n".join(await run(settings, events)))
    finally:
        broker.stop()
        pg.stop()


if __name__ == "__main__":
    gc.collect()
    gc.freeze()  # as `graphledger replay run` does
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=DEFAULT_EVENTS, help="events to produce and rebuild")
    asyncio.run(_standalone(parser.parse_args().events))
