"""The projector's batch memory: besides at most `batch_max_bytes` of records, a batch loads at most that
much of stored chunks to reassemble events (one event always fits, so each batch progresses). Events
completing beyond the budget are deferred to the next batch: nothing lost, nothing applied twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import asyncpg
import pytest

from graphledger.events import envelope, to_envelope
from graphledger.events.chunks import ChunkRef, split
from graphledger.log.records import LogRecord
from graphledger.opening.records import DeadLetter
from graphledger.settings import Settings
from graphledger_server.projection.batch import BatchApplier
from graphledger_server.projection.checkpoints import CheckpointProjection
from graphledger_server.projector.main import run_projector
from kafka_clients import raw_producer
from polling import wait_for
from projection_helpers import TOPIC, put, record

CHUNK_BYTES = 10_000
EVENT_BLOB_BYTES = 25_000  # three chunks of CHUNK_BYTES
APPENDED_MS = 1_767_225_600_000
"""When the chunk records were appended (a reassembled event's time is its last chunk's)."""


def _chunked(names: Sequence[str]) -> dict[str, tuple[bytes, list[tuple[bytes, tuple[tuple[str, bytes], ...]]]]]:
    """Each name's blob and its event's chunk records (value, headers)."""
    out = {}
    for name in names:
        blob = os.urandom(EVENT_BLOB_BYTES)
        env = to_envelope(put(name, 1, blobs={"b": blob}))
        parts = split(envelope.encode(env), CHUNK_BYTES)
        out[name] = (
            blob,
            [
                (
                    part,
                    (
                        *envelope.headers_for(env),
                        (envelope.HEADER_CHUNK, ChunkRef(env.event_id, i, len(parts)).header_value()),
                    ),
                )
                for i, part in enumerate(parts)
            ],
        )
    return out


async def _blob(db: asyncpg.Connection, schema: str, thread: str) -> bytes | None:
    return await db.fetchval(f"SELECT blob FROM {schema}.checkpoint_blobs WHERE thread_id = $1", thread)


@pytest.fixture
async def settings(ready_settings: Callable[..., Awaitable[Settings]]) -> Settings:
    return await ready_settings(
        max_message_bytes=CHUNK_BYTES, batch_max_bytes=3 * CHUNK_BYTES + 2_000, batch_max_wait_ms=20
    )


async def test_events_completing_beyond_the_budget_are_deferred(settings: Settings, db: asyncpg.Connection) -> None:
    schema = settings.postgres_schema
    letters: list[DeadLetter] = []

    async def sink(batch: Sequence[DeadLetter]) -> None:
        letters.extend(batch)

    applier = BatchApplier(
        schema, settings.projector_group_id, {TOPIC: CheckpointProjection(schema)}, sink,
        reassembly_max_bytes=int(2.5 * CHUNK_BYTES),
    )  # fmt: skip
    events = _chunked(["a", "b", "c"])
    log: list[LogRecord] = []
    # Every event's chunks but the last first, then the last chunks, then a plain event.
    for round_ in range(3):
        for _, chunks in events.values():
            value, headers = chunks[round_]
            log.append(LogRecord(TOPIC, 0, len(log), b"k", value, headers, APPENDED_MS))
    log.append(record(put("after", 1), 0, len(log)))
    first_last = 6  # offset of a's last chunk

    assert (await applier.apply(db, log[:first_last])).deferred == {}
    # Each later batch reassembles one event (two would load more than the budget) and defers the rest.
    for done, thread in enumerate(("a", "b", "c")):
        result = await applier.apply(db, log[first_last + done :])
        assert await _blob(db, schema, thread) == events[thread][0]
        if thread == "c":
            assert result.deferred == {}
        else:
            assert result.deferred == {(TOPIC, 0): first_last + done + 1}
            assert result.next_offsets == {(TOPIC, 0): first_last + done + 1}
            assert await _blob(db, schema, "c") is None and await _blob(db, schema, "after") is None
    assert await db.fetchval(f"SELECT count(*) FROM {schema}.graphledger_chunks") == 0
    assert await db.fetchval(f"SELECT count(*) FROM {schema}.checkpoints WHERE thread_id = 'after'") == 1
    assert letters == []


async def test_the_worker_fetches_deferred_records_again(
    settings: Settings, db: asyncpg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="graphledger_server.projection.batch")
    events = _chunked(["a", "b", "c"])
    producer = raw_producer(settings, max_request_size=CHUNK_BYTES + 64 * 1024)
    await producer.start()
    try:
        for round_ in range(3):  # interleaved: the last chunks of all three arrive together
            for _, chunks in events.values():
                value, headers = chunks[round_]
                await producer.send_and_wait(
                    settings.checkpoint_topic, value, key=b"k", headers=list(headers), partition=1
                )
    finally:
        await producer.stop()
    stop = asyncio.Event()
    task = asyncio.create_task(run_projector(settings, stop, migrate_first=False))
    try:

        async def projected() -> bool:
            assert not task.done(), task
            return None not in [await _blob(db, settings.postgres_schema, thread) for thread in events]

        await wait_for(projected, f"checkpoints {sorted(events)} to be projected")
        for thread, (blob, _) in events.items():
            assert await _blob(db, settings.postgres_schema, thread) == blob
    finally:
        stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 30)
    assert "deferring the batch" in caplog.text  # the budget did cut a batch
    assert await db.fetchval(f"SELECT count(*) FROM {settings.postgres_schema}.graphledger_chunks") == 0
    counts: Any = await db.fetch(f"SELECT thread_id, count(*) FROM {settings.postgres_schema}.checkpoints GROUP BY 1")
    assert sorted(tuple(r) for r in counts) == [("a", 1), ("b", 1), ("c", 1)]
