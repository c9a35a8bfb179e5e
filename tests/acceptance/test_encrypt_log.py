"""`graphledger encrypt-log` as an operator runs it, against the real broker and Postgres.

A deployment writes a log in the clear (encryption off everywhere: a LangGraph graph with a thread
copy and a `delete_for_runs`, store puts with vectors, events large enough to be chunked), then is
upgraded with encryption on before anyone ran the copy, so its clients seal what they write next on
the same topics (a thread written in both eras, a sealed copy). The copy of that log holds no
sentinel or identifier in the clear, projects into a fresh schema exactly as the original projection,
reads back through the client, resumes where a cut copy stopped, and then erases and replays as any
sealed log does. `graphledger repartition` copies the same log into another partition count with the
same machinery (docs/operations.md, "Changing the partition count"), and its copy projects the same rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import operator
import os
import re
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated, Any

import asyncpg
import pytest
from aiokafka import TopicPartition
from aiokafka.partitioner import murmur2
from aiokafka.structs import ConsumerRecord
from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict

from graphledger import KafkaSaver, KafkaStore
from graphledger.client.producer import new_producer
from graphledger.embeddings import HashEmbedder
from graphledger.events.checkpoint import ThreadCopy, ThreadCopyBarrier
from graphledger.events.chunks import parse_header
from graphledger.events.envelope import HEADER_CHUNK, HEADER_SUBJECT, HEADER_TYPE, decode, header
from graphledger.log.tail import LogTail
from graphledger.settings import Settings
from graphledger.tenancy import scoped_thread
from graphledger_server.api.main import server as api_server
from graphledger_server.devstack.broker import EmbeddedBroker
from graphledger_server.devstack.ports import free_port
from graphledger_server.devstack.postgres import EmbeddedPostgres
from graphledger_server.devstack.stack import settings_to_env
from graphledger_server.log.topics import ensure_topics, source_topics
from graphledger_server.log_copy.target import HEADER_COPY_OF
from graphledger_server.opening.vector_index import VectorIndex
from graphledger_server.projection.migrate import migrate
from graphledger_server.projector.main import run_projector
from graphledger_server.replay.checksums import table_sum
from kafka_clients import raw_consumer
from polling import wait_applied, wait_for
from sealed_events import unsealed

DIMS = 8
WAIT_S = 90.0
COMMAND_TIMEOUT_S = 180
SENTINEL = b"SENTINEL-"
"""Every value the agents wrote carries it."""
BIG = 25_000
"""Bytes of filler that make an event larger than the log's 10,000-byte records: it is chunked."""
REBORN_THREADS = 6
"""Threads written in the clear, then deleted and written again sealed: their two eras sit on two
partitions, in one order or the other (copied partition after partition, most would come out wrong)."""
TENANT = "acme"
USER_TABLES = ("checkpoints", "checkpoint_blobs", "checkpoint_writes", "store", "store_vectors")
LINEAGE_TABLES = ("graphledger_thread_copies",)


class State(TypedDict, total=False):
    secret: str
    big: str
    notes: Annotated[list[str], operator.add]


def _note(state: State) -> dict[str, Any]:
    return {"notes": [f"{state['secret']} note {len(state.get('notes', []))}"]}


def _graph(saver: KafkaSaver) -> Any:
    builder = StateGraph(State)
    builder.add_node("note", _note)
    builder.add_edge(START, "note")
    builder.add_edge("note", END)
    return builder.compile(checkpointer=saver)


def _index() -> dict[str, Any]:
    return {"dims": DIMS, "embed": HashEmbedder(DIMS), "fields": ["text"]}


@dataclass
class Log:
    run: str
    """In every thread id and namespace label: no record of the copy may show it."""
    original: Settings
    """The deployment that wrote the log (encryption on since its upgrade), projected into `live`."""
    sealed: Settings
    """The same with the copy's prefix, its own schema and consumer group."""
    threads: dict[str, str]
    runs: dict[str, str]
    """Run ids of beta's first (deleted by `delete_for_runs`) and second (kept) run."""
    copy_output: str


def _settings(broker: EmbeddedBroker, dsn: str, prefix: str, schema: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "kafka_bootstrap_servers": broker.bootstrap_servers,
        "kafka_idempotence": False,
        "topic_prefix": prefix,
        "topic_partitions": 4,
        "topic_replication_factor": 1,
        "topic_allow_single_broker_acks": True,
        "projector_group_id": f"g-{prefix}",
        "postgres_dsn": dsn,
        "postgres_schema": schema,
        "store_vector_dims": DIMS,
        "store_index": "flat",
        "max_message_bytes": 10_000,
        "batch_max_wait_ms": 20,
        "consistency_timeout_s": 30,
    }
    values.update(overrides)
    return Settings(**values)


def _serving(settings: Settings) -> Settings:
    port = free_port()
    return settings.model_copy(update={"api_port": port, "api_url": f"http://127.0.0.1:{port}"})


@contextlib.asynccontextmanager
async def services(settings: Settings) -> AsyncIterator[Settings]:
    """An in-process projector and read API on `settings`; yields the settings clients reach them with."""
    settings = _serving(settings)
    await migrate(settings.postgres_dsn, settings.postgres_schema, vectors=VectorIndex.from_settings(settings))
    stop = asyncio.Event()
    projector = asyncio.create_task(run_projector(settings, stop, migrate_first=False))
    api = api_server(settings)
    serving = asyncio.create_task(api.serve())

    async def listening() -> bool:
        if serving.done():
            serving.result()
        return bool(api.started)

    try:
        await wait_for(listening, "the read API to listen", WAIT_S)
        yield settings
    finally:
        api.should_exit = True
        stop.set()
        await asyncio.wait_for(asyncio.gather(serving, projector), 60)


async def _ends(settings: Settings, topic: str) -> dict[TopicPartition, int]:
    """Each partition's high watermark, from a fetch."""
    tail = LogTail(settings)
    await tail.start()
    try:
        count = await tail.partition_count(topic)
        return await tail.ends({TopicPartition(topic, p): 0 for p in range(count)}, 30)
    finally:
        await tail.stop()


async def _applied(settings: Settings) -> None:
    """Wait until the projector of `settings` has applied both topics to their ends."""
    ends = {(tp.topic, tp.partition): end for topic in source_topics(settings)
            for tp, end in (await _ends(settings, topic)).items()}  # fmt: skip
    await wait_applied(settings, ends, f"the projection {settings.postgres_schema} to reach the log's end")


async def _records(settings: Settings, topic: str) -> list[ConsumerRecord[bytes, bytes]]:
    """Every record of `topic` up to its end, by partition and offset."""
    ends = {tp: end for tp, end in (await _ends(settings, topic)).items() if end}
    if not ends:
        return []
    consumer = raw_consumer(settings)
    await consumer.start()
    found: list[ConsumerRecord[bytes, bytes]] = []
    try:
        consumer.assign(list(ends))
        await consumer.seek_to_beginning(*ends)
        deadline = time.monotonic() + WAIT_S
        while [tp for tp, end in ends.items() if await consumer.position(tp) < end]:
            assert time.monotonic() < deadline, f"timed out reading {topic}"
            for tp, records in (await consumer.getmany(timeout_ms=500)).items():
                found += [r for r in records if r.offset < ends[tp]]
    finally:
        await consumer.stop()
    return sorted(found, key=lambda r: (r.partition, r.offset))


def _raw(record: ConsumerRecord[bytes, bytes]) -> bytes:
    return b"\x00".join([record.key or b"", record.value or b"", *(k.encode() + v for k, v in record.headers)])


async def graphledger(settings: Settings, *args: str) -> tuple[int, str, str]:
    """The CLI as an operator runs it: a subprocess configured by GRAPHLEDGER_* variables only."""
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("GRAPHLEDGER_")}
    env.update(settings_to_env(settings))
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "graphledger_server", *args, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), COMMAND_TIMEOUT_S)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def encrypt_log(settings: Settings, to_prefix: str) -> tuple[int, str, str]:
    """`graphledger encrypt-log`, told of a tenant whose token the deployment no longer lists."""
    return await graphledger(settings, "encrypt-log", "--to-prefix", to_prefix, "--tenant", TENANT)


async def _invoke(saver: KafkaSaver, thread: str, run_id: str | None = None) -> None:
    config: dict[str, Any] = {"configurable": {"thread_id": thread}}
    if run_id is not None:
        config["configurable"]["run_id"] = run_id
    secret = f"SENTINEL-secret-{thread}"
    await _graph(saver).ainvoke({"secret": secret, "big": f"SENTINEL-big-{thread} " + "y" * BIG}, config)


@pytest.fixture(scope="module")
async def copied(broker: EmbeddedBroker, pg: EmbeddedPostgres) -> Log:
    run = uuid.uuid4().hex[:10]
    dsn = pg.create_database(f"t_{uuid.uuid4().hex[:12]}")
    # Its services read a log with a clear era (docs/operations.md); those of the sealed copy refuse one.
    original = _settings(broker, dsn, f"clear{run}", "live", accept_clear_events=True)
    threads = {name: f"{name}-{run}" for name in ("alpha", "beta", "gamma", "delta", "epsilon")}
    threads["tenanted"] = scoped_thread(TENANT, f"tenanted-{run}")  # as a tenant's client stores its threads
    await ensure_topics(original)
    clear = original.model_copy(update={"encrypt_events": False})
    runs = {"deleted": str(uuid.uuid4()), "kept": str(uuid.uuid4())}
    reborn = [f"zeta{i}-{run}" for i in range(REBORN_THREADS)]
    async with services(clear) as reach, KafkaSaver(reach) as saver, KafkaStore(reach, index=_index()) as store:
        await _invoke(saver, threads["alpha"])
        await _invoke(saver, threads["tenanted"])
        for thread in reborn:
            await _invoke(saver, thread)
        await _invoke(saver, threads["beta"], runs["deleted"])
        await _invoke(saver, threads["beta"], runs["kept"])
        await saver.acopy_thread(threads["alpha"], threads["gamma"])
        await _invoke(saver, threads["gamma"])  # after the copy barrier
        await saver.adelete_for_runs([runs["deleted"]])  # to every partition
        for user in ("one", "two"):
            namespace = ("users", f"user-{user}-{run}", "memories")
            await store.aput(namespace, "likes", {"text": f"SENTINEL-likes-{user}-{run}"})
            await store.aput(namespace, "story", {"text": "SENTINEL-story " + "z" * BIG})
            await store.aput(namespace, "plain", {"note": f"SENTINEL-plain-{user}"}, index=False)
        await store.adelete(("users", f"user-two-{run}", "memories"), "plain")
        await _applied(reach)
    # Upgraded with encryption on before anyone ran the copy: new writes are sealed, on the same topics.
    async with services(original) as reach, KafkaSaver(reach) as saver, KafkaStore(reach, index=_index()) as store:
        await _invoke(saver, threads["beta"])  # a thread with events of both eras
        for thread in reborn:  # deleted, then written again: on another partition than its first events
            await saver.adelete_thread(thread)
            await _invoke(saver, thread)
        await _invoke(saver, threads["delta"])
        await saver.acopy_thread(threads["delta"], threads["epsilon"])  # a sealed copy and barrier
        await _invoke(saver, threads["epsilon"])
        await store.aput(("users", f"user-three-{run}", "memories"), "likes", {"text": f"SENTINEL-likes-three-{run}"})
        await _applied(reach)
    # The writers are stopped: copy.
    sealed = _settings(broker, dsn, f"sealed{run}", "sealed")
    status, out, err = await encrypt_log(original, sealed.topic_prefix)
    assert status == 0, err
    return Log(run, original, sealed, threads, runs, out)


async def test_the_copy_holds_no_content_or_identifier_in_the_clear(copied: Log) -> None:
    run = copied.run.encode()
    for source, target in zip(source_topics(copied.original), source_topics(copied.sealed), strict=True):
        before = await _records(copied.original, source)
        after = await _records(copied.sealed, target)
        assert any(SENTINEL in _raw(r) for r in before) and any(run in _raw(r) for r in before)
        for r in after:
            raw = _raw(r)
            assert SENTINEL not in raw and run not in raw, f"plaintext in {target}:{r.partition}@{r.offset}"
            assert header(r.headers, HEADER_COPY_OF) is not None
            if r.key is not None:  # every keyed event is sealed, keyed by a 128-bit keyed hash
                assert len(r.key) == 32 and int(r.key, 16) >= 0
                assert header(r.headers, HEADER_SUBJECT) is not None
        # Events the upgraded clients sealed are copied as they are (but the barrier, re-pointed).
        sealed_before = {
            r.value
            for r in before
            if header(r.headers, HEADER_SUBJECT) is not None
            and header(r.headers, HEADER_TYPE) != b"thread.copy.barrier"
        }
        assert sealed_before and sealed_before <= {r.value for r in after}
        assert any(header(r.headers, HEADER_CHUNK) is not None for r in after)  # re-framed into chunks
    # Each copy barrier names its copy's record in the new topic, as the broker placed it.
    records = {(r.partition, r.offset): r for r in await _records(copied.sealed, copied.sealed.checkpoint_topic)}
    small = [(position, decode(r.value)) for position, r in records.items() if header(r.headers, HEADER_CHUNK) is None]
    opened = dict(zip([p for p, _ in small], await unsealed(copied.sealed, [e for _, e in small]), strict=True))
    barriers = [e for e in opened.values() if e.type == ThreadCopyBarrier.TYPE]
    assert len(barriers) == 2
    for envelope in barriers:
        barrier = ThreadCopyBarrier.from_payload(envelope.payload)
        copy = ThreadCopy.from_payload(opened[(barrier.source_partition, barrier.source_offset)].payload)
        assert copy.target_thread_id == barrier.target_thread_id
    checkpoints, store = _counts(copied.copy_output)
    assert checkpoints["copy barriers repositioned"] == 2  # one in the clear, one sealed
    assert checkpoints["written to all 4 partitions"] == 4  # runs.delete, once per source partition
    assert checkpoints["sealed"] > 0 and checkpoints["copied as they were"] > 0 and store["sealed"] > 0
    assert checkpoints["left out as unusable"] == store["left out as unusable"] == 0


async def test_a_repartition_copy_projects_the_same_rows(copied: Log) -> None:
    """The procedure of docs/operations.md, "Changing the partition count", steps 2 to 4: the log of 4
    partitions (both eras of sealing, a copy and its barrier in each, a delete_for_runs to every partition,
    chunked events) copied into 3, projected into a fresh schema with the same rows, then written to."""
    original = copied.original
    moved = copied.sealed.model_copy(
        update={
            "topic_prefix": f"moved{copied.run}",
            "topic_partitions": 3,
            "postgres_schema": "moved",
            "projector_group_id": f"g-moved{copied.run}",
            "accept_clear_events": True,  # a repartition copies the clear era as it is
        }
    )
    status, out, err = await graphledger(
        original, "repartition", "--to-prefix", moved.topic_prefix, "--partitions", "3"
    )
    assert status == 0, err
    checkpoints, store = _counts(out)
    assert checkpoints["copy barriers repositioned"] == 2 and checkpoints["written to all 3 partitions"] == 4
    assert checkpoints["sealed"] == store["sealed"] == 0  # as they were: in the clear or sealed
    assert checkpoints["left out as unusable"] == store["left out as unusable"] == 0
    for source, target in zip(source_topics(original), source_topics(moved), strict=True):
        before, after = await _records(original, source), await _records(moved, target)
        assert len(await _ends(moved, target)) == 3  # its count, as moved.layout records it
        for r in after:  # a sealed record where a producer puts its key now; one in the clear goes with them
            if r.key is not None and header(r.headers, HEADER_SUBJECT) is not None:
                assert r.partition == (murmur2(r.key) & 0x7FFFFFFF) % 3
        kept = {r.value for r in before if header(r.headers, HEADER_TYPE) != ThreadCopyBarrier.TYPE.encode()}
        assert kept == {r.value for r in after if header(r.headers, HEADER_TYPE) != ThreadCopyBarrier.TYPE.encode()}

    status, out, err = await graphledger(
        original, "repartition", "--to-prefix", moved.topic_prefix, "--partitions", "3"
    )
    assert status == 0, err
    assert [c["records written"] for c in _counts(out)] == [0, 0], out  # run again: nothing left to write

    conn = await asyncpg.connect(original.postgres_dsn)
    try:
        async with services(moved) as reach, KafkaSaver(reach) as saver:
            await _applied(reach)
            assert await _sums(conn, "moved", USER_TABLES + LINEAGE_TABLES) == await _sums(
                conn, "live", USER_TABLES + LINEAGE_TABLES
            )
            activity = [tuple(r) for r in await conn.fetch(ACTIVITY_SQL.format(schema="live"))]
            assert [tuple(r) for r in await conn.fetch(ACTIVITY_SQL.format(schema="moved"))] == activity
            state = await _graph(saver).aget_state({"configurable": {"thread_id": copied.threads["gamma"]}})
            assert len(state.values["notes"]) == 2  # alpha's run, copied, then gamma's own
            # Switched: agents write to the new topics, on the partitions of the new count.
            await _invoke(saver, copied.threads["gamma"])
            state = await _graph(saver).aget_state({"configurable": {"thread_id": copied.threads["gamma"]}})
            assert len(state.values["notes"]) == 3
    finally:
        await conn.close()


async def test_a_rerun_writes_nothing_and_a_cut_copy_resumes_to_the_same_log(copied: Log) -> None:
    status, out, err = await encrypt_log(copied.original, copied.sealed.topic_prefix)
    assert status == 0, err
    assert [c["records written"] for c in _counts(out)] == [0, 0], out

    # A copy cut short: each partition of the target holds the first part of a finished copy's records.
    cut = copied.sealed.model_copy(update={"topic_prefix": f"cut{copied.run}"})
    await ensure_topics(cut)
    producer = new_producer(cut)
    await producer.start()
    try:
        for whole, part in zip(source_topics(copied.sealed), source_topics(cut), strict=True):
            records = await _records(copied.sealed, whole)
            # The first half of each partition's events (whole: a chunked event's records together). Keys
            # hash anywhere, but a topic's events outnumber its partitions, so some partition keeps one.
            for partition in {r.partition for r in records}:
                events = _events([r for r in records if r.partition == partition])
                for r in itertools.chain.from_iterable(events[: len(events) // 2]):
                    await producer.send_and_wait(part, r.value, key=r.key, headers=list(r.headers), partition=partition)
    finally:
        await producer.stop()
    status, out, err = await encrypt_log(copied.original, cut.topic_prefix)
    assert status == 0, err
    assert all(c["copied by an earlier run"] > 0 and c["records written"] > 0 for c in _counts(out)), out
    for whole, part in zip(source_topics(copied.sealed), source_topics(cut), strict=True):
        assert [_shape(r) for r in await _records(cut, part)] == [
            _shape(r) for r in await _records(copied.sealed, whole)
        ]

    # A target with a hole (a record missing before others of its partition) is not one a run left: refused.
    holed = copied.sealed.model_copy(update={"topic_prefix": f"holed{copied.run}"})
    await ensure_topics(holed)
    # The hole is a keyed record outside a chunk with records after it, chosen by content: keys are keyed
    # hashes of this run's thread ids, so which partition holds one differs from run to run.
    every = await _records(copied.sealed, copied.sealed.checkpoint_topic)
    missing = next(
        r
        for r, after in itertools.pairwise(every)
        if r.key is not None and header(r.headers, HEADER_CHUNK) is None and after.partition == r.partition
    )
    records = [r for r in every if r.partition == missing.partition]
    producer = new_producer(holed)
    await producer.start()
    try:
        for r in records:
            if r is not missing:
                await producer.send_and_wait(
                    holed.checkpoint_topic, r.value, key=r.key, headers=list(r.headers), partition=r.partition
                )
    finally:
        await producer.stop()
    status, _, err = await encrypt_log(copied.original, holed.topic_prefix)
    assert status == 1 and "but not every event the copy writes there before it" in err, err

    status, _, err = await encrypt_log(copied.original, copied.original.topic_prefix)
    assert status == 1 and "is GRAPHLEDGER_TOPIC_PREFIX, the source" in err


def _counts(output: str) -> list[dict[str, int]]:
    """The numbers of each topic's report line: `{"sealed": 12, "records written": 40, ...}`."""
    return [
        {what.strip(): int(n) for n, what in re.findall(r"(\d+) ([a-z][a-z 0-9]*?)(?=[,;]|$)", line.split(": ", 2)[2])}
        for line in output.splitlines()
        if " -> " in line
    ]


def _events(records: list[ConsumerRecord[bytes, bytes]]) -> list[list[ConsumerRecord[bytes, bytes]]]:
    """One partition's records grouped by event: a chunked event's records (written one after the other)
    together, up to its last chunk."""
    events: list[list[ConsumerRecord[bytes, bytes]]] = [[]]
    for r in records:
        events[-1].append(r)
        raw = header(r.headers, HEADER_CHUNK)
        if raw is None or (ref := parse_header(raw)).index == ref.count - 1:
            events.append([])
    return [e for e in events if e]


def _shape(record: ConsumerRecord[bytes, bytes]) -> tuple[Any, ...]:
    """What the copy decides about a record: where, which source event, its type and chunk, its key."""
    chunk = header(record.headers, HEADER_CHUNK)
    chunk_place = None if chunk is None else ((ref := parse_header(chunk)).index, ref.count)
    copy_of = header(record.headers, HEADER_COPY_OF)
    return record.partition, copy_of, header(record.headers, HEADER_TYPE), chunk_place, record.key


async def _sums(conn: asyncpg.Connection, schema: str, tables: tuple[str, ...]) -> dict[str, Any]:
    return {table: await table_sum(conn, schema, table) for table in tables}


ACTIVITY_SQL = "SELECT thread_id, last_active_at FROM {schema}.graphledger_thread_partitions ORDER BY 1"
SUBJECTS_SQL = "SELECT ref, kind, tenant, name FROM {schema}.graphledger_subjects"
THREAD_ROWS_SQL = "SELECT count(*) FROM {schema}.{table} WHERE thread_id = ANY($1::text[])"


async def test_the_copy_projects_reads_erases_and_replays_like_the_original(copied: Log) -> None:
    original, sealed = copied.original, copied.sealed
    conn = await asyncpg.connect(original.postgres_dsn)
    try:
        async with services(sealed) as reach, KafkaSaver(reach) as saver:
            await _applied(reach)
            # The same rows as the projection of the original log: the log's times and ids were kept.
            assert await _sums(conn, "sealed", USER_TABLES + LINEAGE_TABLES) == await _sums(
                conn, "live", USER_TABLES + LINEAGE_TABLES
            )
            activity = [tuple(r) for r in await conn.fetch(ACTIVITY_SQL.format(schema="live"))]
            assert activity and [tuple(r) for r in await conn.fetch(ACTIVITY_SQL.format(schema="sealed"))] == activity
            before = {tuple(r) for r in await conn.fetch(SUBJECTS_SQL.format(schema="live"))}
            after = {tuple(r) for r in await conn.fetch(SUBJECTS_SQL.format(schema="sealed"))}
            assert before and before < after  # the subjects of the sealed era, with the same references
            assert ("thread", TENANT, copied.threads["tenanted"]) in {row[1:] for row in after}
            for schema in ("live", "sealed"):  # delete_for_runs took the first run's checkpoints, in both
                of_run = {
                    r["run"]: r["n"]
                    for r in await conn.fetch(
                        f"SELECT metadata ->> 'run_id' AS run, count(*) AS n FROM {schema}.checkpoints "
                        "WHERE thread_id = $1 GROUP BY 1",
                        copied.threads["beta"],
                    )
                }
                assert copied.runs["deleted"] not in of_run and of_run.get(copied.runs["kept"], 0) > 0, of_run

            # A client with encryption on reads a thread copied before the copy, as it was written.
            state = await _graph(saver).aget_state({"configurable": {"thread_id": copied.threads["gamma"]}})
            assert state.values["secret"] == f"SENTINEL-secret-{copied.threads['gamma']}"
            assert len(state.values["notes"]) == 2  # alpha's run, copied, then gamma's own

            # A thread of the copied log, written in both eras, is erased, and stays so through a replay.
            status, out, err = await graphledger(reach, "erase", "thread", copied.threads["beta"])
            assert status == 0, err
            assert out.count("erased thread") == 1, out

            erased = [copied.threads["beta"]]
            status, out, err = await graphledger(reach, "replay", "run")
            assert status == 0, err
            assert "switched" in out
        for table in ("checkpoints", "checkpoint_blobs", "checkpoint_writes"):
            assert await conn.fetchval(THREAD_ROWS_SQL.format(schema="sealed", table=table), erased) == 0
            kept = await conn.fetchval(
                f"SELECT count(*) FROM sealed.{table} WHERE NOT thread_id = ANY($1::text[])", erased
            )
            assert kept > 0 and kept == await conn.fetchval(
                f"SELECT count(*) FROM live.{table} WHERE NOT thread_id = ANY($1::text[])", erased
            )
        assert await _sums(conn, "sealed", ("store", "store_vectors")) == await _sums(
            conn, "live", ("store", "store_vectors")
        )
        for table in await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'sealed'"):
            rows = await conn.fetch(f'SELECT t::text AS row FROM sealed."{table["tablename"]}" t')
            leaked = [r["row"][:80] for r in rows if any(thread in r["row"] for thread in erased)]
            assert not leaked, f"erased threads in sealed.{table['tablename']}: {leaked}"
    finally:
        await conn.close()
    # The copied log is live now (it holds the erasure): a copy onto it refuses, naming the stranger.
    status, _, err = await encrypt_log(original, sealed.topic_prefix)
    assert status == 1 and "did not write" in err, err
