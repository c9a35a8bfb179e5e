"""The projector against the real broker and Postgres: offsets, chunks, dead letters, parked subjects, kill -9."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import os
import random
import signal
import string
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import asyncpg
import pytest
from aiokafka import AIOKafkaProducer

from graphledger.events import envelope, to_envelope
from graphledger.events.checkpoint import CheckpointEvent, ThreadCopy, ThreadDelete, ThreadPrune
from graphledger.events.chunks import ChunkRef, split
from graphledger.events.envelope import Envelope
from graphledger.log import key_filter
from graphledger.log.key_filter import KeyFilter
from graphledger.log.records import LogRecord
from graphledger.opening.records import DeadLetter
from graphledger.settings import Settings
from graphledger_server.devstack.postgres import EmbeddedPostgres
from graphledger_server.log.offsets import APPLIED_CHANNEL
from graphledger_server.projection.batch import BatchApplier
from graphledger_server.projection.checkpoints import CheckpointProjection
from graphledger_server.projection.dead_letters import outgoing_records
from graphledger_server.projector.main import run_projector
from kafka_clients import raw_consumer, raw_producer
from polling import wait_for
from projection_helpers import TOPIC, cid, put, record, writes

WAIT_S = 60.0


@pytest.fixture
async def settings(ready_settings: Callable[..., Awaitable[Settings]]) -> Settings:
    return await ready_settings(batch_max_wait_ms=20)


@pytest.fixture
async def producer(settings: Settings) -> AsyncIterator[AIOKafkaProducer]:
    p = raw_producer(settings, max_request_size=settings.max_message_bytes + 64 * 1024)
    await p.start()
    yield p
    await p.stop()


@contextlib.asynccontextmanager
async def projector(settings: Settings) -> AsyncIterator[asyncio.Task[None]]:
    """An in-process projector, stopped (gracefully) on exit."""
    stop = asyncio.Event()
    task = asyncio.create_task(run_projector(settings, stop, migrate_first=False))
    try:
        yield task
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


async def publish(
    producer: AIOKafkaProducer, settings: Settings, event: CheckpointEvent | Envelope, partition: int, key: str = "k"
) -> int:
    """Publish an event (or a raw envelope) to one partition; returns its offset."""
    env = event if isinstance(event, Envelope) else to_envelope(event)
    meta = await producer.send_and_wait(
        settings.checkpoint_topic,
        envelope.encode(env),
        key=key.encode(),
        headers=envelope.headers_for(env),
        partition=partition,
    )
    return meta.offset


async def publish_raw(producer: AIOKafkaProducer, settings: Settings, value: bytes, partition: int, **kw: Any) -> int:
    meta = await producer.send_and_wait(settings.checkpoint_topic, value, key=b"k", partition=partition, **kw)
    return meta.offset


async def scalar(db: asyncpg.Connection, settings: Settings, sql: str, *args: Any) -> Any:
    return await db.fetchval(sql.replace("{schema}", settings.postgres_schema), *args)


async def offsets(db: asyncpg.Connection, settings: Settings) -> dict[int, int]:
    rows = await db.fetch(
        f"SELECT partition, next_offset FROM {settings.postgres_schema}.graphledger_offsets "
        "WHERE consumer_group = $1 AND topic = $2",
        settings.projector_group_id,
        settings.checkpoint_topic,
    )
    return {r["partition"]: r["next_offset"] for r in rows}


async def has_checkpoint(db: asyncpg.Connection, settings: Settings, thread_id: str, n: int) -> bool:
    return bool(
        await scalar(
            db,
            settings,
            "SELECT count(*) FROM {schema}.checkpoints WHERE thread_id = $1 AND checkpoint_id = $2",
            thread_id,
            cid(n),
        )
    )


async def test_events_apply_with_offsets_and_a_notification(
    settings: Settings, db: asyncpg.Connection, producer: AIOKafkaProducer
) -> None:
    notified: asyncio.Queue[str] = asyncio.Queue()
    await db.add_listener(APPLIED_CHANNEL, lambda *args: notified.put_nowait(args[3]))
    last = {}
    for p in range(4):
        await publish(producer, settings, put(f"t{p}", 1, blobs={"m": b"x"}), p)
        last[p] = await publish(producer, settings, writes(f"t{p}", 1, "task", [("m", b"w")]), p)
    async with projector(settings):
        await wait_for(lambda: _offsets_reached(db, settings, {p: o + 1 for p, o in last.items()}), "all applied")
        assert await asyncio.wait_for(notified.get(), WAIT_S) == settings.postgres_schema
    assert await scalar(db, settings, "SELECT count(*) FROM {schema}.checkpoint_writes") == 4
    partitions = await db.fetch(
        f"SELECT thread_id, partition FROM {settings.postgres_schema}.graphledger_thread_partitions"
    )
    assert {r["thread_id"]: r["partition"] for r in partitions} == {f"t{p}": p for p in range(4)}


async def _offsets_reached(db: asyncpg.Connection, settings: Settings, want: dict[int, int]) -> bool:
    have = await offsets(db, settings)
    return all(have.get(p, 0) >= o for p, o in want.items())


@pytest.mark.slow
async def test_a_50mb_checkpoint_round_trips_in_chunks_across_a_restart(
    settings: Settings, db: asyncpg.Connection, producer: AIOKafkaProducer
) -> None:
    blob = os.urandom(1024) * (50 * 1024)  # 50 MiB
    event = put("big", 1, blobs={"huge": blob})
    env = to_envelope(event)
    parts = split(envelope.encode(env), settings.max_message_bytes)
    assert len(parts) > 50

    async def send_chunk(i: int) -> int:
        headers = [
            *envelope.headers_for(env),
            (envelope.HEADER_CHUNK, ChunkRef(env.event_id, i, len(parts)).header_value()),
        ]
        return await publish_raw(producer, settings, parts[i], 2, headers=headers)

    half = len(parts) // 2
    for i in range(half):
        await send_chunk(i)
    async with projector(settings):
        await wait_for(
            lambda: scalar(db, settings, "SELECT count(*) = $1 FROM {schema}.graphledger_chunks", half), "half stored"
        )
    assert not await has_checkpoint(db, settings, "big", 1)
    for i in range(half, len(parts)):
        last = await send_chunk(i)
    await publish(producer, settings, put("after", 2), 2)
    async with projector(settings):
        await wait_for(lambda: has_checkpoint(db, settings, "after", 2), "the event after the chunks")
    stored = await db.fetchrow(
        f"SELECT length(blob) AS n, sha256(blob) AS digest FROM {settings.postgres_schema}.checkpoint_blobs "
        "WHERE thread_id = 'big' AND channel = 'huge'"
    )
    assert stored["n"] == len(blob)
    assert bytes(stored["digest"]) == hashlib.sha256(blob).digest()
    assert await scalar(db, settings, "SELECT count(*) FROM {schema}.graphledger_chunks") == 0
    assert (await offsets(db, settings))[2] == last + 2


async def _consume_all(settings: Settings, topic: str, n: int) -> list[Any]:
    consumer = raw_consumer(settings, topic, auto_offset_reset="earliest")
    await consumer.start()
    got: list[Any] = []
    try:
        deadline = time.monotonic() + WAIT_S
        while len(got) < n and time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                got.extend(records)
    finally:
        await consumer.stop()
    return got


async def test_bad_records_go_to_the_dead_letter_topic_and_the_partition_moves_on(
    settings: Settings, db: asyncpg.Connection, producer: AIOKafkaProducer
) -> None:
    good = envelope.encode(to_envelope(put("t", 1)))
    valid = to_envelope(put("t", 2))
    bad_payload = Envelope(valid.type, valid.event_id, valid.produced_ms, {**valid.payload, "thread_id": ""})
    bad = {
        await publish_raw(producer, settings, b"\xc1garbage", 1, headers=[("gl-type", b"checkpoint.put")]): "msgpack",
        await publish_raw(producer, settings, good[: len(good) // 2], 1): "msgpack",
        await publish(producer, settings, bad_payload, 1): "thread_id",
    }
    await publish(producer, settings, put("t", 3), 1)
    async with projector(settings):
        await wait_for(lambda: has_checkpoint(db, settings, "t", 3), "the event after the bad ones")
    letters = await _consume_all(settings, settings.dead_letter_topic, len(bad))
    assert len(letters) == len(bad)
    for letter in letters:
        headers = dict(letter.headers)
        offset = int(headers["gl-dlq-offset"])
        assert bad[offset] in headers["gl-dlq-reason"].decode()
        assert headers["gl-dlq-topic"] == settings.checkpoint_topic.encode()
        assert headers["gl-dlq-partition"] == b"1"
        assert letter.key == b"k"
    rows = await db.fetch(f'SELECT "offset", reason FROM {settings.postgres_schema}.graphledger_dead_letters')
    assert {r["offset"] for r in rows} == set(bad)


async def test_an_event_from_a_newer_version_parks_only_its_subject(
    settings: Settings, db: asyncpg.Connection, producer: AIOKafkaProducer, caplog: pytest.LogCaptureFixture
) -> None:
    """The thread whose record claims version 99 waits, with that record and its later ones; the other
    thread on the same partition, and the partition's offset, move on."""
    caplog.set_level(logging.WARNING)
    await publish(producer, settings, put("p0", 1), 0, key="p0")
    newer = to_envelope(put("p0", 2))
    park_at = await publish(
        producer, settings, Envelope(newer.type, newer.event_id, 0, newer.payload, version=99), 0, key="p0"
    )
    await publish(producer, settings, put("p0", 3), 0, key="p0")
    last = await publish(producer, settings, put("other", 1), 0, key="other")
    async with projector(settings):
        await wait_for(lambda: has_checkpoint(db, settings, "other", 1), "the other thread of the partition")
        await wait_for(lambda: _offsets_reached(db, settings, {0: last + 1}), "partition 0 past the newer event")
        assert await has_checkpoint(db, settings, "p0", 1)
        assert not await has_checkpoint(db, settings, "p0", 3)
    parked = await db.fetch(
        f"SELECT first_offset, record_key, cause FROM {settings.postgres_schema}.graphledger_parked_subjects"
    )
    assert [tuple(r) for r in parked] == [(park_at, b"p0", "newer_version")]
    held = await db.fetch(f'SELECT "offset" FROM {settings.postgres_schema}.graphledger_held_records ORDER BY 1')
    assert [r["offset"] for r in held] == [park_at, park_at + 1]
    assert f"parked subject {settings.checkpoint_topic}:0@{park_at} (newer_version)" in caplog.text
    assert await scalar(db, settings, "SELECT count(*) FROM {schema}.graphledger_dead_letters") == 0


async def test_a_thread_delete_racing_its_writes_leaves_nothing(
    settings: Settings, db: asyncpg.Connection, producer: AIOKafkaProducer
) -> None:
    for n in range(1, 30):
        await publish(producer, settings, put("gone", n, n - 1 if n > 1 else None, blobs={"m": b"x"}), 3)
        await publish(producer, settings, writes("gone", n, "task", [("m", b"w")]), 3)
    last = await publish(producer, settings, ThreadDelete("gone"), 3)
    async with projector(settings):
        await wait_for(lambda: _offsets_reached(db, settings, {3: last + 1}), "the delete")
    for table in ("checkpoints", "checkpoint_blobs", "checkpoint_writes", "graphledger_thread_partitions"):
        assert await scalar(db, settings, f"SELECT count(*) FROM {{schema}}.{table}") == 0


async def test_a_postgres_outage_is_retried_without_skipping(
    settings: Settings, producer: AIOKafkaProducer, pg: EmbeddedPostgres, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="graphledger_server.projector.worker")

    async def checkpoints() -> int:
        conn = await asyncpg.connect(settings.postgres_dsn)
        try:
            return await conn.fetchval(f"SELECT count(*) FROM {settings.postgres_schema}.checkpoints")
        finally:
            await conn.close()

    async def publish_range(first: int, last: int) -> None:
        for n in range(first, last):
            await publish(producer, settings, put("outage", n, n - 1 if n else None, blobs={"m": b"x"}), 0)

    async with projector(settings):
        await publish_range(0, 10)
        await wait_for(lambda: _at_least(checkpoints, 10), "the first events")
        pg.pause()
        try:
            await publish_range(10, 20)
            await wait_for(_async(lambda: "retrying" in caplog.text), "the projector to retry")
        finally:
            pg.resume()
        await wait_for(lambda: _at_least(checkpoints, 20), "the events published during the outage")
    assert await checkpoints() == 20


def _async(condition: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return condition()

    return check


# -- the batch transaction, without the broker ------------------------------------------------------


@pytest.fixture
async def applier(settings: Settings) -> tuple[BatchApplier, list[DeadLetter]]:
    letters: list[DeadLetter] = []

    async def sink(batch: Sequence[DeadLetter]) -> None:
        letters.extend(batch)

    projections = {TOPIC: CheckpointProjection(settings.postgres_schema)}
    return BatchApplier(settings.postgres_schema, settings.projector_group_id, projections, sink), letters


async def test_data_postgres_rejects_is_dead_lettered_one_event_at_a_time(
    settings: Settings, db: asyncpg.Connection, applier: tuple[BatchApplier, list[DeadLetter]]
) -> None:
    batch_applier, letters = applier
    not_json = dataclasses.replace(put("t", 2), checkpoint_json=b"{not json")
    too_long_id = "".join(random.choices(string.ascii_letters, k=4000))  # over a btree index row's limit
    records = [
        record(put("t", 1), 0, 0),
        record(not_json, 0, 1),
        record(put(too_long_id, 1), 0, 2),
        record(ThreadCopy("t", "t"), 0, 3),  # a copy onto itself: nothing to do, nothing to fail
        record(put("t", 3), 0, 4),
    ]
    result = await batch_applier.apply(db, records)
    assert result.isolated and result.dead_letters == 2 and result.applied == 3
    assert sorted(letter.record.offset for letter in letters) == [1, 2]
    assert all("Postgres rejected" in letter.reason for letter in letters)
    rows = await db.fetch(f"SELECT checkpoint_id FROM {settings.postgres_schema}.checkpoints ORDER BY 1")
    assert [r["checkpoint_id"] for r in rows] == [cid(1), cid(3)]
    assert await offsets_of(db, settings, TOPIC) == {0: 5}


APPENDED_MS = 1_767_225_600_000
"""When the test's chunk records were appended (the reassembled event's time is its last chunk's)."""


def chunk_records(value: bytes, event_id: str, first_offset: int, parts: int = 2) -> list[LogRecord]:
    pieces = split(value, -(-len(value) // parts))
    return [
        LogRecord(
            TOPIC,
            0,
            first_offset + i,
            b"k",
            piece,
            ((envelope.HEADER_CHUNK, ChunkRef(event_id, i, len(pieces)).header_value()),),
            APPENDED_MS,
        )
        for i, piece in enumerate(pieces)
    ]


async def test_chunks_of_a_bad_or_newer_event(
    settings: Settings, db: asyncpg.Connection, applier: tuple[BatchApplier, list[DeadLetter]]
) -> None:
    batch_applier, letters = applier
    newer = to_envelope(put("t", 9))
    newer_value = envelope.encode(Envelope(newer.type, newer.event_id, 0, newer.payload, version=99))
    garbage = chunk_records(b"\xc1" * 100, "garbage", 0)
    records = [
        *garbage,
        dataclasses.replace(garbage[0], offset=2),  # a duplicate chunk after its event completed
        *chunk_records(newer_value, "newer", 3),
        record(put("t", 1), 0, 5),
    ]
    result = await batch_applier.apply(db, records)
    assert [letter.record.offset for letter in letters] == [1]  # the garbage, at its last chunk
    assert letters[0].chunk_event_id == "garbage" and letters[0].value == b"\xc1" * 100
    outgoing = outgoing_records(letters[0], max_message_bytes=40)
    assert [dict(o.headers)[envelope.HEADER_CHUNK] for o in outgoing] == [
        b"garbage:0:3",
        b"garbage:1:3",
        b"garbage:2:3",
    ]
    assert b"".join(o.value or b"" for o in outgoing) == b"\xc1" * 100
    # The newer event parks its subject (key b"k") at its last chunk; the put after it, of another subject,
    # applies, and the partition moves past both.
    assert [(s.first_offset, s.record_key, s.cause) for s in result.parked] == [(4, b"k", "newer_version")]
    assert result.parked_records == 1
    assert await offsets_of(db, settings, TOPIC) == {0: 6}
    stored = await db.fetch(f"SELECT event_id, idx FROM {settings.postgres_schema}.graphledger_chunks")
    assert [tuple(r) for r in stored] == [("newer", 0)]  # kept for the release that reassembles it
    assert await has_checkpoint(db, settings, "t", 1)


def prune_sequence(thread_id: str) -> list[CheckpointEvent]:
    """Events that end differently when applied twice: the second prune would drop checkpoint 2."""
    return [put(thread_id, 1), put(thread_id, 2, 1), ThreadPrune(thread_id, "keep_latest"), put(thread_id, 3, 2)]


async def test_the_offset_row_fences_a_batch_applied_twice_at_once(
    settings: Settings, db: asyncpg.Connection, applier: tuple[BatchApplier, list[DeadLetter]]
) -> None:
    batch_applier, _ = applier
    records = [record(e, 0, i) for i, e in enumerate(prune_sequence("t"))]
    second = await asyncpg.connect(settings.postgres_dsn)
    try:
        results = await asyncio.gather(batch_applier.apply(db, records), batch_applier.apply(second, records))
    finally:
        await second.close()
    assert sorted((r.applied, r.skipped) for r in results) == [(0, 4), (4, 0)]
    # A batch holding a partition's records twice (sought back mid-fetch) applies each once.
    twice = [record(e, 1, i) for i, e in enumerate(prune_sequence("u"))] * 2
    assert (await batch_applier.apply(db, twice)).applied == 4
    for thread in ("t", "u"):
        rows = await db.fetch(
            f"SELECT checkpoint_id FROM {settings.postgres_schema}.checkpoints WHERE thread_id = $1 ORDER BY 1", thread
        )
        assert [r["checkpoint_id"] for r in rows] == [cid(2), cid(3)]


async def offsets_of(db: asyncpg.Connection, settings: Settings, topic: str) -> dict[int, int]:
    rows = await db.fetch(
        f"SELECT partition, next_offset FROM {settings.postgres_schema}.graphledger_offsets WHERE topic = $1", topic
    )
    return {r["partition"]: r["next_offset"] for r in rows}


# -- kill -9 ----------------------------------------------------------------------------------------

KILL_EVENTS = 10_000


def projector_env(settings: Settings, **extra: object) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRAPHLEDGER_")}
    for name, value in {**settings.model_dump(), **extra}.items():
        if value is None:
            continue
        if hasattr(value, "get_secret_value"):
            value = value.get_secret_value()
        env[f"GRAPHLEDGER_{name.upper()}"] = str(value).lower() if isinstance(value, bool) else str(value)
    return env


def start_projector_process(settings: Settings, log_path: str) -> subprocess.Popen[bytes]:
    with open(log_path, "ab") as log_file:
        return subprocess.Popen(
            [sys.executable, "-m", "graphledger_server.projector"],
            env=projector_env(settings, batch_max_events=250),
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )


@pytest.mark.slow
async def test_kill_9_in_the_middle_loses_and_duplicates_nothing(
    settings: Settings, db: asyncpg.Connection, producer: AIOKafkaProducer, tmp_path: Any
) -> None:
    log_path = str(tmp_path / "projector.log")
    process = start_projector_process(settings, log_path)
    try:
        sends = []
        for i in range(KILL_EVENTS):
            thread = f"thread-{i % 200}"
            sends.append(await producer.send(settings.checkpoint_topic, *_encoded(put(thread, i, blobs={"m": b"v"}))))
            sends.append(
                await producer.send(settings.checkpoint_topic, *_encoded(writes(thread, i, "t", [("m", b"w")])))
            )
        acked = await asyncio.gather(*sends)
        # The end of the log as the broker acknowledged it (tansu's ListOffsets reports less than that).
        ends: dict[int, int] = {}
        for meta in acked:
            ends[meta.partition] = max(ends.get(meta.partition, 0), meta.offset + 1)

        def count() -> Awaitable[int]:
            return scalar(db, settings, "SELECT count(*) FROM {schema}.checkpoints")

        await wait_for(lambda: _at_least(count, 1000), "some checkpoints applied")
        process.send_signal(signal.SIGKILL)
        process.wait(30)
        at_kill = await count()
        assert at_kill < KILL_EVENTS, "the projector finished before the kill; the test proves nothing"

        process = start_projector_process(settings, log_path)
        await wait_for(lambda: _at_least(count, KILL_EVENTS), "every checkpoint after the restart")
        await wait_for(lambda: _offsets_reached(db, settings, ends), "the offsets to reach the end of the log")
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        returncode = process.wait(30)
    assert returncode == 0, _tail(log_path)  # SIGTERM: a clean stop

    assert await count() == KILL_EVENTS
    assert await scalar(db, settings, "SELECT count(*) FROM {schema}.checkpoint_writes") == KILL_EVENTS
    assert await scalar(db, settings, "SELECT count(*) FROM {schema}.checkpoint_blobs") == KILL_EVENTS
    assert await offsets(db, settings) == ends


def _tail(path: str) -> str:
    with open(path, errors="replace") as f:
        return f.read()[-3000:]


def _encoded(event: CheckpointEvent) -> tuple[bytes, bytes]:
    return envelope.encode(to_envelope(event)), event.key.encode()  # type: ignore[union-attr]


async def _at_least(count: Callable[[], Awaitable[int]], n: int) -> bool:
    return await count() >= n


async def key_filter_of(db: asyncpg.Connection, settings: Settings, partition: int) -> KeyFilter:
    """The partition's key filter as the read API serves it, read with the offset row."""
    schema = settings.postgres_schema
    rows = await db.fetch(
        f"SELECT word, bits FROM {schema}.graphledger_key_filter WHERE topic = $1 AND partition = $2", TOPIC, partition
    )
    through = await db.fetchval(
        f"SELECT next_offset FROM {schema}.graphledger_offsets WHERE topic = $1 AND partition = $2", TOPIC, partition
    )
    answer = {
        "through": through,
        "complete": True,
        "bits": key_filter.BITS,
        "hashes": key_filter.HASHES,
        "indexes": b"".join(r["word"].to_bytes(4, "little") for r in rows),
        "values": b"".join(r["bits"].to_bytes(8, "little", signed=True) for r in rows),
    }
    copy = KeyFilter.from_answer(answer)
    assert copy is not None
    return copy


async def test_the_key_filter_holds_the_key_of_every_record_the_offsets_moved_past(
    settings: Settings, db: asyncpg.Connection, applier: tuple[BatchApplier, list[DeadLetter]]
) -> None:
    """Applied or dead-lettered, each record's key is in its partition's filter once the offset passed it;
    records applied before add nothing again."""
    batch_applier, letters = applier
    applied = [record(e, 0, i) for i, e in enumerate(prune_sequence("kept"))]
    bad = dataclasses.replace(record(put("bad", 1), 0, len(applied)), value=b"\x00 not an envelope")
    other = record(put("other", 1), 1, 0)
    await batch_applier.apply(db, [*applied, bad, other])
    assert len(letters) == 1
    first, second = await key_filter_of(db, settings, 0), await key_filter_of(db, settings, 1)
    assert first.through == len(applied) + 1 and second.through == 1
    assert first.may_hold(b"kept") and first.may_hold(b"bad") and second.may_hold(b"other")
    assert not first.may_hold(b"other") and not second.may_hold(b"kept")
    words = await scalar(db, settings, "SELECT count(*) FROM {schema}.graphledger_key_filter")
    assert (await batch_applier.apply(db, applied)).skipped == len(applied)
    assert await scalar(db, settings, "SELECT count(*) FROM {schema}.graphledger_key_filter") == words
    assert await scalar(db, settings, "SELECT bool_and(key_filter_complete) FROM {schema}.graphledger_offsets")
