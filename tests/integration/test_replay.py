"""`graphledger replay` against the real broker and Postgres: rebuild under load, verify, switch, drop.

The live side is real: KafkaSaver/KafkaStore write through the broker, an in-process projector applies,
an in-process read API (uvicorn on a free port) serves the clients' reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest
from aiokafka.admin import NewTopic
from langgraph.checkpoint.base import empty_checkpoint

from graphledger import KafkaSaver, KafkaStore
from graphledger.embeddings import HashEmbedder
from graphledger.errors import LossRefusedError, ReplayVerificationError
from graphledger.events import envelope, to_envelope
from graphledger.events.checkpoint import ThreadCopyBarrier
from graphledger.events.envelope import Envelope
from graphledger.log.tail import LogTail
from graphledger.settings import Settings
from graphledger_server.api.main import server as api_server
from graphledger_server.cli import main as cli_main
from graphledger_server.devstack.ports import free_port
from graphledger_server.devstack.stack import settings_to_env
from graphledger_server.log.ends import log_ends
from graphledger_server.log.topics import ensure_topics, source_topics
from graphledger_server.projection.batch import BatchApplier
from graphledger_server.projection.checkpoints import CheckpointProjection
from graphledger_server.projection.migrate import migrate
from graphledger_server.projector.main import run_projector
from graphledger_server.projector.release import release
from graphledger_server.replay import schemas
from graphledger_server.replay.indexes import secondary_indexes
from graphledger_server.replay.run import run_replay
from graphledger_server.replay.shares import Share
from kafka_clients import raw_admin, raw_producer
from polling import wait_applied, wait_for
from projection_helpers import TOPIC, cid, count, put, record

WAIT_S = 90.0
DIMS = 8


@pytest.fixture
async def settings(ready_settings: Callable[..., Awaitable[Settings]]) -> Settings:
    port = free_port()
    return await ready_settings(
        batch_max_wait_ms=20,
        batch_max_events=500,
        replay_batch_max_events=500,
        store_vector_dims=DIMS,
        store_index="flat",
        api_port=port,
        api_url=f"http://127.0.0.1:{port}",
        consistency_timeout_s=30,
    )


@contextlib.asynccontextmanager
async def live_stack(settings: Settings) -> AsyncIterator[None]:
    """An in-process projector and read API, stopped gracefully on exit."""
    stop = asyncio.Event()
    projector = asyncio.create_task(run_projector(settings, stop, migrate_first=False))
    api = api_server(settings)
    serving = asyncio.create_task(api.serve())
    try:
        await wait_for(lambda: _started(api, serving), "the read API to listen", WAIT_S)
        yield
    finally:
        api.should_exit = True
        stop.set()
        await asyncio.wait_for(asyncio.gather(serving, projector), 60)


async def _started(api: Any, serving: asyncio.Task[None]) -> bool:
    if serving.done():
        serving.result()  # raises what stopped it
    return bool(api.started)


def _index() -> dict[str, Any]:
    return {"dims": DIMS, "embed": HashEmbedder(DIMS), "fields": ["text"]}


async def _put_checkpoint(
    saver: KafkaSaver, thread_id: str, step: int, parent: dict[str, Any] | None
) -> dict[str, Any]:
    config = parent or {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
    checkpoint = empty_checkpoint()
    version = saver.get_next_version(None if step == 0 else str(step), None)
    checkpoint["channel_values"] = {"messages": [f"message {step} of {thread_id}"], "step": step}
    checkpoint["channel_versions"] = {"messages": version, "step": version}
    written = await saver.aput(config, checkpoint, {"source": "loop", "step": step}, {"messages": version})
    await saver.aput_writes(written, [("messages", f"pending {step}"), ("step", step)], task_id=f"task-{step}")
    return written


async def _write_load(saver: KafkaSaver, store: KafkaStore, tag: str, rounds: int, threads: int) -> dict[str, int]:
    """`rounds` checkpoints (with writes) on each of `threads` threads and store puts/deletes; returns
    thread id -> checkpoints written."""
    heads: dict[str, dict[str, Any] | None] = {f"{tag}-{t}": None for t in range(threads)}
    for step in range(rounds):
        heads = dict(
            zip(
                heads,
                await asyncio.gather(*(_put_checkpoint(saver, t, step, head) for t, head in heads.items())),
                strict=True,
            )
        )
        await asyncio.gather(
            *(store.aput((tag, "docs"), f"k{t}", {"text": f"doc {t} at {step}", "step": step}) for t in range(threads)),
            store.aput((tag, "plain"), f"s{step}", {"step": step}, index=False),
        )
        if step % 3 == 2:
            await store.adelete((tag, "plain"), f"s{step - 1}")
    return {t: rounds for t in heads}


async def test_replay_under_load_switches_to_an_identical_schema(settings: Settings, monkeypatch: Any) -> None:
    live = settings.postgres_schema
    failures: list[str] = []
    reads = 0
    async with (
        live_stack(settings),
        KafkaSaver(settings) as saver,
        KafkaStore(settings, index=_index()) as store,
        KafkaSaver(settings) as reader,
        KafkaStore(settings) as store_reader,
    ):
        written = await _write_load(saver, store, "before", rounds=6, threads=20)
        probe = {"configurable": {"thread_id": "before-3", "checkpoint_ns": ""}}
        await _until_projected(settings, "checkpoints", "thread_id = $1", "before-3")
        assert (await reader.aget_tuple(probe)) is not None

        stop = asyncio.Event()

        async def read_loop() -> None:
            """Reads of rows written before the replay, without a token, through the API: none may fail."""
            nonlocal reads
            while not stop.is_set():
                try:
                    got = await reader.aget_tuple(probe)
                    item = await store_reader.aget(("before", "docs"), "k3")
                    if got is None or got.checkpoint["channel_values"]["step"] != 5:
                        failures.append(f"checkpoint read returned {got}")
                    if item is None or item.value["step"] != 5:
                        failures.append(f"store read returned {item}")
                    reads += 1
                except Exception as exc:  # every failure is recorded, none is expected
                    failures.append(f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(0.005)

        async def write_loop() -> dict[str, int]:
            """Keeps writing (with read-your-writes checks through the writer's token) until stopped."""
            done: dict[str, int] = {}
            n = 0
            while not stop.is_set():
                done.update(await _write_load(saver, store, f"during{n}", rounds=3, threads=5))
                latest = await saver.aget_tuple({"configurable": {"thread_id": f"during{n}-0", "checkpoint_ns": ""}})
                if latest is None or latest.checkpoint["channel_values"]["step"] != 2:
                    failures.append(f"read-your-writes of during{n}-0 returned {latest}")
                n += 1
            return done

        readers = asyncio.create_task(read_loop())
        writers = asyncio.create_task(write_loop())
        try:
            report = await run_replay(settings, out=None)
        finally:
            stop.set()
            during = await writers
            await readers
        written.update(during)

        assert report.retired is not None and report.retired.startswith(f"{live}_old_")
        assert all(check.equal for check in report.checks), [c.describe() for c in report.checks]
        sums = {c.table: c.live for c in report.checks}
        assert sums["checkpoints"] is not None and sums["checkpoints"].rows >= 120
        assert sums["store_vectors"] is not None and sums["store_vectors"].rows >= 20
        assert report.events >= sum(report.offsets.values())

        # After the switch the live projector applies new writes into the new schema, read back through the API.
        after = await _write_load(saver, store, "after", rounds=3, threads=5)
        written.update(after)
        got = await saver.aget_tuple({"configurable": {"thread_id": "after-4", "checkpoint_ns": ""}})
        assert got is not None and got.checkpoint["channel_values"]["step"] == 2
        item = await store.aget(("after", "docs"), "k4")
        assert item is not None and item.value == {"text": "doc 4 at 2", "step": 2}

        conn = await asyncpg.connect(settings.postgres_dsn)
        try:
            # Nothing lost, nothing doubled: the (new) live schema comes to hold exactly the checkpoints written.
            async def projected() -> dict[str, int]:
                rows = await conn.fetch(f"SELECT thread_id, count(*) AS n FROM {live}.checkpoints GROUP BY thread_id")
                return {r["thread_id"]: r["n"] for r in rows}

            with contextlib.suppress(TimeoutError):
                await wait_for(lambda: _equals(projected(), written), "every checkpoint written projected")
            assert await projected() == written
            # The old schema stopped at the switch; the new one went on.
            old_count = await conn.fetchval(f"SELECT count(*) FROM {report.retired}.checkpoints")
            assert old_count == sums["checkpoints"].rows < sum(written.values())
            # The rebuild loaded without secondary indexes and got the live schema's before the switch.
            assert set(await secondary_indexes(conn, live)) == set(await secondary_indexes(conn, report.retired))
            assert "checkpoints_thread_id_idx" in await secondary_indexes(conn, live)
        finally:
            await conn.close()
        assert reads > 0 and failures == []

        # A second rebuild (no switch) of the schema the projector kept writing after the switch equals it.
        second = await run_replay(settings, switch=False, out=None)
        assert second.retired is None and all(c.equal for c in second.checks)
        assert second.offsets == {tp: o for tp, o in (await _live_offsets(settings)).items()}

    # drop-old, through the CLI: the old schema goes, the live one and its rebuild-in-waiting stay.
    monkeypatch.setenv("GRAPHLEDGER_POSTGRES_DSN", settings.postgres_dsn)
    monkeypatch.setenv("GRAPHLEDGER_POSTGRES_SCHEMA", live)
    assert await asyncio.to_thread(cli_main, ["replay", "drop-old", "not_ours"]) == 1
    assert await asyncio.to_thread(cli_main, ["replay", "drop-old"]) == 0
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        names = {s.name: s.role for s in await schemas.list_schemas(conn, live)}
        assert names == {live: "live", schemas.rebuild_name(live): "rebuild"}
    finally:
        await conn.close()


@pytest.mark.parametrize("workers", [1, 2])
async def test_a_replay_of_copies_onto_threads_with_records_equals_the_live_projection(
    settings: Settings, workers: int
) -> None:
    """Each copy lands in its target after the target's delete or prune acknowledged before it, live and in
    the rebuild (whose lanes reach a target's barrier before or after its copy's record; split between two
    workers, in batches of 5, a barrier can wait for a partition of the other worker's share)."""
    async with live_stack(settings), KafkaSaver(settings) as saver, KafkaSaver(settings) as reader:
        expected = {}
        for n in range(8):
            source, target = f"copy-source-{n}", f"copy-target-{n}"
            head = await _put_checkpoint(saver, source, 0, None)
            await _put_checkpoint(saver, source, 1, head)
            head = await _put_checkpoint(saver, target, 0, None)
            await _put_checkpoint(saver, target, 1, head)
            if n % 2:
                await saver.aprune([target])  # keeps the target's newest
                expected[target] = 3
            else:
                await saver.adelete_thread(target)
                expected[target] = 2
            await saver.acopy_thread(source, target)
            await _put_checkpoint(saver, source, 2, None)  # after the copy: not copied
        for target, checkpoints in expected.items():  # another process's reads wait for the projection
            found = [t async for t in reader.alist({"configurable": {"thread_id": target}})]
            assert len(found) == checkpoints, target

        await _until_live_at_log_end(settings)
        split = settings.model_copy(update={"replay_batch_max_events": 5}) if workers > 1 else settings
        report = await run_replay(split, switch=False, out=None, workers=workers)
    assert all(check.equal for check in report.checks), [c.describe() for c in report.checks]
    assert {c.table: c.live.rows for c in report.checks if c.live}["graphledger_copy_stages"] == 0


async def test_a_replay_parks_what_the_live_projection_parked_and_drops_what_an_operator_dropped(
    settings: Settings,
) -> None:
    """Records no projector version can apply, published by a producer with threads' record keys: one
    claiming version 99 (its thread's next write held with it), another an operator dropped, and a copy
    barrier naming a position past its log's end, which the log has grown past since. The rebuild parks
    the same subjects holding the same records (compared with the projection tables), dead-letters the
    dropped one, and parks the barrier as the live projector found it."""
    async with live_stack(settings), KafkaSaver(settings) as saver:
        threads = {name: await _put_checkpoint(saver, name, 0, None) for name in ("parked", "dropped", "copied")}
        keys = {name: saver._runtime.record_key_of_thread(name) for name in threads}
        producer = raw_producer(settings)
        await producer.start()
        conn = await asyncpg.connect(settings.postgres_dsn)
        try:
            forged = to_envelope(put("x", 1))
            too_new = Envelope(forged.type, forged.event_id, forged.produced_ms, forged.payload, version=99)
            positions = {}
            for name in ("parked", "dropped"):
                sent = await producer.send_and_wait(settings.checkpoint_topic, envelope.encode(too_new),
                                                    key=keys[name], headers=envelope.headers_for(too_new))  # fmt: skip
                positions[name] = f"{settings.checkpoint_topic}:{sent.partition}@{sent.offset}"
            await _put_checkpoint(saver, "parked", 1, threads["parked"])  # held with its thread
            tail = LogTail(settings)
            await tail.start()
            try:
                end = await log_ends(tail, {(settings.checkpoint_topic, 0)}, WAIT_S)
            finally:
                await tail.stop()
            ahead = end[(settings.checkpoint_topic, 0)] + 50
            barrier = to_envelope(ThreadCopyBarrier("copied", 0, ahead))
            await producer.send_and_wait(settings.checkpoint_topic, envelope.encode(barrier), key=keys["copied"],
                                         headers=envelope.headers_for(barrier))  # fmt: skip
            await wait_for(lambda: _parked_count(conn, settings, 3), "three subjects to park", WAIT_S)
            (dropped,) = await release(settings, [positions["dropped"]], drop=True)
            assert dropped.released is not None and dropped.released.result.dead_letters == 1
            for n in range(60):  # the copy's partition grows past the position the barrier names
                filler = to_envelope(put(f"filler-{n}", 1))
                value, headers = envelope.encode(filler), envelope.headers_for(filler)
                key = f"filler-{n}".encode()
                await producer.send_and_wait(settings.checkpoint_topic, value, partition=0, key=key, headers=headers)
            await _until_projected(settings, "checkpoints", "thread_id = $1", "filler-59")
            assert await _parked_count(conn, settings, 2)
        finally:
            await conn.close()
            await producer.stop()
        report = await run_replay(settings, switch=False, out=None)
    assert all(check.equal for check in report.checks), [c.describe() for c in report.checks]
    rows = {c.table: c.live.rows for c in report.checks if c.live}
    # The version-99 record and the put and writes after it; the barrier.
    assert rows["graphledger_parked_subjects"] == 2 and rows["graphledger_held_records"] == 4


async def _parked_count(conn: asyncpg.Connection, settings: Settings, expected: int) -> bool:
    query = f"SELECT count(*) FROM {settings.postgres_schema}.graphledger_parked_subjects"
    return bool(await conn.fetchval(query) == expected)


async def _equals(found: Awaitable[object], expected: object) -> bool:
    return await found == expected


async def _until_projected(settings: Settings, table: str, where: str, *args: Any) -> None:
    """Until the live projection holds a row of `table` matching `where`: reads no longer wait for it
    (the read API reads through), and a replay rebuilds up to where the live projection has applied."""
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        await wait_for(
            lambda: count(conn, settings.postgres_schema, table, where, *args), f"{table} where {where} projected"
        )
    finally:
        await conn.close()


async def _live_offsets(settings: Settings) -> dict[tuple[str, int], int]:
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        rows = await conn.fetch(
            f"SELECT topic, partition, next_offset FROM {settings.postgres_schema}.graphledger_offsets "
            "WHERE consumer_group = $1",
            settings.projector_group_id,
        )
        return {(r["topic"], r["partition"]): r["next_offset"] for r in rows}
    finally:
        await conn.close()


async def test_a_tampered_live_schema_fails_verification_and_nothing_switches(settings: Settings) -> None:
    async with live_stack(settings), KafkaSaver(settings) as saver, KafkaStore(settings, index=_index()) as store:
        await _write_load(saver, store, "t", rounds=2, threads=3)
        await _until_projected(settings, "store", "key = $1", "k1")
        conn = await asyncpg.connect(settings.postgres_dsn)
        try:
            live = settings.postgres_schema
            await conn.execute(f"UPDATE {live}.store SET value = '{{\"tampered\": true}}' WHERE key = 'k1'")
            with pytest.raises(ReplayVerificationError, match="store: DIFFERENT"):
                await run_replay(settings, out=None)
            assert [s.role for s in await schemas.list_schemas(conn, live)] == ["live", "rebuild"]
            assert await conn.fetchval(f"SELECT count(*) FROM {live}.store WHERE value ? 'tampered'") == 1
            # Told to (a rebuild meant to differ), it switches to what the log says.
            report = await run_replay(settings, accept_differences=True, out=None)
            assert report.retired is not None and [c.table for c in report.checks if not c.equal] == ["store"]
            assert await conn.fetchval(f"SELECT count(*) FROM {live}.store WHERE value ? 'tampered'") == 0
        finally:
            await conn.close()


async def test_refuses_finite_retention_unless_loss_is_accepted(
    make_settings: Callable[..., Settings], monkeypatch: Any
) -> None:
    s = make_settings()
    admin = raw_admin(s)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(s.checkpoint_topic, 2, 1, topic_configs={"retention.ms": "3600000"})])
    finally:
        await admin.close()
    await ensure_topics(s, allow_finite_retention=True)
    await migrate(s.postgres_dsn, s.postgres_schema)

    with pytest.raises(LossRefusedError, match=rf"{s.checkpoint_topic} has retention.ms=3600000"):
        await run_replay(s, out=None)
    for name, value in s.model_dump(mode="json").items():
        if value is not None and not isinstance(value, dict):
            monkeypatch.setenv(f"GRAPHLEDGER_{name.upper()}", str(value))
    assert await asyncio.to_thread(cli_main, ["replay", "run"]) == 1
    conn = await asyncpg.connect(s.postgres_dsn)
    try:
        assert [x.role for x in await schemas.list_schemas(conn, s.postgres_schema)] == ["live"]  # nothing built
    finally:
        await conn.close()

    report = await run_replay(s, accept_loss=True, out=None)
    assert report.retired is not None and report.losses == [
        f"topic {s.checkpoint_topic} has retention.ms=3600000 (events older than that are deleted)"
    ]


@pytest.mark.parametrize(
    "lock",
    [
        "LOCK TABLE {live}.graphledger_offsets IN EXCLUSIVE MODE",  # what the replay takes
        "SELECT * FROM {live}.graphledger_offsets FOR UPDATE",  # rows only: the batch locks the old table's
    ],
)
async def test_a_projector_batch_blocked_by_the_switch_lands_in_the_new_schema(
    fresh_database: str, lock: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The live projector's side of the switch, step by step: its batch waits on the replay's lock, the
    schemas are renamed, and the batch (statements already prepared on its connection) lands in the
    schema now carrying the name, continuing from the same offset. Behind a table lock Postgres itself
    resolves the name again after the wait; behind row locks the batch has locked the old table's rows,
    and the offsets-table check makes it re-run."""
    live, group, topic = "live", "g", TOPIC
    caplog.set_level(logging.INFO, logger="graphledger_server.projection.batch")
    await migrate(fresh_database, live)
    await migrate(fresh_database, schemas.rebuild_name(live))

    async def noop(letters: Any) -> None:
        raise AssertionError(f"no dead letters expected: {letters}")

    def applier(schema: str) -> BatchApplier:
        return BatchApplier(schema, group, {topic: CheckpointProjection(schema)}, noop)

    first = [record(put("t", 1), 0, 0)]
    projector_conn = await asyncpg.connect(fresh_database)
    replay_conn = await asyncpg.connect(fresh_database)
    try:
        projector = applier(live)
        await projector.apply(projector_conn, first)  # prepares the projector's statements on its connection
        await applier(schemas.rebuild_name(live)).apply(replay_conn, first)

        async with replay_conn.transaction():
            await replay_conn.execute(lock.format(live=live))
            blocked = asyncio.create_task(projector.apply(projector_conn, [record(put("t", 2, 1), 0, 1)]))
            pid = projector_conn.get_server_pid()

            async def waiting() -> bool:
                state = "SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1"
                return await replay_conn.fetchval(state, pid) == "Lock"

            await wait_for(waiting, "the projector's batch to wait on the replay's lock", WAIT_S)
            retired = await schemas.switch(replay_conn, live, datetime.now(UTC))
        result = await blocked

        assert result.applied == 1 and result.next_offsets == {(topic, 0): 2}
        reran = any("re-running the batch" in r.getMessage() for r in caplog.records)
        assert reran == lock.startswith("SELECT")
        new = await replay_conn.fetch(f"SELECT checkpoint_id FROM {live}.checkpoints ORDER BY 1")
        old = await replay_conn.fetch(f"SELECT checkpoint_id FROM {retired}.checkpoints ORDER BY 1")
        assert [r[0] for r in new] == [cid(1), cid(2)] and [r[0] for r in old] == [cid(1)]
        offsets = "SELECT next_offset FROM {}.graphledger_offsets"
        assert await replay_conn.fetchval(offsets.format(live)) == 2
        assert await replay_conn.fetchval(offsets.format(retired)) == 1
    finally:
        await projector_conn.close()
        await replay_conn.close()


def _share_partitions(settings: Settings, share: Share) -> list[tuple[str, int]]:
    return share.of((t, p) for t in source_topics(settings) for p in range(settings.topic_partitions))


async def _until_live_at_log_end(settings: Settings) -> None:
    """Until the live projector applied every record the source topics hold now: a replay then has it all to
    load at once, not as the live projector gets to it."""
    tail = LogTail(settings)
    await tail.start()
    try:
        tps = {(t, p) for t in source_topics(settings) for p in range(settings.topic_partitions)}
        ends = await log_ends(tail, tps, WAIT_S)
    finally:
        await tail.stop()
    await wait_applied(settings, ends, "the live projector at the log's end")


async def _share_row(settings: Settings, schema: str, share: int) -> asyncpg.Record | None:
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        if not await conn.fetchval("SELECT to_regclass($1::text) IS NOT NULL", f"{schema}.graphledger_replay_shares"):
            return None
        return await conn.fetchrow(f"SELECT * FROM {schema}.graphledger_replay_shares WHERE share = $1", share)
    finally:
        await conn.close()


async def test_a_replay_split_between_worker_processes_equals_the_live_projection_and_resumes(
    settings: Settings,
) -> None:
    """`replay run --workers 2`: worker 1 runs as a child process of the run and marks its share done with the
    records it applied; the rebuild verifies equal; a later run of one worker resumes from what both stored."""
    live = settings.postgres_schema
    rebuilt = schemas.rebuild_name(live)
    async with live_stack(settings), KafkaSaver(settings) as saver, KafkaStore(settings, index=_index()) as store:
        await _write_load(saver, store, "split", rounds=6, threads=20)
        await _until_live_at_log_end(settings)
        # Batches smaller than a share: a worker leaves the last batch of its share to the coordinator.
        small = settings.model_copy(update={"replay_batch_max_events": 20})
        report = await run_replay(small, switch=False, out=None, workers=2)
        assert report.retired is None and all(c.equal for c in report.checks), [c.describe() for c in report.checks]
        row = await _share_row(settings, rebuilt, 1)
        assert row is not None and row["shares"] == 2 and row["done_at"] is not None and row["records"] > 0
        assert report.events >= sum(report.offsets.values())

        await _write_load(saver, store, "more", rounds=2, threads=5)
        second = await run_replay(settings, out=None)
    assert second.retired is not None and all(c.equal for c in second.checks)
    assert 0 < second.events < report.events  # resumed from the offsets both workers stored
    assert await _share_row(settings, live, 1) is None  # the shares' marks went with the switch


async def test_a_replay_worker_killed_mid_share_resumes_it_when_started_again(settings: Settings) -> None:
    """The Indexed Job's shape: the coordinator (worker 0) here, worker 1 as a process of its own started with
    the run's id, killed (SIGKILL) with its share half loaded and started again with the same index: it
    resumes from its share's stored offsets, the coordinator waits for it, and the run verifies equal and
    switches."""
    live = settings.postgres_schema
    rebuilt = schemas.rebuild_name(live)
    worker_tps = _share_partitions(settings, Share(1, 2))
    env = {**os.environ, **settings_to_env(settings), "GRAPHLEDGER_REPLAY_BATCH_MAX_EVENTS": "5"}
    argv = [sys.executable, "-m", "graphledger_server", "replay", "run", "--workers", "2", "--worker-index", "1",
            "--run-id", "job-1"]  # fmt: skip

    async def worker_applied() -> int:
        conn = await asyncpg.connect(settings.postgres_dsn)
        try:
            if not await conn.fetchval("SELECT to_regclass($1::text) IS NOT NULL", f"{rebuilt}.graphledger_offsets"):
                return 0
            rows = await conn.fetch(f"SELECT topic, partition, next_offset FROM {rebuilt}.graphledger_offsets")
            return sum(r["next_offset"] for r in rows if (r["topic"], r["partition"]) in worker_tps)
        finally:
            await conn.close()

    async with live_stack(settings), KafkaSaver(settings) as saver, KafkaStore(settings, index=_index()) as store:
        await _write_load(saver, store, "kill", rounds=8, threads=25)
        await _until_live_at_log_end(settings)
        coordinator = asyncio.create_task(run_replay(settings, out=None, workers=2, spawn=False, run="job-1"))
        try:
            first = await asyncio.create_subprocess_exec(*argv, env=env)
            await wait_for(lambda: _positive(worker_applied()), "worker 1 to apply part of its share", WAIT_S)
            first.send_signal(signal.SIGSTOP)  # frozen half way: nothing it does can finish the share now
            row = await _share_row(settings, rebuilt, 1)
            assert row is not None and row["done_at"] is None
            half = await worker_applied()
            first.kill()
            await first.wait()
            assert not coordinator.done()  # it waits for share 1

            again = await asyncio.create_subprocess_exec(*argv, env=env, stdout=asyncio.subprocess.PIPE)
            out, _ = await asyncio.wait_for(again.communicate(), WAIT_S)
            assert again.returncode == 0, out
            report = await asyncio.wait_for(coordinator, WAIT_S)
        finally:
            coordinator.cancel()
    assert report.retired is not None and all(c.equal for c in report.checks), [c.describe() for c in report.checks]
    # Started again, it applied what its share had left, not its share from offset 0.
    resumed = int(out.decode().split("applied ")[1].split(" events")[0].replace(",", ""))
    assert 0 < resumed <= sum(o for tp, o in report.offsets.items() if tp in worker_tps) - half


async def _positive(found: Awaitable[int]) -> bool:
    return await found > 0
