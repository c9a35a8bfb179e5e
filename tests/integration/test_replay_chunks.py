"""A rebuild over chunked events with a small reassembly budget, against the real broker and Postgres.

Batches that would reassemble more than `batch_max_bytes` of stored chunks are cut and the rest of the
partition deferred (tests/integration/test_projector_memory.py); the rebuild must fetch a deferred partition again
from the cut, on both lanes, and so end equal to the live schema.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import pytest

from graphledger.events import envelope, to_envelope
from graphledger.events.chunks import ChunkRef, split
from graphledger.log.records import LogRecord
from graphledger.opening.records import Classified
from graphledger.settings import Settings
from graphledger_server.projection.batch import BatchResult
from graphledger_server.projector.main import run_projector
from graphledger_server.replay.rebuild import Rebuilder
from graphledger_server.replay.run import run_replay
from kafka_clients import raw_producer
from polling import wait_for
from projection_helpers import put

CHUNK_BYTES = 10_000
BLOB_BYTES = 25_000  # three chunks of CHUNK_BYTES
EVENTS_PER_PARTITION = 12
PARTITIONS = (0, 1)  # the rebuild's first two partitions: one on each lane
WAIT_S = 90.0

Produced = tuple[int, bytes, bytes, list[tuple[str, bytes]]]
"""partition, key, value, headers"""


def _chunk_header(event_id: str, index: int, count: int) -> tuple[str, bytes]:
    return envelope.HEADER_CHUNK, ChunkRef(event_id, index, count).header_value()


def _interleaved_log(partition: int) -> tuple[dict[str, bytes], list[Produced]]:
    """Chunked checkpoints whose chunks interleave (every event's first chunks, then the rest), so
    batches complete several events whose earlier chunks are stored, with a plain event after each round."""
    blobs: dict[str, bytes] = {}
    chunked: list[list[Produced]] = []
    for n in range(EVENTS_PER_PARTITION):
        thread = f"big-{partition}-{n}"
        blobs[thread] = os.urandom(BLOB_BYTES)
        env = to_envelope(put(thread, 1, blobs={"b": blobs[thread]}))
        parts = split(envelope.encode(env), CHUNK_BYTES)
        chunked.append(
            [
                (
                    partition,
                    thread.encode(),
                    part,
                    [*envelope.headers_for(env), _chunk_header(env.event_id, i, len(parts))],
                )
                for i, part in enumerate(parts)
            ]
        )
    out: list[Produced] = []
    for round_ in range(max(len(c) for c in chunked)):
        out.extend(c[round_] for c in chunked if round_ < len(c))
        plain = to_envelope(put(f"small-{partition}-{round_}", 1))
        out.append((partition, b"small", envelope.encode(plain), list(envelope.headers_for(plain))))
    return blobs, out


@pytest.fixture
async def settings(ready_settings: Callable[..., Awaitable[Settings]]) -> Settings:
    return await ready_settings(
        max_message_bytes=CHUNK_BYTES,
        batch_max_bytes=3 * CHUNK_BYTES + 2_000,  # one chunked event's records or stored chunks, not two
        batch_max_wait_ms=20,
        replay_batch_max_events=20,
    )


async def test_a_rebuild_with_deferred_partitions_equals_the_live_schema(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    blobs: dict[str, bytes] = {}
    produced: list[Produced] = []
    for partition in PARTITIONS:
        part_blobs, part_log = _interleaved_log(partition)
        blobs.update(part_blobs)
        produced.extend(part_log)
    producer = raw_producer(settings, max_request_size=CHUNK_BYTES + 64 * 1024)
    await producer.start()
    try:
        for partition, key, value, headers in produced:
            await producer.send_and_wait(
                settings.checkpoint_topic, value, key=key, headers=headers, partition=partition
            )
    finally:
        await producer.stop()

    # The live projector applies the log (deferring as well) and stops.
    conn = await asyncpg.connect(settings.postgres_dsn)
    live = settings.postgres_schema
    stop = asyncio.Event()
    projector = asyncio.create_task(run_projector(settings, stop, migrate_first=False))
    try:

        async def applied() -> bool:
            assert not projector.done(), projector
            return await conn.fetchval(f"SELECT count(*) FROM {live}.checkpoint_blobs") >= len(blobs)

        await wait_for(applied, "the live projector to apply every chunked event", WAIT_S)
    finally:
        stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(projector, 60)

    deferrals: list[dict[tuple[str, int], int]] = []
    apply = Rebuilder._apply

    async def counting(self: Rebuilder, records: list[LogRecord], classified: list[Classified]) -> BatchResult:
        result = await apply(self, records, classified)
        if result.deferred:
            deferrals.append(dict(result.deferred))
        return result

    monkeypatch.setattr(Rebuilder, "_apply", counting)
    try:
        report = await run_replay(settings, switch=False, out=None)
        deferred_partitions = {tp for d in deferrals for tp in d}
        assert {(settings.checkpoint_topic, p) for p in PARTITIONS} <= deferred_partitions, deferrals
        assert all(check.equal for check in report.checks), [c.describe() for c in report.checks]
        sums = {c.table: c.rebuilt for c in report.checks}
        assert sums["checkpoint_blobs"] is not None and sums["checkpoint_blobs"].rows == len(blobs)
        rebuilt = report.rebuilt
        rows: Any = await conn.fetch(f"SELECT thread_id, blob FROM {rebuilt}.checkpoint_blobs")
        assert {r["thread_id"]: r["blob"] for r in rows} == blobs
        assert await conn.fetchval(f"SELECT count(*) FROM {rebuilt}.graphledger_chunks") == 0
    finally:
        await conn.close()
