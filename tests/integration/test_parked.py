"""Parked subjects on the real broker and Postgres (invariant 7, `projection/parking.py`).

A record no projector version can apply parks only its subject (the partition's records of its key):
that record and the subject's later ones wait in the batch transaction that moves the partition past
them, every other subject goes on, and a release applies them in order, once, or parks them again. The
batch transaction is driven directly where a test needs to choose what one batch holds; the projector
runs in this process where a test needs its loop (the broker's log ends, its own releases).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import asyncpg
import pytest
from aiokafka import AIOKafkaProducer

from graphledger.errors import ParkedSubjectError
from graphledger.events import envelope, to_envelope
from graphledger.events.checkpoint import CheckpointEvent, RunsDelete, ThreadCopy, ThreadCopyBarrier
from graphledger.events.envelope import Envelope
from graphledger.log.records import LogRecord
from graphledger.log.tail import LogTail
from graphledger.opening.records import DeadLetter
from graphledger.settings import Settings
from graphledger_server.log.ends import log_ends
from graphledger_server.projection.batch import BatchApplier
from graphledger_server.projection.checkpoints import CheckpointProjection
from graphledger_server.projection.parked_release import release_parked
from graphledger_server.projector.release import release
from polling import WAIT_S, wait_for
from projection_helpers import TOPIC, cid, put, record
from worker_helpers import producer_for, running_projector

FAR = 2**62
"""A copy position no log reaches."""


@pytest.fixture
async def settings(ready_settings: Callable[..., Awaitable[Settings]]) -> Settings:
    return await ready_settings(batch_max_wait_ms=20)


@pytest.fixture
async def producer(settings: Settings) -> AsyncIterator[AIOKafkaProducer]:
    async with producer_for(settings) as p:
        yield p


class Applier:
    """The batch transaction of `TOPIC`'s projection on one connection, with the dead letters it produced."""

    def __init__(self, settings: Settings, conn: asyncpg.Connection, **kw: Any) -> None:
        self.letters: list[DeadLetter] = []
        self.conn = conn
        self.schema = settings.postgres_schema

        async def sink(batch: Sequence[DeadLetter]) -> None:
            self.letters.extend(batch)

        projections = {TOPIC: CheckpointProjection(self.schema)}
        self.batch = BatchApplier(self.schema, settings.projector_group_id, projections, sink, **kw)

    async def rows(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in await self.conn.fetch(sql.replace("{schema}", self.schema), *args)]

    async def checkpoints(self, thread_id: str) -> list[str]:
        found = await self.rows(
            "SELECT checkpoint_id FROM {schema}.checkpoints WHERE thread_id = $1 ORDER BY 1", thread_id
        )
        return [r[0] for r in found]

    async def parked(self) -> list[tuple[Any, ...]]:
        return await self.rows(
            "SELECT first_offset, record_key, cause FROM {schema}.graphledger_parked_subjects ORDER BY 1"
        )

    async def parked_records(self) -> list[tuple[Any, ...]]:
        return await self.rows('SELECT "offset", first_offset FROM {schema}.graphledger_held_records ORDER BY 1')


@pytest.fixture
async def applier(settings: Settings) -> AsyncIterator[Applier]:
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        yield Applier(settings, conn)
    finally:
        await conn.close()


def newer(event: CheckpointEvent, partition: int, offset: int, version: int = 99) -> LogRecord:
    """`event`'s record, claiming envelope `version`."""
    env = to_envelope(event)
    claimed = Envelope(env.type, env.event_id, env.produced_ms, env.payload, version=version)
    found = record(event, partition, offset)
    return LogRecord(TOPIC, partition, offset, found.key, envelope.encode(claimed),
                        tuple(envelope.headers_for(claimed)), found.timestamp)  # fmt: skip


def upgrade(monkeypatch: pytest.MonkeyPatch, version: int) -> None:
    """This process reads envelope `version` from now on, as an upgraded projector would."""
    for earlier in range(envelope.SCHEMA_VERSION, version):
        monkeypatch.setitem(envelope.UPCASTERS, earlier, lambda event_type, payload: payload)
    monkeypatch.setattr(envelope, "SCHEMA_VERSION", version)


# -- the batch transaction ---------------------------------------------------------------------------


async def test_a_newer_record_holds_its_subject_while_the_partition_moves_on_and_a_release_applies_it_in_order(
    applier: Applier, monkeypatch: pytest.MonkeyPatch
) -> None:
    upgraded = envelope.SCHEMA_VERSION + 1
    first = await applier.batch.apply(
        applier.conn,
        [record(put("t", 1), 0, 0), newer(put("t", 2, 1), 0, 1, upgraded), record(put("u", 1), 0, 2)],
    )
    second = await applier.batch.apply(applier.conn, [record(put("t", 3, 2), 0, 3), record(put("u", 2, 1), 0, 4)])
    assert [(s.first_offset, s.cause) for s in first.parked] == [(1, "newer_version")] and second.parked_records == 1
    assert first.next_offsets == {(TOPIC, 0): 3} and second.next_offsets == {(TOPIC, 0): 5}
    assert await applier.checkpoints("t") == [cid(1)] and await applier.checkpoints("u") == [cid(1), cid(2)]
    assert await applier.parked_records() == [(1, 1), (3, 1)]

    # This version cannot apply it: released, it parks again, holding the same records.
    again = await release_parked(applier.batch, applier.conn, (TOPIC, 0, 1))
    assert [s.first_offset for s in again.result.parked] == [1] and again.records == 2
    assert await applier.parked_records() == [(1, 1), (3, 1)] and await applier.checkpoints("t") == [cid(1)]

    upgrade(monkeypatch, upgraded)
    done = await release_parked(applier.batch, applier.conn, (TOPIC, 0, 1))
    assert done.result.applied == 2 and not done.result.parked
    assert await applier.checkpoints("t") == [cid(1), cid(2), cid(3)]
    assert await applier.parked() == [] and await applier.parked_records() == []
    with pytest.raises(ParkedSubjectError, match=r"no subject is parked at test\.checkpoints:0@1"):
        await release_parked(applier.batch, applier.conn, (TOPIC, 0, 1))
    later = await applier.batch.apply(applier.conn, [record(put("t", 4, 3), 0, 5)])
    assert later.applied == 1 and await applier.checkpoints("t") == [cid(n) for n in (1, 2, 3, 4)]


async def test_a_drop_dead_letters_the_parking_record_applies_the_rest_and_a_replay_of_the_log_decides_the_same(
    applier: Applier,
) -> None:
    log = [record(put("t", 1), 0, 0), newer(put("t", 99, 1), 0, 1), record(put("t", 2, 1), 0, 2)]
    await applier.batch.apply(applier.conn, log)
    dropped = await release_parked(applier.batch, applier.conn, (TOPIC, 0, 1), drop=True)
    assert dropped.result.dead_letters == 1 and dropped.result.applied == 1
    assert [(letter.record.offset, "dropped by an operator" in letter.reason) for letter in applier.letters] == [
        (1, True)
    ]
    assert await applier.checkpoints("t") == [cid(1), cid(2)]
    assert await applier.rows('SELECT "offset", verdict FROM {schema}.graphledger_record_verdicts') == [(1, "dropped")]

    # The same log applied again (an offsets reset, a rebuild carrying the verdicts) drops it in place.
    await applier.conn.execute(f"UPDATE {applier.schema}.graphledger_offsets SET next_offset = 0")
    applier.letters.clear()
    again = await applier.batch.apply(applier.conn, log)
    assert not again.parked and [letter.record.offset for letter in applier.letters] == [1]
    assert await applier.parked() == [] and await applier.checkpoints("t") == [cid(1), cid(2)]


async def test_a_failed_batch_parks_nothing_and_a_failed_release_keeps_every_record(settings: Settings) -> None:
    """Parking is written in the transaction that advances the offsets, and a release in the one that
    takes the records: a failure (here the dead-letter topic unreachable) rolls either back whole."""
    conn = await asyncpg.connect(settings.postgres_dsn)
    failing = True

    async def sink(batch: Sequence[DeadLetter]) -> None:
        if failing:
            raise ConnectionError("the dead-letter topic is unreachable")

    try:
        batch = BatchApplier(settings.postgres_schema, settings.projector_group_id,
                             {TOPIC: CheckpointProjection(settings.postgres_schema)}, sink)  # fmt: skip
        records = [newer(put("t", 1), 0, 0), record(put("t", 2, 1), 0, 1), LogRecord(TOPIC, 0, 2, b"x", b"\xc1")]
        with pytest.raises(ConnectionError):
            await batch.apply(conn, records)
        schema = settings.postgres_schema
        assert await conn.fetchval(f"SELECT count(*) FROM {schema}.graphledger_parked_subjects") == 0
        assert await conn.fetchval(f"SELECT count(*) FROM {schema}.graphledger_held_records") == 0
        assert await conn.fetchval(f"SELECT coalesce(max(next_offset), 0) FROM {schema}.graphledger_offsets") == 0
        failing = False
        done = await batch.apply(conn, records)
        assert len(done.parked) == 1 and done.parked_records == 2 and done.dead_letters == 1
        failing = True
        with pytest.raises(ConnectionError):
            await release_parked(batch, conn, (TOPIC, 0, 0), drop=True)  # its dead letter cannot be produced
        assert await conn.fetchval(f"SELECT count(*) FROM {schema}.graphledger_parked_subjects") == 1
        held = await conn.fetch(f'SELECT "offset" FROM {schema}.graphledger_held_records ORDER BY 1')
        assert [r["offset"] for r in held] == [0, 1]
        assert await conn.fetchval(f"SELECT count(*) FROM {schema}.checkpoints") == 0
    finally:
        await conn.close()


async def test_a_runs_delete_while_a_thread_was_parked_reaches_its_released_records_and_no_other_thread(
    applier: Applier,
) -> None:
    """`delete_for_runs` is keyless: it applies to the partition where it stands, and a parked thread's
    release applies it again after the thread's records before it, to that thread alone."""
    run = {"run_id": "r"}
    await applier.batch.apply(
        applier.conn,
        [
            newer(put("t", 1), 0, 0),
            record(put("t", 2, metadata=run), 0, 1),
            record(put("u", 1, metadata=run), 0, 2),
            record(RunsDelete(("r",)), 0, 3),
            record(put("u", 2, 1, metadata=run), 0, 4),  # after the delete: stays
            record(put("t", 3, 2, metadata=run), 0, 5),  # after the delete: stays
        ],
    )
    assert await applier.checkpoints("u") == [cid(2)]
    assert await applier.parked_records() == [(0, 0), (1, 0), (3, None), (5, 0)]
    await release_parked(applier.batch, applier.conn, (TOPIC, 0, 0), drop=True)
    assert await applier.checkpoints("t") == [cid(3)]
    assert await applier.checkpoints("u") == [cid(2)]
    assert await applier.parked_records() == []


# -- copy barriers, with the broker's log ends --------------------------------------------------------


@pytest.fixture
async def ends_applier(settings: Settings, producer: AIOKafkaProducer) -> AsyncIterator[Applier]:
    """An applier of the settings' real checkpoint topic, asking the broker where its partitions end."""
    conn = await asyncpg.connect(settings.postgres_dsn)
    tail = LogTail(settings)
    await tail.start()

    async def ends(partitions: set[tuple[str, int]]) -> dict[tuple[str, int], int]:
        return await log_ends(tail, partitions, WAIT_S)

    try:
        found = Applier(settings, conn, log_ends=ends)
        found.batch.projections = {settings.checkpoint_topic: CheckpointProjection(settings.postgres_schema)}
        yield found
    finally:
        await tail.stop()
        await conn.close()


async def publish(producer: AIOKafkaProducer, settings: Settings, value: LogRecord, partition: int) -> LogRecord:
    """Append `value`'s record to `partition` of the checkpoint topic; the record as the log holds it."""
    meta = await producer.send_and_wait(settings.checkpoint_topic, value.value, key=value.key, partition=partition,
                                        headers=list(value.headers))  # fmt: skip
    return LogRecord(settings.checkpoint_topic, partition, meta.offset, value.key, value.value, value.headers,
                        meta.timestamp)  # fmt: skip


async def test_a_barrier_ahead_of_the_projection_waits_for_its_copy_and_one_beyond_the_log_parks(
    ends_applier: Applier, settings: Settings, producer: AIOKafkaProducer
) -> None:
    """A copy barrier whose copy lies in the log but is not applied yet holds its partition, as it always
    did (a copy made by `encrypt-log` or a repartition is such a barrier); one naming a position past the
    end of its copy's partition parks its target alone."""
    applier = ends_applier
    source = await publish(producer, settings, record(put("s", 1), 0, 0), 0)
    copy = await publish(producer, settings, record(ThreadCopy("s", "t"), 0, 0), 0)
    barrier = await publish(producer, settings, record(ThreadCopyBarrier("t", 0, copy.offset), 1, 0), 1)
    forged = await publish(producer, settings, record(ThreadCopyBarrier("v", 0, FAR), 1, 0), 1)
    behind = await publish(producer, settings, record(put("v", 2), 1, 0), 1)

    waiting = await applier.batch.apply(applier.conn, [barrier])
    assert waiting.paused == {(settings.checkpoint_topic, 1): barrier.offset} and not waiting.parked
    await applier.batch.apply(applier.conn, [source, copy])
    landed = await applier.batch.apply(applier.conn, [barrier, forged, behind])
    assert landed.applied == 1 and await applier.checkpoints("t") == [cid(1)]
    assert [(s.record_key, s.cause) for s in landed.parked] == [(b"v", "beyond_log")]
    assert "beyond the end of that partition's log" in landed.parked[0].reason
    assert landed.next_offsets == {(settings.checkpoint_topic, 1): behind.offset + 1}
    assert await applier.rows('SELECT "offset", verdict FROM {schema}.graphledger_record_verdicts') == [
        (forged.offset, "beyond_log")
    ]


async def test_a_barrier_whose_copy_is_held_parks_its_target_until_the_copy_applies(
    settings: Settings, producer: AIOKafkaProducer
) -> None:
    """The source parked, its copy's record is held: the target's barrier parks too (its copy staged
    nothing). Once an operator drops what parked the source, the source's records apply, the copy with
    them, and the projector releases the target by itself: it gets the source's rows."""
    await publish(producer, settings, record(put("s", 1), 0, 0), 0)
    parker = await publish(producer, settings, newer(put("s", 9), 0, 0), 0)
    copy = await publish(producer, settings, record(ThreadCopy("s", "t"), 0, 0), 0)
    await publish(producer, settings, record(put("t", 5), 1, 0), 1)
    barrier = await publish(producer, settings, record(ThreadCopyBarrier("t", 0, copy.offset), 1, 0), 1)
    conn = await asyncpg.connect(settings.postgres_dsn)
    schema = settings.postgres_schema

    async def parked() -> list[tuple[Any, ...]]:
        query = f"SELECT first_offset, record_key, cause FROM {schema}.graphledger_parked_subjects ORDER BY 2"
        return [tuple(r) for r in await conn.fetch(query)]

    async def checkpoints(thread_id: str) -> list[str]:
        rows = await conn.fetch(f"SELECT checkpoint_id FROM {schema}.checkpoints WHERE thread_id = $1 ORDER BY 1",
                                thread_id)  # fmt: skip
        return [r["checkpoint_id"] for r in rows]

    try:
        async with running_projector(settings):
            want = [(parker.offset, b"s", "newer_version"), (barrier.offset, b"t", "copy_parked")]
            await wait_for(lambda: _equals(parked(), want), "the source and the copy's target to park")
            assert await checkpoints("t") == [cid(5)]
            (outcome,) = await release(settings, [f"{settings.checkpoint_topic}:0@{parker.offset}"], drop=True)
            assert outcome.released is not None and outcome.released.result.dead_letters == 1
            await wait_for(lambda: _equals(checkpoints("t"), [cid(1), cid(5)]), "the projector to release the target")
            assert await parked() == []
    finally:
        await conn.close()


async def _equals(found: Awaitable[object], expected: object) -> bool:
    return await found == expected
