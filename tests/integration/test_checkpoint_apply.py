"""The checkpoint projection's set-based apply on real Postgres: merging, operations, copies, prune (plain
and delta) against the official prune, thread expiry. Applying twice, order, isolation and replay are the
projection contract every projection runs (`tests/projection_contract.py`); planning alone is a unit test.
"""

from __future__ import annotations

import operator
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Annotated, Any

import asyncpg
import pytest
from langgraph.channels import DeltaChannel
from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict

from graphledger.events.checkpoint import (
    RunsDelete,
    ThreadCopy,
    ThreadCopyBarrier,
    ThreadDelete,
    ThreadExpire,
    ThreadPrune,
)
from graphledger.events.erasure import TenantErase, ThreadErase
from graphledger.opening.checkpoint_events import TimedCheckpointEvent
from graphledger.opening.records import DeadLetter
from graphledger_server.projection import checkpoints
from graphledger_server.projection.batch import BatchApplier
from graphledger_server.projection.checkpoints import CheckpointProjection
from graphledger_server.projection.migrate import migrate
from projection_helpers import TOPIC, Item, cid, count, dump, items, official_saver, put, record, writes


@pytest.fixture
async def conn(fresh_database: str) -> AsyncIterator[asyncpg.Connection]:
    await migrate(fresh_database, "gl")
    connection = await asyncpg.connect(fresh_database)
    yield connection
    await connection.close()


async def apply(conn: asyncpg.Connection, batch: Sequence[Item], schema: str = "gl") -> None:
    async with conn.transaction():
        await CheckpointProjection(schema).apply(conn, batch)


# -- apply ------------------------------------------------------------------------------------------


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
            *items([ThreadCopyBarrier("target", 1, 3)], partition=3, first_offset=1),
        ],
    )
    rows = await dump(conn, "gl")
    for table in ("checkpoints", "checkpoint_blobs", "checkpoint_writes"):
        source = [r[1:] for r in rows[table] if r[0] == "src"]
        target = [r[1:] for r in rows[table] if r[0] == "target"]
        assert source and all(r in target for r in source)
    assert await count(conn, "gl", "checkpoints", "thread_id = 'target'") == 3
    # Each thread stays on the partition of its own records; the copy travelled on the source's.
    assert [r[:3] for r in rows["graphledger_thread_partitions"]] == [("src", TOPIC, 1), ("target", TOPIC, 3)]


async def test_runs_of_many_rows_go_by_copy_and_leave_what_arrays_leave(
    conn: asyncpg.Connection, fresh_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From `STAGED_FROM_ROWS` rows a table's rows are copied into a batch table and moved from it: the same
    merge as the arrays (a repeated put's new metadata, a blob's first value, a write's insert and upsert),
    each run of a batch with its own rows, and nothing staged left after the commit."""
    n = checkpoints.STAGED_FROM_ROWS + 10

    def run(first: int, label: str) -> list[Any]:
        return [
            event
            for i in range(first, first + n)
            for event in (
                put(f"t{i % 7}", i, blobs={"msgs": f"{label}{i}".encode()}, metadata={"label": label}),
                writes(f"t{i % 7}", i, "task", [("msgs", f"{label}{i}".encode())]),
                writes(f"t{i % 7}", i, "task", [("__error__", label.encode())], upsert=True, first_idx=-1),
            )
        ]

    # Two runs in one batch (a delete between them), then a batch repeating half of the first run's keys.
    first = items([*run(0, "a"), ThreadDelete("t0"), *run(n, "b")])
    again = items(run(n // 2, "c"), first_offset=len(first))
    await migrate(fresh_database, "arrays")
    for batch in (first, again):
        await apply(conn, batch)
    staged = await conn.fetchval("SELECT count(*) FROM graphledger_batch_checkpoints")
    with monkeypatch.context() as patched:
        patched.setattr(checkpoints, "STAGED_FROM_ROWS", 10**9)
        for batch in (first, again):
            await apply(conn, batch, "arrays")
    copied, arrays = await dump(conn, "gl"), await dump(conn, "arrays")
    assert staged == 0
    assert len(copied["checkpoints"]) > 2 * checkpoints.STAGED_FROM_ROWS
    assert {r[7] for r in copied["checkpoint_writes"] if r[4] == -1} == {b"a", b"b", b"c"}  # idx -1: upserts
    assert copied == arrays


async def _partition_of(conn: asyncpg.Connection, thread_id: str) -> int | None:
    return await conn.fetchval("SELECT partition FROM gl.graphledger_thread_partitions WHERE thread_id = $1", thread_id)


async def test_delete_for_runs_reaches_a_copy_target_on_its_own_partition_before_its_next_write(
    conn: asyncpg.Connection,
) -> None:
    """A read of a thread waits for the thread's own partition: `delete_for_runs` acknowledged after a
    `copy_thread` must apply to the target there, among the target's records, not at the source's
    partition (which the read does not wait for, and whose copy may apply before or after)."""
    dead: list[DeadLetter] = []

    async def sink(letters: Sequence[DeadLetter]) -> None:
        dead.extend(letters)

    applier = BatchApplier("gl", "g", {TOPIC: CheckpointProjection("gl")}, sink)
    # The target's own run on partition 1, the source's on partition 0; then the copy, on the source's.
    await applier.apply(conn, [record(put("target", 1, metadata={"run_id": "old"}), 1, 0)])
    await applier.apply(
        conn, [record(put("src", 5, metadata={"run_id": "copied"}), 0, 0), record(ThreadCopy("src", "target"), 0, 1)]
    )
    assert await _partition_of(conn, "target") == 1
    # The copy's barrier on the target's partition, then partition 1's copy of delete_for_runs.
    deleted = RunsDelete(("old", "copied"))
    result = await applier.apply(conn, [record(ThreadCopyBarrier("target", 0, 1), 1, 1), record(deleted, 1, 2)])
    assert (result.paused, dead) == ({}, [])
    assert await count(conn, "gl", "checkpoints", "thread_id = 'target'") == 0
    assert await count(conn, "gl", "checkpoints", "thread_id = 'src'") == 1  # partition 0's copy has not applied
    await applier.apply(conn, [record(deleted, 0, 2)])
    assert await count(conn, "gl", "checkpoints", "thread_id = 'src'") == 0
    assert (await _partition_of(conn, "target"), await _partition_of(conn, "src")) == (1, 0)


async def test_a_copy_target_is_recorded_on_its_own_partition_at_the_barrier_and_nowhere_before(
    conn: asyncpg.Connection,
) -> None:
    """The copy's record stages the source's rows and leaves the target alone: nothing of the target sits
    on the source's partition, so nothing there (a `runs.delete`) can reach it."""

    async def sink(letters: Sequence[DeadLetter]) -> None:
        raise AssertionError(letters)

    applier = BatchApplier("gl", "g", {TOPIC: CheckpointProjection("gl")}, sink)
    await applier.apply(conn, [record(put("src", 1), 0, 0), record(ThreadCopy("src", "fresh"), 0, 1)])
    assert await _partition_of(conn, "fresh") is None
    assert await count(conn, "gl", "checkpoints", "thread_id = 'fresh'") == 0
    assert await count(conn, "gl", "graphledger_staged_checkpoints", 'partition = 0 AND "offset" = 1') == 1
    await applier.apply(conn, [record(ThreadCopyBarrier("fresh", 0, 1), 2, 0)])
    assert await _partition_of(conn, "fresh") == 2
    assert await count(conn, "gl", "checkpoints", "thread_id = 'fresh'") == 1
    assert await count(conn, "gl", "graphledger_copy_stages") == 0  # the barrier took the stage
    assert await count(conn, "gl", "graphledger_staged_checkpoints") == 0
    await applier.apply(conn, [record(RunsDelete(("nothing",)), 0, 2)])
    assert await _partition_of(conn, "fresh") == 2


# -- copies: staged at the copy's record, applied at its barrier ---------------------------------------


def _applier() -> BatchApplier:
    async def sink(letters: Sequence[DeadLetter]) -> None:
        raise AssertionError(letters)

    return BatchApplier("gl", "g", {TOPIC: CheckpointProjection("gl")}, sink)


async def _ids(conn: asyncpg.Connection, thread_id: str) -> list[str]:
    rows = await conn.fetch("SELECT checkpoint_id FROM gl.checkpoints WHERE thread_id = $1 ORDER BY 1", thread_id)
    return [r["checkpoint_id"] for r in rows]


@pytest.mark.parametrize("source_first", [True, False], ids=["source-first", "target-first"])
@pytest.mark.parametrize(
    ("earlier", "expected"),
    [
        (ThreadDelete("t"), [1, 2, 10]),
        (ThreadPrune("t", "keep_latest"), [1, 2, 8, 10]),
        (ThreadPrune("t", "delete"), [1, 2, 10]),
    ],
    ids=["delete", "prune-keep-latest", "prune-delete"],
)
async def test_a_copy_follows_the_targets_records_before_its_barrier_in_either_apply_order(
    conn: asyncpg.Connection, earlier: Any, expected: list[int], source_first: bool
) -> None:
    """The target's delete or prune acknowledged before the copy began precedes the copy's barrier on the
    target's partition: it applies before the copy, whether the projector reaches the source's partition
    (the copy's record) or the target's first."""
    source = [
        record(put("s", 1, blobs={"m": b"1"}), 0, 0),
        record(put("s", 2, parent=1, blobs={"m": b"2"}), 0, 1),
        record(ThreadCopy("s", "t"), 0, 2),
        record(put("s", 3, parent=2), 0, 3),  # after the copy: not copied
    ]
    target = [
        record(put("t", 7, blobs={"m": b"7"}), 1, 0),
        record(put("t", 8, parent=7, blobs={"m": b"8"}), 1, 1),
        record(earlier, 1, 2),
        record(ThreadCopyBarrier("t", 0, 2), 1, 3),
        record(put("t", 10, parent=8), 1, 4),
    ]
    applier = _applier()
    if source_first:
        await applier.apply(conn, source)
        assert await _ids(conn, "t") == []  # the copy is staged, not applied
        assert (await applier.apply(conn, target)).paused == {}
    else:
        result = await applier.apply(conn, target)
        assert result.paused == {(TOPIC, 1): 3}  # at the barrier, after the earlier record
        await applier.apply(conn, source)
        assert (await applier.apply(conn, target[3:])).paused == {}
    assert await _ids(conn, "t") == [cid(n) for n in expected]
    assert await _ids(conn, "s") == [cid(1), cid(2), cid(3)]
    assert await count(conn, "gl", "graphledger_copy_stages") == 0


async def test_a_copy_copies_its_source_as_of_the_copys_record(conn: asyncpg.Connection) -> None:
    """The source's records after the copy's change the source, not the stage, even when they apply
    before the barrier."""
    applier = _applier()
    await applier.apply(
        conn,
        [
            record(put("s", 1, blobs={"m": b"1"}), 0, 0),
            record(writes("s", 1, "task", [("m", b"w")]), 0, 1),
            record(ThreadCopy("s", "t"), 0, 2),
            record(ThreadDelete("s"), 0, 3),
            record(put("s", 5), 0, 4),
        ],
    )
    await applier.apply(conn, [record(ThreadCopyBarrier("t", 0, 2), 1, 0)])
    rows = await dump(conn, "gl")
    assert await _ids(conn, "t") == [cid(1)]
    assert [r[5] for r in rows["checkpoint_blobs"] if r[0] == "t"] == [b"1"]
    assert [r[7] for r in rows["checkpoint_writes"] if r[0] == "t"] == [b"w"]
    assert await _ids(conn, "s") == [cid(5)]


async def test_a_copy_records_its_lineage_at_its_record_when_its_source_has_rows(conn: asyncpg.Connection) -> None:
    """An erasure of the source that follows the copy in the source's log finds the copy (to erase it
    too) before its barrier has applied; a copy of nothing, or onto its source, records none."""
    await apply(
        conn,
        items(
            [
                put("s", 1),
                ThreadCopy("s", "t"),
                ThreadCopy("nothing", "t2"),
                ThreadCopy("s", "s"),
            ]
        ),
    )
    copies = await conn.fetch("SELECT source_thread_id, target_thread_id FROM gl.graphledger_thread_copies")
    assert [tuple(r) for r in copies] == [("s", "t")]
    stages = await conn.fetch('SELECT "offset", source_thread_id, target_thread_id FROM gl.graphledger_copy_stages')
    assert sorted(tuple(r) for r in stages) == [(1, "s", "t"), (2, "nothing", "t2"), (3, "s", "s")]
    staged = await conn.fetch('SELECT "offset" FROM gl.graphledger_staged_checkpoints')
    assert [r["offset"] for r in staged] == [1]  # a copy onto its source stages nothing
    assert await _partition_of(conn, "t") is None
    await apply(conn, items([ThreadDelete("s"), ThreadCopyBarrier("s", 0, 3)], first_offset=4))
    assert await _ids(conn, "s") == []  # a copy onto itself changes nothing, even after a delete


async def test_a_barrier_takes_only_the_stage_of_its_own_target(conn: asyncpg.Connection) -> None:
    """A barrier naming another thread's copy (a hostile or broken writer) moves nothing: the stage waits
    for its own target's barrier."""
    await apply(conn, items([put("s", 1), ThreadCopy("s", "t")]))
    await apply(conn, items([ThreadCopyBarrier("x", 0, 1), ThreadCopyBarrier("t", 0, 0)], partition=1))
    assert (await _ids(conn, "x"), await _ids(conn, "t")) == ([], [])
    assert await count(conn, "gl", "graphledger_copy_stages") == 1
    await apply(conn, items([ThreadCopyBarrier("t", 0, 1)], partition=1, first_offset=2))
    assert await _ids(conn, "t") == [cid(1)]
    await apply(conn, items([ThreadCopyBarrier("t", 0, 1)], partition=1, first_offset=3))  # a duplicate
    assert await _ids(conn, "t") == [cid(1)]


async def test_a_copy_dates_its_target_at_the_barrier_by_the_copys_time_and_the_barriers(
    conn: asyncpg.Connection,
) -> None:
    t0 = 1_767_225_600_000
    await apply(
        conn,
        [
            (TOPIC, 0, 0, TimedCheckpointEvent(put("s", 1), t0)),
            (TOPIC, 0, 1, TimedCheckpointEvent(ThreadCopy("s", "t"), t0 + 5_000)),
            (TOPIC, 0, 2, TimedCheckpointEvent(ThreadCopy("s", "u"), t0 + 6_000)),
        ],
    )
    assert await _partition_of(conn, "t") is None  # nothing of the target before its barrier
    await apply(
        conn,
        [
            # the barrier's broker clock runs behind the copy's: the copy's time counts
            (TOPIC, 1, 0, TimedCheckpointEvent(ThreadCopyBarrier("t", 0, 1), t0 + 4_000)),
            (TOPIC, 2, 0, TimedCheckpointEvent(ThreadCopyBarrier("u", 0, 2), t0 + 7_000)),
        ],
    )
    active = await conn.fetch("SELECT thread_id, partition, last_active_at FROM gl.graphledger_thread_partitions")
    assert sorted((r[0], r[1], int(r[2].timestamp() * 1000)) for r in active) == [
        ("s", 0, t0),  # a copy does not date its source
        ("t", 1, t0 + 5_000),
        ("u", 2, t0 + 7_000),
    ]


SOURCE_REF, TARGET_REF = "0a" * 16, "0b" * 16


async def _subjects(conn: asyncpg.Connection, *names: tuple[str, str, str]) -> None:
    """Record subjects as the projector does when it opens their sealed events: (ref, tenant, name)."""
    for ref, tenant, name in names:
        await conn.execute(
            "INSERT INTO gl.graphledger_subjects (ref, kind, tenant, name) VALUES ($1, 'thread', $2, $3)",
            ref, tenant, name,
        )  # fmt: skip


@pytest.mark.parametrize("barrier_first", [True, False], ids=["barrier-first", "erasure-first"])
async def test_a_copy_lands_the_same_whether_its_sources_erasure_applies_before_its_barrier_or_after(
    conn: asyncpg.Connection, barrier_first: bool
) -> None:
    """The source's erasure, on the source's partition after the copy, races the barrier on the target's.
    Either way the target gets the copy and the lineage names it, so the eraser erases it next (and,
    through its lineage, what was copied on from it: the copy of a copy is no emptier for the race)."""
    await _subjects(conn, (SOURCE_REF, "", "s"), (TARGET_REF, "", "t"))
    await apply(conn, items([put("s", 1, blobs={"m": b"1"}), writes("s", 1, "x", [("m", b"w")])]))
    await apply(conn, [(TOPIC, 0, 2, TimedCheckpointEvent(ThreadCopy("s", "t"), 5_000))])
    erase, barrier = items([ThreadErase(SOURCE_REF)], first_offset=3), items([ThreadCopyBarrier("t", 0, 2)], 1)
    for batch in (barrier, erase) if barrier_first else (erase, barrier):
        await apply(conn, batch)
    assert await _ids(conn, "t") == [cid(1)]
    assert await count(conn, "gl", "graphledger_thread_copies", "source_thread_id = 's' AND target_thread_id = 't'")
    await apply(conn, items([ThreadCopy("t", "u")], partition=1, first_offset=1))
    assert await count(conn, "gl", "graphledger_thread_copies", "source_thread_id = 't' AND target_thread_id = 'u'")
    # The eraser erases the copy, which drops what is still staged for it too.
    await apply(conn, items([ThreadErase(TARGET_REF)], partition=1, first_offset=2))
    assert await _ids(conn, "t") == []
    assert await count(conn, "gl", "graphledger_copy_stages", "target_thread_id = 't'") == 0


async def _lineage(conn: asyncpg.Connection) -> list[tuple[str, str]]:
    rows = await conn.fetch("SELECT source_thread_id, target_thread_id FROM gl.graphledger_thread_copies ORDER BY 1, 2")
    return [(r[0], r[1]) for r in rows]


async def test_erasing_a_copy_passes_its_copies_on_to_its_source(conn: asyncpg.Connection) -> None:
    """s -> t -> u: once t's erasure applied (an eraser of s that failed right after, with
    erasure_incomplete, erased t but not u), s's lineage names u, so the erase of s asked again erases
    u. Once u is erased too, no lineage is left."""
    copy_ref = "0c" * 16
    await _subjects(conn, (SOURCE_REF, "", "s"), (TARGET_REF, "", "t"), (copy_ref, "", "u"))
    await apply(conn, items([put("s", 1), ThreadCopy("s", "t"), ThreadCopy("s", "s")]))
    await apply(conn, items([ThreadCopyBarrier("t", 0, 1), ThreadCopy("t", "u"), ThreadCopy("t", "s")], 1))
    await apply(conn, items([ThreadCopyBarrier("u", 1, 1)], 2))
    assert await _lineage(conn) == [("s", "t"), ("t", "s"), ("t", "u")]
    await apply(conn, items([ThreadErase(SOURCE_REF)], first_offset=2))
    assert await _lineage(conn) == [("s", "t"), ("t", "u")]  # s's lineage as a copy went, as a source stays
    await apply(conn, items([ThreadErase(TARGET_REF)], partition=1, first_offset=3))
    assert await _lineage(conn) == [("s", "u"), ("t", "u")]
    assert await _ids(conn, "u") == [cid(1)]  # the copy of the copy, still to be erased
    await apply(conn, items([ThreadErase(copy_ref)], partition=2, first_offset=1))
    assert (await _lineage(conn), await _ids(conn, "u")) == ([], [])


async def test_erasing_the_target_drops_its_stages(conn: asyncpg.Connection) -> None:
    await _subjects(conn, (TARGET_REF, "", "t"))
    await apply(conn, items([put("s", 1), ThreadCopy("s", "t"), ThreadCopy("s", "other")]))
    await apply(conn, items([ThreadErase(TARGET_REF)], partition=1))
    stages = await conn.fetch('SELECT "offset" FROM gl.graphledger_staged_checkpoints')
    assert [r["offset"] for r in stages] == [2]  # the other target's stage
    assert await count(conn, "gl", "graphledger_copy_stages") == 1
    assert await _ids(conn, "s") == [cid(1)]


async def test_erasing_a_tenant_drops_its_stages(conn: asyncpg.Connection) -> None:
    await apply(
        conn,
        items([put("acme/s", 1), ThreadCopy("acme/s", "acme/t"), put("other/s", 1), ThreadCopy("other/s", "other/t")]),
    )
    await apply(conn, items([TenantErase("acme")], partition=1))
    stages = await conn.fetch("SELECT source_thread_id FROM gl.graphledger_copy_stages")
    assert [r[0] for r in stages] == ["other/s"]
    staged = await conn.fetch('SELECT "offset" FROM gl.graphledger_staged_checkpoints')
    assert [r["offset"] for r in staged] == [3]


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
        await apply(conn, items([ThreadCopy("ours", "theirs"), ThreadCopyBarrier("theirs", 0, 0)]))
        assert await _thread_rows(conn, "ours") == await _thread_rows(conn, "theirs")
        before = await count(conn, "gl", "checkpoints", "thread_id = 'ours'")

        await saver.aprune(["theirs"], strategy="keep_latest")
        await apply(conn, items([ThreadPrune("ours", "keep_latest")], first_offset=2))

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
