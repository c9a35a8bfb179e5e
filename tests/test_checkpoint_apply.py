"""The checkpoint projection's set-based apply: ordering, merging, operations, prune (plain and delta)."""

from __future__ import annotations

import dataclasses
import operator
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Annotated, Any

import asyncpg
import pytest
from langgraph.channels import DeltaChannel
from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict

from graphledger.errors import InvalidEventError
from graphledger.events import to_envelope
from graphledger.events.checkpoint import (
    CheckpointEvent,
    RunsDelete,
    ThreadCopy,
    ThreadDelete,
    ThreadExpire,
    ThreadPrune,
)
from graphledger_server.projection.checkpoints import (
    CheckpointProjection,
    CopyThread,
    DataRun,
    DeleteRuns,
    DeleteThreads,
    PruneKeepLatest,
    TimedCheckpointEvent,
    plan_batch,
    to_checkpoint_event,
)
from graphledger_server.projection.migrate import migrate
from projection_helpers import TOPIC, cid, count, dump, official_saver, put, writes

Item = tuple[str, int, int, CheckpointEvent]


@pytest.fixture
async def conn(fresh_database: str) -> AsyncIterator[asyncpg.Connection]:
    await migrate(fresh_database, "gl")
    connection = await asyncpg.connect(fresh_database)
    yield connection
    await connection.close()


def items(events: Sequence[CheckpointEvent], partition: int = 0, first_offset: int = 0) -> list[Item]:
    return [(TOPIC, partition, first_offset + i, e) for i, e in enumerate(events)]


async def apply(conn: asyncpg.Connection, batch: Sequence[Item], schema: str = "gl") -> None:
    async with conn.transaction():
        await CheckpointProjection(schema).apply(conn, batch)


# -- planning (pure) --------------------------------------------------------------------------------


def test_plan_cuts_runs_at_operations_and_merges_consecutive_deletes() -> None:
    plan = plan_batch(
        items(
            [
                put("a", 1),
                writes("a", 1, "task", [("x", b"1")]),
                ThreadDelete("a"),
                ThreadPrune("b", "delete"),
                put("a", 2),
                ThreadCopy("a", "c"),
                RunsDelete(("r1",)),
                ThreadPrune("a", "keep_latest"),
                RunsDelete(()),
                put("a", 3),
            ]
        )
    )
    assert [type(s) for s in plan] == [
        DataRun,
        DeleteThreads,
        DataRun,
        CopyThread,
        DeleteRuns,
        PruneKeepLatest,
        DataRun,
    ]
    assert plan[1] == DeleteThreads(("a", "b"))
    assert plan[3] == CopyThread("a", "c", TOPIC, 0)


def test_plan_merges_duplicate_keys_as_sequential_application_would() -> None:
    (run,) = plan_batch(
        items(
            [
                put("t", 1, parent=0, blobs={"ch": b"first"}),
                put("t", 1, parent=7, blobs={"ch": b"second"}, metadata={"n": 2}),
                writes("t", 1, "task", [("x", b"insert-1")]),
                writes("t", 1, "task", [("x", b"insert-2")]),
                writes("t", 1, "task", [("__error__", b"up-1")], upsert=True, first_idx=-1),
                writes("t", 1, "task", [("__error__", b"up-2")], upsert=True, first_idx=-1, task_path="other"),
                writes("t", 1, "task2", [("__error__", b"up")], upsert=True, first_idx=-1),
                writes("t", 1, "task2", [("x", b"after-upsert")], first_idx=-1),
            ]
        )
    )
    assert isinstance(run, DataRun)
    checkpoints = list(zip(*run.checkpoints, strict=True))
    assert len(checkpoints) == 1
    assert checkpoints[0][3] == cid(0)  # the first put's parent: the upsert does not touch it
    assert '"n": 2' in checkpoints[0][5]  # the last put's metadata
    assert next(zip(*run.blobs, strict=True))[5] == b"first"
    assert list(zip(*run.writes_insert, strict=True)) == [("t", "", cid(1), "task", "", 0, "x", "bytes", b"insert-1")]
    upserts = sorted(zip(*run.writes_upsert, strict=True))
    assert upserts == [
        ("t", "", cid(1), "task", "", -1, "__error__", "bytes", b"up-2"),  # task_path stays the first insert's
        ("t", "", cid(1), "task2", "", -1, "__error__", "bytes", b"up"),  # a later plain insert does nothing
    ]


@pytest.mark.parametrize(
    ("field", "text", "error"),
    [
        ("checkpoint_json", b'{"a": "\\u0000"}', "u0000"),
        ("metadata_json", b'{"a": "\x00"}', "u0000"),
        ("checkpoint_json", b'{"a": "\xff"}', "not UTF-8"),
        ("metadata_json", b'{"a": "\\\\u0000"}', None),  # an escaped backslash, then "u0000": fine
    ],
)
def test_json_postgres_would_refuse_is_an_invalid_event(field: str, text: bytes, error: str | None) -> None:
    env = to_envelope(dataclasses.replace(put("t", 1), **{field: text}))
    if error is None:
        assert to_checkpoint_event(env).thread_id == "t"
    else:
        with pytest.raises(InvalidEventError, match=error):
            to_checkpoint_event(env)


def test_a_write_idx_beyond_int4_is_an_invalid_event() -> None:
    with pytest.raises(InvalidEventError, match="int4"):
        to_checkpoint_event(to_envelope(writes("t", 1, "task", [("x", b"1")], first_idx=2**31)))


# -- apply ------------------------------------------------------------------------------------------


def mixed_batch() -> list[Item]:
    """A batch touching every statement: duplicates, deletes, copies, runs, prunes.

    A copy or a keep_latest prune reads the state it finds, so re-applying one after later events
    of its thread does not reproduce its effect: here they come after their threads' last put. The
    projector never re-applies an event (the offsets fence it, see test_projector); this test is about
    what can be re-applied, i.e. when a worker dies after Postgres committed but before it knew.
    """
    return [
        *items(
            [
                put("a", 1, inline={"n": 1}, blobs={"msgs": b"m1", "empty": None}, metadata={"run_id": "r1"}),
                writes("a", 1, "t1", [("msgs", b"w1"), ("n", b"w2")]),
                put("a", 2, parent=1, blobs={"msgs": b"m2"}, metadata={"run_id": "r2"}),
                put("a", 2, parent=1, blobs={"msgs": b"m2-dup"}, metadata={"run_id": "r2", "again": True}),
                writes("a", 2, "t2", [("__interrupt__", b"i1")], upsert=True, first_idx=-3),
                writes("a", 2, "t2", [("__interrupt__", b"i2")], upsert=True, first_idx=-3),
                put("b", 1, blobs={"msgs": b"b1"}),
                ThreadDelete("b"),
                put("b", 5, blobs={"msgs": b"b5"}, metadata={"run_id": "r1"}),
                put("a", 3, parent=2, blobs={"msgs": b"m3"}, metadata={"run_id": "r3"}),
                ThreadCopy("a", "c"),
                RunsDelete(("r1",)),
                put("d", 1, blobs={"msgs": b"d1"}),
                put("d", 2, parent=1, blobs={"msgs": b"d2"}),
                ThreadPrune("d", "keep_latest"),
                put("e", 1),
                ThreadPrune("e", "delete"),
            ]
        ),
        *items([put("z", 1, metadata={"run_id": "r1"})], partition=1),
    ]


async def test_applying_a_batch_twice_gives_the_same_rows(conn: asyncpg.Connection) -> None:
    batch = mixed_batch()
    await apply(conn, batch)
    first = await dump(conn, "gl")
    await apply(conn, batch)
    assert await dump(conn, "gl") == first
    assert {r[0] for r in first["checkpoints"]} == {"a", "c", "d", "z"}


async def test_set_based_apply_equals_applying_events_one_by_one(conn: asyncpg.Connection, fresh_database: str) -> None:
    await migrate(fresh_database, "seq")
    batch = mixed_batch()
    await apply(conn, batch)
    for item in batch:
        await apply(conn, [item], schema="seq")
    assert await dump(conn, "gl") == await dump(conn, "seq")


async def test_put_delete_put_in_one_batch_leaves_only_the_last_put(conn: asyncpg.Connection) -> None:
    await apply(
        conn,
        items(
            [
                put("t", 1, blobs={"msgs": b"old"}),
                writes("t", 1, "task", [("msgs", b"w")]),
                ThreadDelete("t"),
                put("t", 2, blobs={"msgs": b"new"}),
            ]
        ),
    )
    rows = await dump(conn, "gl")
    assert [r[2] for r in rows["checkpoints"]] == [cid(2)]
    assert [r[5] for r in rows["checkpoint_blobs"]] == [b"new"]
    assert rows["checkpoint_writes"] == []
    assert rows["graphledger_thread_partitions"] == [("t", TOPIC, 0, None)]  # untimed events: no activity


async def test_copy_thread_copies_every_namespace_and_keeps_the_target_rows(conn: asyncpg.Connection) -> None:
    await apply(
        conn,
        [
            *items([put("target", 9, blobs={"msgs": b"target's own"})], partition=3),
            *items(
                [
                    put("src", 1, blobs={"msgs": b"m1"}),
                    put("src", 2, parent=1, ns="child:x", inline={"k": "v"}, blobs={"msgs": b"c"}),
                    writes("src", 1, "task", [("msgs", b"w")], task_path="p"),
                    ThreadCopy("src", "target"),
                ],
                partition=1,
            ),
        ],
    )
    rows = await dump(conn, "gl")
    for table in ("checkpoints", "checkpoint_blobs", "checkpoint_writes"):
        source = [r[1:] for r in rows[table] if r[0] == "src"]
        target = [r[1:] for r in rows[table] if r[0] == "target"]
        assert source and all(r in target for r in source)
    assert await count(conn, "gl", "checkpoints", "thread_id = 'target'") == 3
    assert ("target", TOPIC, 1, None) in rows["graphledger_thread_partitions"]


async def test_runs_delete_touches_only_the_threads_of_its_partition(conn: asyncpg.Connection) -> None:
    for partition, thread in ((0, "p0"), (1, "p1")):
        await apply(
            conn,
            items(
                [
                    # r1 stores `msgs` and `only_r1`; r2's checkpoint still refers to r1's `msgs`.
                    put(thread, 1, blobs={"msgs": b"shared", "only_r1": b"x"}, metadata={"run_id": "r1"}),
                    writes(thread, 1, "task", [("msgs", b"w")]),
                    put(thread, 2, parent=1, inline={"n": 1}, refs={"msgs": 1}, metadata={"run_id": "r2"}),
                ],
                partition=partition,
            ),
        )
    await apply(conn, items([RunsDelete(("r1", "unknown"))], partition=0, first_offset=10))
    assert await count(conn, "gl", "checkpoints", "thread_id = 'p0'") == 1
    assert await count(conn, "gl", "checkpoint_writes", "thread_id = 'p0'") == 0
    blobs = await conn.fetch("SELECT channel FROM gl.checkpoint_blobs WHERE thread_id = 'p0'")
    assert [b["channel"] for b in blobs] == ["msgs"]  # still referenced by r2's checkpoint
    assert await count(conn, "gl", "checkpoints", "thread_id = 'p1'") == 2
    assert await count(conn, "gl", "checkpoint_writes", "thread_id = 'p1'") == 1
    await apply(conn, items([RunsDelete(("r1",))], partition=1, first_offset=10))
    assert await count(conn, "gl", "checkpoints", "thread_id = 'p1'") == 1


async def test_prune_delete_drops_the_whole_thread(conn: asyncpg.Connection) -> None:
    await apply(conn, items([put("t", 1, blobs={"m": b"1"}), writes("t", 1, "x", [("m", b"w")])]))
    await apply(conn, items([ThreadPrune("t", "delete")], first_offset=2))
    rows = await dump(conn, "gl")
    assert all(rows[t] == [] for t in rows)


# -- prune keep_latest against the official prune, and with a DeltaChannel -------------------------


class PlainState(TypedDict):
    log: Annotated[list[str], operator.add]
    n: int


def _child() -> Any:
    def grow(state: PlainState) -> dict[str, Any]:
        return {"log": [f"child{state['n']}"], "n": state["n"] + 1}

    graph = StateGraph(PlainState)
    graph.add_node(grow)
    graph.add_edge(START, "grow")
    graph.add_edge("grow", END)
    return graph.compile()


def plain_graph() -> StateGraph:
    def step(state: PlainState) -> dict[str, Any]:
        return {"log": [f"step{state['n']}"], "n": state["n"] + 1}

    graph = StateGraph(PlainState)
    graph.add_node(step)
    graph.add_node("child", _child())
    graph.add_edge(START, "step")
    graph.add_edge("step", "child")
    graph.add_edge("child", END)
    return graph


async def _thread_rows(conn: asyncpg.Connection, thread_id: str) -> dict[str, list[tuple[Any, ...]]]:
    rows = await dump(conn, "gl")
    return {t: [r[1:] for r in v if r[0] == thread_id] for t, v in rows.items() if t != "graphledger_thread_partitions"}


async def test_prune_keep_latest_matches_the_official_prune(conn: asyncpg.Connection, fresh_database: str) -> None:
    async with official_saver(fresh_database, "gl") as saver:
        graph = plain_graph().compile(checkpointer=saver)
        config = {"configurable": {"thread_id": "ours"}}
        for i in range(3):
            await graph.ainvoke({"log": [f"in{i}"], "n": i * 10}, config, subgraphs=True)
        await apply(conn, items([ThreadCopy("ours", "theirs")]))
        assert await _thread_rows(conn, "ours") == await _thread_rows(conn, "theirs")
        before = await count(conn, "gl", "checkpoints", "thread_id = 'ours'")

        await saver.aprune(["theirs"], strategy="keep_latest")
        await apply(conn, items([ThreadPrune("ours", "keep_latest")], first_offset=1))

        assert await _thread_rows(conn, "ours") == await _thread_rows(conn, "theirs")
        assert await count(conn, "gl", "checkpoints", "thread_id = 'ours'") < before
        state = await graph.aget_state(config)
        assert state.values["log"][-3:] == ["in2", "step20", "child21"]


def _extend(state: list[str], batches: Sequence[list[str]]) -> list[str]:
    return [*state, *(x for batch in batches for x in batch)]


class DeltaState(TypedDict):
    items: Annotated[list[str], DeltaChannel(_extend, snapshot_frequency=4)]
    n: int


def delta_graph() -> StateGraph:
    def a(state: DeltaState) -> dict[str, Any]:
        return {"items": [f"a{state['n']}"], "n": state["n"] + 1}

    def b(state: DeltaState) -> dict[str, Any]:
        return {"items": [f"b{state['n']}"]}

    graph = StateGraph(DeltaState)
    graph.add_node(a)
    graph.add_node(b)
    graph.add_edge(START, "a")
    graph.add_edge("a", "b")
    graph.add_edge("b", END)
    return graph


@pytest.mark.parametrize("invocations", [3, 4, 5])
async def test_prune_keep_latest_keeps_the_delta_history_of_the_head(
    conn: asyncpg.Connection, fresh_database: str, invocations: int
) -> None:
    thread_id = f"delta-{uuid.uuid4().hex[:6]}"
    config = {"configurable": {"thread_id": thread_id}}
    async with official_saver(fresh_database, "gl") as saver:
        graph = delta_graph().compile(checkpointer=saver)
        for i in range(invocations):
            await graph.ainvoke({"items": [f"in{i}"], "n": i * 10}, config)
        before = await graph.aget_state(config)
        head_meta = before.metadata or {}
        total = await count(conn, "gl", "checkpoints", "thread_id = $1", thread_id)
        with pytest.raises(NotImplementedError):  # what we do better than the official prune
            await saver.aprune([thread_id], strategy="keep_latest")

        await apply(conn, items([ThreadPrune(thread_id, "keep_latest")]))

        after = await graph.aget_state(config)
        assert after.values == before.values
        assert len(after.values["items"]) == 3 * invocations
        kept = await count(conn, "gl", "checkpoints", "thread_id = $1", thread_id)
        assert kept < total
        if "counters_since_delta_snapshot" in head_meta:
            assert kept > 1  # the walk back to the last snapshot was kept
        # Nothing dangles: every kept checkpoint's blobs and its parent (if any) exist.
        dangling = await conn.fetchval(
            """SELECT count(*) FROM gl.checkpoints c
               WHERE c.thread_id = $1 AND c.parent_checkpoint_id IS NOT NULL AND NOT EXISTS (
                   SELECT 1 FROM gl.checkpoints p
                   WHERE p.thread_id = c.thread_id AND p.checkpoint_id = c.parent_checkpoint_id)""",
            thread_id,
        )
        assert dangling == 0
        # The graph goes on from the pruned thread as it would have without the prune.
        await graph.ainvoke({"items": ["more"], "n": 100}, config)
        final = await graph.aget_state(config)
        assert final.values["items"] == [*before.values["items"], "more", "a100", "b101"]


# -- retention: keep-last-N and thread TTL (the sweeper publishes these, docs/retention.md) ------------


@pytest.mark.parametrize("keep", [2, 3, 5])
async def test_prune_keep_n_keeps_exactly_the_newest_n_of_a_plain_thread(conn: asyncpg.Connection, keep: int) -> None:
    thread_id = f"plain-{uuid.uuid4().hex[:6]}"
    chain = [put(thread_id, n, n - 1 if n else None, blobs={"log": f"v{n}".encode()}) for n in range(8)]
    await apply(conn, items(chain))
    await apply(conn, items([ThreadPrune(thread_id, "keep_latest", keep)], first_offset=8))
    rows = await conn.fetch(
        "SELECT checkpoint_id, parent_checkpoint_id FROM gl.checkpoints WHERE thread_id = $1 ORDER BY 1", thread_id
    )
    assert [r["checkpoint_id"] for r in rows] == [cid(n) for n in range(8 - keep, 8)]
    assert rows[0]["parent_checkpoint_id"] is None  # the oldest kept one's parent went
    assert [r["parent_checkpoint_id"] for r in rows[1:]] == [cid(n) for n in range(8 - keep, 7)]
    blobs = await conn.fetch("SELECT blob FROM gl.checkpoint_blobs WHERE thread_id = $1 ORDER BY 1", thread_id)
    assert [b["blob"] for b in blobs] == [f"v{n}".encode() for n in range(8 - keep, 8)]


@pytest.mark.parametrize("keep", [2, 3])
async def test_prune_keep_n_keeps_the_state_of_every_kept_delta_checkpoint(
    conn: asyncpg.Connection, fresh_database: str, keep: int
) -> None:
    thread_id = f"delta-{uuid.uuid4().hex[:6]}"
    config = {"configurable": {"thread_id": thread_id}}
    async with official_saver(fresh_database, "gl") as saver:
        graph = delta_graph().compile(checkpointer=saver)
        for i in range(5):
            await graph.ainvoke({"items": [f"in{i}"], "n": i * 10}, config)
        history = [s async for s in graph.aget_state_history(config)]
        total = len(history)

        await apply(conn, items([ThreadPrune(thread_id, "keep_latest", keep)]))

        after = [s async for s in graph.aget_state_history(config)]
        assert len(after) < total
        # The newest `keep` entries are all there, each with the state it had (DeltaChannel replayed).
        assert [(s.config, s.values, s.next) for s in after[:keep]] == [
            (s.config, s.values, s.next) for s in history[:keep]
        ]
        assert (await graph.aget_state(config)).values == history[0].values
        await graph.ainvoke({"items": ["more"], "n": 100}, config)
        assert (await graph.aget_state(config)).values["items"] == [*history[0].values["items"], "more", "a100", "b101"]


async def test_thread_expire_deletes_only_a_thread_still_idle_at_the_cutoff(conn: asyncpg.Connection) -> None:
    t0 = 1_767_225_600_000
    timed = [
        TimedCheckpointEvent(put("idle", 1), t0),
        TimedCheckpointEvent(put("busy", 1), t0),
        TimedCheckpointEvent(writes("busy", 1, "task", [("c", b"x")]), t0 + 60_000),  # activity after the cutoff
    ]
    await apply(conn, items(timed))  # type: ignore[arg-type]
    active = await conn.fetch("SELECT thread_id, last_active_at FROM gl.graphledger_thread_partitions ORDER BY 1")
    assert [(r["thread_id"], int(r["last_active_at"].timestamp() * 1000)) for r in active] == [
        ("busy", t0 + 60_000),
        ("idle", t0),
    ]
    cutoff = t0 + 30_000
    expiries = [TimedCheckpointEvent(ThreadExpire(t, cutoff), t0 + 90_000) for t in ("idle", "busy")]
    await apply(conn, items(expiries, first_offset=3))  # type: ignore[arg-type]
    assert await count(conn, "gl", "checkpoints", "thread_id = 'idle'") == 0
    assert await count(conn, "gl", "graphledger_thread_partitions", "thread_id = 'idle'") == 0
    assert await count(conn, "gl", "checkpoints", "thread_id = 'busy'") == 1
    # Applying it again (a replay, or a repeat after a slow projector) changes nothing.
    await apply(conn, items(expiries, first_offset=5))  # type: ignore[arg-type]
    assert await count(conn, "gl", "checkpoints", "thread_id = 'busy'") == 1


def test_a_prune_keep_and_a_thread_expire_are_validated() -> None:
    assert ThreadPrune.from_payload({"thread_id": "t", "strategy": "keep_latest"}).keep == 1
    assert ThreadPrune("t", "keep_latest", 4).to_payload()["keep"] == 4
    for bad in (0, -1, True, 1.5, "2"):
        with pytest.raises(InvalidEventError, match="prune keep"):
            ThreadPrune.from_payload({"thread_id": "t", "strategy": "keep_latest", "keep": bad})
    with pytest.raises(InvalidEventError, match="idle_before_ms"):
        ThreadExpire.from_payload({"thread_id": "t", "idle_before_ms": -5})
