"""`graphledger import --from-postgres`: a database written by the official AsyncPostgresSaver and
AsyncPostgresStore through a real LangGraph graph, imported into the dev stack's topics and projected
by its projector, reads the same through KafkaSaver and KafkaStore; importing twice changes nothing;
an interrupted import resumes where it stopped."""

from __future__ import annotations

import asyncio
import operator
import os
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, TypedDict

import asyncpg
import psycopg
import pytest
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.graph import END, START, StateGraph
from langgraph.store.postgres import AsyncPostgresStore
from langgraph.types import interrupt
from psycopg.conninfo import make_conninfo

from graphledger import KafkaSaver, KafkaStore
from graphledger.embeddings import HashEmbedder
from graphledger.errors import ImportMismatchError
from graphledger.settings import Settings
from graphledger_server.devstack.stack import DevStack, settings_to_env
from graphledger_server.importer.run import ImportReport, connect, import_postgres
from graphledger_server.importer.source import Source
from polling import wait_applied, wait_for, within

THREADS = 300
INTERRUPTED_THREADS = 20
ITEMS = 60
CONCURRENCY = 16
WAIT_S = 120.0
READ_S = 60.0
"""A thread's reads take milliseconds: a read that hangs fails as that read, not as the test's timeout."""
SCORE_TOLERANCE = 1e-4


class State(TypedDict):
    count: int
    log: Annotated[list[str], operator.add]


def _step(state: State) -> dict[str, Any]:
    return {"count": state["count"] + 1, "log": [f"step {state['count']}"]}


def _work(state: State) -> dict[str, Any]:
    return {"log": ["worked"]}


def _ask(state: State) -> dict[str, Any]:
    return {"log": [interrupt("need a human")]}


def _graph() -> StateGraph:
    builder = StateGraph(State)
    builder.add_node("step", _step)
    builder.add_edge(START, "step")
    builder.add_edge("step", END)
    return builder


def _interrupting_graph() -> StateGraph:
    """A subgraph (checkpoints in a namespace), then two parallel tasks, one of them interrupted: the
    other's writes stay pending beside the interrupt."""
    sub = StateGraph(State)
    sub.add_node("inner", _step)
    sub.add_edge(START, "inner")
    sub.add_edge("inner", END)
    builder = StateGraph(State)
    builder.add_node("sub", sub.compile())
    builder.add_node("work", _work)
    builder.add_node("ask", _ask)
    builder.add_edge(START, "sub")
    builder.add_edge("sub", "work")
    builder.add_edge("sub", "ask")
    builder.add_edge(["work", "ask"], END)
    return builder


def _index(dims: int) -> dict[str, Any]:
    return {"dims": dims, "embed": HashEmbedder(dims), "fields": ["text"]}


@dataclass
class SourceDb:
    dsn: str
    prefix: str
    """Every thread id and store namespace root starts with it."""
    thread_ids: list[str]
    namespaces: list[tuple[str, ...]]


async def _gather_bounded(jobs: list[Callable[[], Awaitable[Any]]]) -> None:
    gate = asyncio.Semaphore(CONCURRENCY)

    async def run(job: Callable[[], Awaitable[Any]]) -> None:
        async with gate:
            await job()

    await asyncio.gather(*(run(job) for job in jobs))


@pytest.fixture(scope="module")
async def source(stack: DevStack) -> SourceDb:
    """A new database on the stack's Postgres, written only by the official saver and store."""
    name = f"import_src_{uuid.uuid4().hex[:10]}"
    async with await psycopg.AsyncConnection.connect(stack.settings.postgres_dsn, autocommit=True) as conn:
        await conn.execute(f'CREATE DATABASE "{name}"')
    dsn = make_conninfo(stack.settings.postgres_dsn, dbname=name)
    prefix = f"imp{uuid.uuid4().hex[:6]}"
    thread_ids = [f"{prefix}-{i:03d}" for i in range(THREADS)]
    interrupted = [f"{prefix}-int-{i:02d}" for i in range(INTERRUPTED_THREADS)]
    async with AsyncPostgresSaver.from_conn_string(dsn) as saver:
        await saver.setup()
        simple = _graph().compile(checkpointer=saver)
        asking = _interrupting_graph().compile(checkpointer=saver)

        def invoke_twice(thread_id: str) -> Callable[[], Awaitable[None]]:
            async def job() -> None:
                config = {"configurable": {"thread_id": thread_id}}
                await simple.ainvoke({"count": 0, "log": []}, config)
                await simple.ainvoke({"count": 10, "log": ["again"]}, config)

            return job

        def invoke_interrupted(thread_id: str) -> Callable[[], Awaitable[None]]:
            async def job() -> None:
                await asking.ainvoke({"count": 0, "log": []}, {"configurable": {"thread_id": thread_id}})

            return job

        await _gather_bounded([invoke_twice(t) for t in thread_ids] + [invoke_interrupted(t) for t in interrupted])
    dims = int(stack.settings.store_vector_dims)  # type: ignore[arg-type]
    namespaces = [(prefix, "docs"), (prefix, "users", "ann"), (prefix, "plain")]
    async with AsyncPostgresStore.from_conn_string(dsn, index=_index(dims)) as store:  # type: ignore[arg-type]
        await store.setup()
        words = "pizza river garden music market cat train report".split()
        for i in range(ITEMS):
            ns = namespaces[i % len(namespaces)]
            value = {"text": f"{words[i % len(words)]} {words[(i * 3) % len(words)]} {i}", "n": i}
            await store.aput(ns, f"k{i:02d}", value, index=False if ns[-1] == "plain" else None)
        for i in range(0, ITEMS, 2):  # re-put half: their updated_at moves past their created_at
            ns = namespaces[i % len(namespaces)]
            value = {"text": f"updated {words[i % len(words)]}", "n": -i}
            await store.aput(ns, f"k{i:02d}", value, index=False if ns[-1] == "plain" else None)
    return SourceDb(dsn, prefix, thread_ids + interrupted, namespaces)


# -- reading both sides ------------------------------------------------------------------------------


async def _applied(stack: DevStack, report: ImportReport) -> None:
    """Wait until the stack's projector applied every record the import published."""
    positions = {tp: offset + 1 for tp, offset in report.positions.items()}
    await wait_applied(stack.settings, positions, f"the projector to apply {report.positions}", poll_s=0.1)


async def _snapshot(stack: DevStack, prefix: str) -> dict[str, list[tuple[Any, ...]]]:
    """The projection rows of the imported threads and items (jsonb as text)."""
    s = stack.settings.postgres_schema
    queries = {
        "checkpoints": f"SELECT thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint::text, "
        f"metadata::text FROM {s}.checkpoints WHERE thread_id LIKE $1 ORDER BY 1, 2, 3",
        "checkpoint_blobs": f"SELECT * FROM {s}.checkpoint_blobs WHERE thread_id LIKE $1 ORDER BY 1, 2, 3, 4",
        "checkpoint_writes": f"SELECT * FROM {s}.checkpoint_writes WHERE thread_id LIKE $1 ORDER BY 1, 2, 3, 4, 5",
        "store": f"SELECT prefix, key, value::text, created_at, updated_at, expires_at, ttl_minutes FROM {s}.store "
        "WHERE prefix LIKE $1 ORDER BY 1, 2",
        "store_vectors": f"SELECT prefix, key, field_name, embedding::text FROM {s}.store_vectors "
        "WHERE prefix LIKE $1 ORDER BY 1, 2, 3",
    }
    conn = await asyncpg.connect(stack.settings.postgres_dsn)
    try:
        return {table: [tuple(r) for r in await conn.fetch(sql, f"{prefix}%")] for table, sql in queries.items()}
    finally:
        await conn.close()


def _ms(value: datetime) -> datetime:
    """A timestamp at the log's resolution (ms): the import carries store times in ms."""
    return value.replace(microsecond=value.microsecond // 1000 * 1000)


def _items(items: list[Any]) -> dict[tuple[tuple[str, ...], str], tuple[Any, ...]]:
    return {(i.namespace, i.key): (i.value, _ms(i.created_at), _ms(i.updated_at)) for i in items}


@pytest.fixture(scope="module")
async def imported(stack: DevStack, source: SourceDb) -> AsyncIterator[ImportReport]:
    report = await import_postgres(stack.settings, source.dsn, thread_chunk=50)
    await _applied(stack, report)
    yield report


async def test_the_import_reads_the_same_tuples_and_items(
    stack: DevStack, source: SourceDb, imported: ImportReport
) -> None:
    assert imported.threads == len(source.thread_ids) and imported.items == ITEMS and not imported.finished_before
    settings = stack.settings
    async with (
        AsyncPostgresSaver.from_conn_string(source.dsn) as official,
        KafkaSaver(settings) as ours,
    ):
        namespaces_seen: set[str] = set()
        pending = 0
        for thread_id in source.thread_ids:
            config = {"configurable": {"thread_id": thread_id}}
            theirs = [t async for t in official.alist(config)]
            async with within(READ_S, f"listing {thread_id}"):
                mine = [t async for t in ours.alist(config)]
            assert mine == theirs, thread_id
            async with within(READ_S, f"getting {thread_id}"):
                got = await ours.aget_tuple(config)
            assert got == await official.aget_tuple(config), thread_id
            namespaces_seen |= {t.config["configurable"]["checkpoint_ns"] for t in theirs}
            pending += sum(len(t.pending_writes or ()) for t in theirs)
        assert len(namespaces_seen) > 1, "no subgraph namespace was exercised"
        assert pending >= 2 * INTERRUPTED_THREADS, "no pending writes were exercised"

    dims = int(settings.store_vector_dims)  # type: ignore[arg-type]
    async with (
        AsyncPostgresStore.from_conn_string(source.dsn, index=_index(dims)) as official_store,  # type: ignore[arg-type]
        KafkaStore(settings, index=_index(dims)) as our_store,  # type: ignore[arg-type]
    ):
        for ns in source.namespaces:
            theirs = await official_store.asearch(ns, limit=1000)
            async with within(READ_S, f"searching {ns}"):
                mine = await our_store.asearch(ns, limit=1000)
            assert _items(mine) == _items(theirs) and theirs
            assert any(i.created_at != i.updated_at for i in mine), "no re-put item kept its creation time"
            for item in theirs[:5]:
                got = await our_store.aget(ns, item.key)
                assert got is not None and _items([got]) == _items([item])
        for query in ("pizza river", "market"):
            ns = source.namespaces[0]
            theirs = await official_store.asearch(ns, query=query, limit=1000)
            async with within(READ_S, f"searching {ns} for {query!r}"):
                found = await our_store.asearch(ns, query=query, limit=1000)
            mine = [i for i in found if i.score is not None]
            assert {i.key for i in mine} == {i.key for i in theirs} and len(theirs) == ITEMS // len(source.namespaces)
            their_scores = {i.key: i.score for i in theirs}
            assert all(abs(i.score - their_scores[i.key]) <= SCORE_TOLERANCE for i in mine)  # type: ignore[operator]
            assert [i.score for i in mine] == sorted((i.score for i in mine), reverse=True)  # type: ignore[type-var]


async def test_importing_twice_changes_nothing(stack: DevStack, source: SourceDb, imported: ImportReport) -> None:
    before = await _snapshot(stack, source.prefix)
    assert len(before["checkpoints"]) > 2 * THREADS and before["store_vectors"]

    # The command, as an operator runs it: it finds the import done and publishes nothing.
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRAPHLEDGER_")} | settings_to_env(stack.settings)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "graphledger_server", "import", "--from-postgres", source.dsn, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), WAIT_S)
    assert process.returncode == 0, err.decode()
    assert "was imported completely before" in out.decode()

    # Even publishing everything again (forgetting the progress) leaves the projection as it was.
    forced = await import_postgres(stack.settings, source.dsn, restart=True, thread_chunk=100)
    assert forced.events == imported.events
    await _applied(stack, forced)
    assert await _snapshot(stack, source.prefix) == before


async def test_an_interrupted_import_resumes(stack: DevStack, source: SourceDb, imported: ImportReport) -> None:
    before = await _snapshot(stack, source.prefix)
    name = f"interrupted-{uuid.uuid4().hex[:8]}"
    settings = stack.settings
    task = asyncio.create_task(import_postgres(settings, source.dsn, name=name, thread_chunk=10))
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        progress_sql = f"SELECT cursor, done FROM {settings.postgres_schema}.graphledger_imports WHERE source = $1"

        async def progressed() -> bool:
            assert not task.done(), "the import finished before it could be interrupted"
            return await conn.fetchrow(progress_sql + " AND stream = 'threads'", name) is not None

        await wait_for(progressed, "the import to record progress", WAIT_S, poll_s=0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        stopped = await conn.fetchrow(progress_sql + " AND stream = 'threads'", name)
        assert not stopped["done"] and stopped["cursor"]
    finally:
        await conn.close()

    resumed = await import_postgres(settings, source.dsn, name=name, thread_chunk=10)
    assert 0 < resumed.threads < len(source.thread_ids), "the import started over instead of resuming"
    assert resumed.items == ITEMS
    await _applied(stack, resumed)
    assert await _snapshot(stack, source.prefix) == before
    assert (await import_postgres(settings, source.dsn, name=name)).finished_before


async def test_a_source_with_other_vector_dims_is_refused_before_publishing(
    stack: DevStack, source: SourceDb, make_settings: Callable[..., Settings]
) -> None:
    settings = make_settings(store_vector_dims=int(stack.settings.store_vector_dims) + 1)  # type: ignore[arg-type]
    with pytest.raises(ImportMismatchError, match="dim vectors"):
        await import_postgres(settings, source.dsn)
    conn = await connect(source.dsn)
    try:
        src = Source(conn, "public")
        await src.inspect()
        assert await src.vector_dims() == int(stack.settings.store_vector_dims)  # type: ignore[arg-type]
    finally:
        await conn.close()
