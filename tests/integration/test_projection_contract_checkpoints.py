"""The projection contract (`projection_contract.py`) run against `CheckpointProjection`, and
`graphledger.folds.thread`, which the read API lays over it, checked against its SQL for every checkpoint event
type (`TestCheckpointFold`).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from typing import Any

import asyncpg
import pytest

import projection_helpers as checkpoints
from graphledger.answers import Basis
from graphledger.erasure.sealing import SealedSubject
from graphledger.events import envelope
from graphledger.events.checkpoint import (
    CheckpointPut,
    RunsDelete,
    ThreadCopy,
    ThreadCopyBarrier,
    ThreadDelete,
    ThreadExpire,
    ThreadPrune,
)
from graphledger.events.erasure import TenantErase, ThreadErase
from graphledger.folds import thread
from graphledger.log.records import LogRecord
from graphledger_server.api.consistency.read_through import thread_events
from graphledger_server.api.reads.checkpoint_sql import (
    BLOB_CEILINGS_SQL,
    EARLY_WRITES_SQL,
    THREAD_BASIS_SQL,
    THREAD_NAMESPACES_SQL,
)
from graphledger_server.api.reads.saver import PassThroughSerde, TenantSaver, wire_tuple
from graphledger_server.api.tenant import Tenant
from graphledger_server.projection import erasure
from graphledger_server.projection.batch import TopicProjection
from graphledger_server.projection.checkpoints import CheckpointProjection
from graphledger_server.projection.migrate import migrate
from graphledger_server.replay.checksums import compare
from projection_contract import Fetches, ProjectionContract, Rows, drain


def copied_ids(rows: Rows) -> dict[str, list[int]]:
    """Each thread's checkpoint ids, as the `n` of `cid(n)`."""
    ids: dict[str, list[int]] = {}
    for row in rows["checkpoints"]:
        ids.setdefault(row[0], []).append(int(row[2].rsplit("-", 1)[1]))
    return ids


class TestCheckpointProjection(ProjectionContract):
    TOPIC = checkpoints.TOPIC
    LOGS = ("mixed", "copies", "one_writer")

    async def migrate(self, dsn: str, schema: str) -> None:
        await migrate(dsn, schema)

    def projection(self, schema: str) -> TopicProjection:
        return CheckpointProjection(schema)

    def records(self, events: Sequence[Any]) -> list[LogRecord]:
        return [checkpoints.record(e, 0, offset) for offset, e in enumerate(events)]

    def log(self, name: str) -> list[LogRecord]:
        logs = {"copies": checkpoints.copies_log, "one_writer": checkpoints.one_writer_log}
        logged = logs.get(name, checkpoints.mixed_batch)()
        return [checkpoints.record(e, partition, offset) for _, partition, offset, e in logged]

    def redeliverable(self, name: str) -> list[LogRecord]:
        """Of the copies: the puts and deletes (a copy stages its source as it finds it, later puts included).
        Of the one-writer log: the protected writes of thread `w` up to its zombie's (a verdict is of the
        ledger it finds, and these find their own lead again)."""
        if name == "one_writer":
            return self.log(name)[:4]
        if name != "copies":
            return self.log(name)
        return [r for r in self.log(name) if dict(r.headers)["gl-type"] in (b"checkpoint.put", b"thread.delete")]

    async def redelivered_rows(self, conn: asyncpg.Connection, schema: str) -> Rows:
        """The threads' rows: the rule's operation counts and refusals are exactly-once by the offset rows."""
        return await checkpoints.dump(conn, schema)

    def check_outcome(self, name: str, rows: Rows) -> None:
        if name == "copies":
            assert copied_ids(rows) == checkpoints.COPIES_LOG_IDS
            assert rows["graphledger_copy_stages"] == []  # every barrier took its stage
        elif name == "one_writer":
            assert {t: sorted(ids) for t, ids in copied_ids(rows).items()} == checkpoints.ONE_WRITER_LOG_IDS
            refused = Counter(r[3] for r in rows["graphledger_refusals"])
            assert refused == checkpoints.ONE_WRITER_LOG_REFUSED
            early = [r[7] for r in rows["checkpoint_writes"] if r[0] == "w"]
            assert b"early" in early and b"gone" not in early and b"z1" not in early
        else:
            assert {r[0] for r in rows["checkpoints"]} == {"a", "c", "d", "z"}

    def one_key(self) -> list[Any]:
        put, writes = checkpoints.put, checkpoints.writes
        return [
            put("t", 1, blobs={"msgs": b"1"}),
            put("t", 2, parent=1, blobs={"msgs": b"2"}),
            writes("t", 2, "task", [("msgs", b"w")]),
            ThreadPrune("t", "keep_latest"),
            put("t", 3, parent=2, blobs={"msgs": b"3"}),
        ]

    async def key_state(self, conn: asyncpg.Connection, schema: str) -> Any:
        rows = await checkpoints.dump(conn, schema)
        return [r[2] for r in rows["checkpoints"]], [r[5] for r in rows["checkpoint_blobs"]]

    def expected_key_state(self) -> Any:
        return [checkpoints.cid(2), checkpoints.cid(3)], [b"2", b"3"]

    def two_keys(self) -> tuple[list[Any], list[Any], tuple[Any, ...]]:
        put, writes = checkpoints.put, checkpoints.writes
        mine = [
            put("t", 1, blobs={"m": b"t1"}),
            writes("t", 1, "task", [("m", b"tw")]),
            put("t", 2, parent=1, ns="child:x", blobs={"m": b"t2"}),
        ]
        theirs = [
            put("tt", 1, blobs={"m": b"tt1"}),
            writes("tt", 1, "task", [("m", b"ttw")]),
            put("tt", 2, parent=1, blobs={"m": b"tt2"}),
            ThreadCopy("tt", "t-copy"),
            ThreadPrune("tt", "keep_latest"),
            ThreadDelete("tt"),
            put("tt", 3, blobs={"m": b"tt3"}),
            ThreadPrune("tt", "delete"),
        ]
        return mine, theirs, ("t",)

    async def rows(self, conn: asyncpg.Connection, schema: str) -> Rows:
        return {**await checkpoints.dump(conn, schema), **await checkpoints.rule_dump(conn, schema)}

    async def test_a_copy_lands_among_its_targets_records_whichever_partition_applies_first(
        self, fresh_database: str, conn: asyncpg.Connection
    ) -> None:
        """A projector reaching the copies' source partition first (the live one, usually: the copy is
        acknowledged before its barrier is sent), or their targets' partitions first (a replay's lanes, a
        lagging worker), leaves what the log order of each target's partition says."""
        log, dead = self.log("copies"), []
        orders = [(0, 1, 2), (1, 2, 0), (2, 0, 1)]
        for order in orders:
            fetched = Fetches(await self.applier(fresh_database, conn, f"order_{''.join(map(str, order))}", dead), conn)
            for partition in order:
                await fetched.apply([r for r in log if r.partition == partition])
            await drain(fetched)
        assert dead == []
        first, *others = [f"order_{''.join(map(str, order))}" for order in orders]
        rows = await self.rows(conn, first)
        self.check_outcome("copies", rows)
        for schema in others:
            assert await self.rows(conn, schema) == rows
            checks = await compare(conn, first, schema)  # lineage and activity times too
            assert all(check.equal for check in checks), [check.describe() for check in checks]


# -- the fold equals the SQL --------------------------------------------------------------------------
#
# The read API answers a read at the log's end from the projection's answer at its applied offset and
# the key's records since, folded in Python (`graphledger.folds.thread`, `graphledger.folds.store_item`). For each
# event type, a scenario is applied record by record with the projection's SQL; from every point of it,
# the answers the projection gives there, with the rest of the scenario folded on, must be the answers
# the projection gives after applying all of it, or the fold must say it cannot (`Underivable`: the
# read then waits for the projection), and that only for the events docs/architecture.md lists.

FOLD_REF = "reft"
"""The reference of thread `t` as a sealed event of it would have recorded it (for `thread.erase`)."""


def _scenarios() -> dict[str, list[Any]]:
    put, writes = checkpoints.put, checkpoints.writes
    chain = [
        put("t", 1, inline={"n": 1}, blobs={"msgs": b"m1", "empty": None}, metadata={"run_id": "r1"}),
        writes("t", 1, "task-a", [("msgs", b"w1")]),
        put("t", 2, parent=1, blobs={"msgs": b"m2"}, refs={"empty": 1}, metadata={"run_id": "r2"}),
    ]
    return {
        "checkpoint.put": [
            *chain,
            put("t", 2, parent=1, blobs={"msgs": b"m2-again"}, refs={"empty": 1}, metadata={"again": True}),
            put("t", 3, parent=2, inline={"n": 3}, refs={"msgs": 2, "empty": 1}),
            put("t", 4, parent=3, ns="child:x", blobs={"sub": b"s4"}),
            # A put again of an older checkpoint: its row changes, the newest does not.
            put("t", 1, inline={"n": 1}, blobs={"msgs": b"m1", "empty": None}, metadata={"run_id": "r1", "x": 1}),
        ],
        # A put again of an older checkpoint with a blob at a version no checkpoint of the chain has yet;
        # a later put names that version without a blob of its own: the projection's blob row answers.
        "checkpoint.put (a version first stored by a put of an older checkpoint)": [
            *chain,
            put("t", 1, inline={"n": 1}, blobs={"msgs": b"m9"}, ver=9, refs={"empty": 1}),
            put("t", 3, parent=2, refs={"msgs": 9, "empty": 1}),
            writes("t", 3, "task-a", [("msgs", b"w3")]),
        ],
        # A put storing a value at a version an earlier put stored a row at, which the newest does not name:
        # the earlier row stays (a row is never replaced), and the fold does not hold it.
        "checkpoint.put (a value stored again at a version an earlier put stored)": [
            *chain,
            put("t", 3, parent=2, blobs={"msgs": b"m1-again"}, ver=1, refs={"empty": 1}),
            writes("t", 3, "task-a", [("msgs", b"w3")]),
        ],
        # A put calling a channel new without a value for it (the client stores no row, the official saver an
        # "empty" one that does not replace a row): at a version an earlier put stored a value at, that value
        # is the put's.
        "checkpoint.put (no value stored at a version an earlier put stored a value at)": [
            *chain,
            dataclasses.replace(put("t", 3, parent=1, refs={"msgs": 1, "empty": 1}), new_channels=("msgs",)),
            writes("t", 3, "task-a", [("msgs", b"w3")]),
        ],
        # A put naming a version it does not call new, holding a value inline: above every blob row of the
        # channel, the inline value answers; at a version another put stored a row at, the row does.
        "checkpoint.put (an inline value at a version the put does not call new)": [
            *chain,
            _not_new(put("t", 3, parent=2, inline={"n": 3}, refs={"msgs": 2, "empty": 1})),
        ],
        "checkpoint.put (an inline value at a version another put stored a row at)": [
            *chain,
            put("t", 1, inline={"n": 1}, blobs={"msgs": b"m9"}, ver=9, refs={"empty": 1}),
            _not_new(put("t", 3, parent=2, inline={"msgs": "inline"}, ver=9, refs={"empty": 1})),
            writes("t", 3, "task-a", [("msgs", b"w3")]),
        ],
        # Written before puts recorded their new channels: a version newer than the parent's is the put's own.
        "checkpoint.put (events before their new channels were recorded)": [
            put("t", 1, inline={"n": 1}, blobs={"msgs": b"m1", "empty": None}, legacy=True),
            put("t", 2, parent=1, blobs={"msgs": b"m2"}, refs={"empty": 1}, legacy=True),
            put("t", 3, parent=2, inline={"n": 3}, refs={"msgs": 2, "empty": 1}, legacy=True),
        ],
        "checkpoint.writes": [
            *chain,
            writes("t", 2, "task-b", [("msgs", b"w2"), ("n", b"w3")], task_path="~b"),
            writes("t", 2, "task-b", [("msgs", b"never")], task_path="~b"),  # a regular write never replaces
            writes("t", 2, "task-c", [("__error__", b"e1")], upsert=True, first_idx=-1),
            writes("t", 2, "task-c", [("__error__", b"e2")], upsert=True, first_idx=-1, task_path="~c"),
            writes("t", 1, "task-z", [("msgs", b"late")]),  # a late write of the parent
        ],
        "thread.delete": [*chain, ThreadDelete("t"), put("t", 5, blobs={"msgs": b"m5"})],
        "thread.prune (delete)": [*chain, ThreadPrune("t", "delete"), put("t", 5, blobs={"msgs": b"m5"})],
        "thread.prune (keep_latest)": [*chain, ThreadPrune("t", "keep_latest"), writes("t", 2, "x", [("msgs", b"w")])],
        "thread.copy": [*chain, ThreadCopy("t", "t-copy"), writes("t", 2, "task-b", [("msgs", b"w2")])],
        "thread.copy.barrier": [
            put("s", 1, blobs={"msgs": b"s1"}),
            ThreadCopy("s", "t"),
            ThreadCopyBarrier("t", 0, 1),
            put("t", 2, parent=1, blobs={"msgs": b"t2"}),
        ],
        "thread.expire": [*chain, ThreadExpire("t", 2**40), writes("t", 2, "x", [("n", b"1")])],
        "runs.delete": [*chain, RunsDelete(("r1",)), RunsDelete(("r-other",)), writes("t", 2, "x", [("n", b"1")])],
        "runs.delete (the newest's run)": [*chain, RunsDelete(("r2",)), writes("t", 1, "x", [("n", b"1")])],
        # The projection matches the text of `metadata ->> 'run_id'`: a run id of another JSON type too.
        "runs.delete (run ids that are not strings)": [
            put("t", 1, blobs={"msgs": b"m1"}, metadata={"run_id": 7}),
            put("t", 2, parent=1, blobs={"msgs": b"m2"}, metadata={"run_id": True}),
            put("t", 3, parent=2, blobs={"msgs": b"m3"}, metadata={"run_id": 1.5}),
            put("t", 4, parent=3, blobs={"msgs": b"m4"}, metadata={"run_id": "r4"}),
            RunsDelete(("7", "true", "1.5")),
        ],
        # After an erasure the thread's records are sealed under its destroyed key: none applies.
        "thread.erase": [*chain, ThreadErase(FOLD_REF)],
        **_one_writer_scenarios(),
        "tenant.erase": [*chain, TenantErase("other"), writes("t", 2, "x", [("n", b"1")]), TenantErase("t")],
    }


def _one_writer_scenarios() -> dict[str, list[Any]]:
    """Every branch of the one-writer rule (`graphledger.ownership`): protected writes whose verdicts the fold
    takes from the basis the read API answered with and the records since."""
    put, writes, p = checkpoints.put, checkpoints.writes, checkpoints.protected
    return {
        "one writer (a retry, a superseded writer, writes before their put, two writers against one head)": [
            p(put("t", 1, blobs={"msgs": b"m1"}), None),
            p(writes("t", 1, "a", [("msgs", b"a1")]), 1),
            p(put("t", 2, parent=1, blobs={"msgs": b"m2"}), 1),
            p(put("t", 2, parent=1, blobs={"msgs": b"m2"}), 1),
            p(put("t", 3, parent=1, blobs={"msgs": b"zombie"}), 1),
            p(writes("t", 1, "z", [("msgs", b"z1")]), 1),
            p(writes("t", 4, "a", [("msgs", b"early")]), 2),
            p(put("t", 4, parent=2, blobs={"msgs": b"m4"}), 2),
            p(writes("t", 5, "b", [("msgs", b"gone")]), 2),
            p(put("t", 5, parent=2, blobs={"msgs": b"m5"}), 2),
            p(put("t", 6, parent=4, blobs={"msgs": b"m6"}), 4),
            p(put("t", 7, parent=4, blobs={"msgs": b"m7"}), 4),
            p(writes("t", 6, "c", [("msgs", b"c6")]), 6),
        ],
        "one writer (a delete and a put without an intent refuse the writers that read before them)": [
            p(put("t", 1, blobs={"msgs": b"m1"}), None),
            ThreadDelete("t"),
            p(put("t", 2, parent=1, blobs={"msgs": b"m2"}), 1),
            p(put("t", 3, blobs={"msgs": b"m3"}), None, 1),
            put("t", 4, parent=3, blobs={"msgs": b"m4"}),
            p(writes("t", 3, "late", [("msgs", b"late")]), 3, 1),
            p(put("t", 5, parent=4, blobs={"msgs": b"m5"}), 4, 2),
            p(writes("t", 5, "a", [("msgs", b"w5")]), 5, 2),
        ],
        "one writer (a prune that deletes)": [
            p(put("t", 1, blobs={"msgs": b"m1"}), None),
            ThreadPrune("t", "delete"),
            p(put("t", 2, parent=1, blobs={"msgs": b"m2"}), 1),
            p(put("t", 3, blobs={"msgs": b"m3"}), None, 1),
        ],
        "one writer (runs.delete of the lead's run)": [
            p(put("t", 1, blobs={"msgs": b"m1"}, metadata={"run_id": "r1"}), None),
            p(put("t", 3, parent=1, blobs={"msgs": b"m3"}, metadata={"run_id": "r3"}), 1),
            p(put("t", 4, parent=3, blobs={"msgs": b"m4"}, metadata={"run_id": "r4"}), 3),
            RunsDelete(("r4",)),
            p(put("t", 5, parent=4, blobs={"msgs": b"m5"}), 4),
            p(put("t", 6, parent=3, blobs={"msgs": b"m6"}), 3, 1),
        ],
    }


def _not_new(event: CheckpointPut) -> CheckpointPut:
    """The put as code that calls the saver itself may make it: no channel called new."""
    return dataclasses.replace(event, new_channels=())


WAITS = {
    "thread.prune (keep_latest)": ThreadPrune,
    "thread.copy.barrier": ThreadCopyBarrier,
    "thread.expire": ThreadExpire,
    "runs.delete (the newest's run)": RunsDelete,
    "one writer (runs.delete of the lead's run)": RunsDelete,  # a lead is its namespace's newest
    # The fold holds no blob of an older checkpoint's put: the later put's read waits for the blob row.
    "checkpoint.put (a version first stored by a put of an older checkpoint)": CheckpointPut,
    "checkpoint.put (an inline value at a version another put stored a row at)": CheckpointPut,
    "checkpoint.put (a value stored again at a version an earlier put stored)": CheckpointPut,
    "checkpoint.put (no value stored at a version an earlier put stored a value at)": CheckpointPut,
}
"""Scenarios whose event the fold cannot derive (a read that meets it waits for the projection)."""


class ThreadAnswers:
    """What reads of one thread answer in one schema, as the read API answers them (`wire_tuple`)."""

    def __init__(self, conn: Any, thread_id: str) -> None:
        self.saver = TenantSaver(conn=conn, serde=PassThroughSerde(), thread_prefix=None)
        self.conn = conn
        self.thread_id = thread_id

    async def namespaces(self) -> list[str]:
        cursor = await self.conn.execute(THREAD_NAMESPACES_SQL, {"thread": self.thread_id, "most": 100})
        return [row["checkpoint_ns"] for row in await cursor.fetchall()]

    async def ceilings(self, ns: str) -> dict[str, int]:
        cursor = await self.conn.execute(BLOB_CEILINGS_SQL, {"thread": self.thread_id, "ns": ns})
        row = await cursor.fetchone()
        assert row is not None
        ceilings: dict[str, int] = row["ceilings"]
        return ceilings

    async def early_writes(self, ns: str, newest: dict[str, Any] | None) -> bool:
        """Whether the projection holds writes of a checkpoint newer than the namespace's newest (the read
        API's get by id then waits: the fold of the newest does not hold them)."""
        newest_id = newest["config"]["checkpoint_id"] if newest is not None else ""
        cursor = await self.conn.execute(EARLY_WRITES_SQL, {"thread": self.thread_id, "ns": ns, "newest": newest_id})
        row = await cursor.fetchone()
        return row is not None and bool(row["early"])

    async def basis(self, ns: str) -> Basis:
        cursor = await self.conn.execute(THREAD_BASIS_SQL, {"thread": self.thread_id, "ns": ns})
        row = await cursor.fetchone()
        assert row is not None
        return Basis(row["operations"], None if row["lead"] is None else bytes(row["lead"]), row["lead_run"])

    async def get(self, ns: str, checkpoint_id: str | None = None) -> dict[str, Any] | None:
        configurable = {"thread_id": self.thread_id, "checkpoint_ns": ns}
        if checkpoint_id is not None:
            configurable["checkpoint_id"] = checkpoint_id
        found = await self.saver.aget_tuple({"configurable": configurable})  # type: ignore[arg-type]
        return wire_tuple(found, Tenant("")) if found is not None else None

    async def ids(self) -> list[tuple[str, str]]:
        config = {"configurable": {"thread_id": self.thread_id}}
        return [
            (t.config["configurable"]["checkpoint_ns"], t.config["configurable"]["checkpoint_id"])
            async for t in self.saver.alist(config)  # type: ignore[arg-type]
        ]


async def _pg(dsn: str, schema: str) -> Any:
    import psycopg
    from psycopg.rows import dict_row

    return await psycopg.AsyncConnection.connect(
        dsn, autocommit=True, row_factory=dict_row, options=f"-c search_path={schema}"
    )


def _fold_newest(
    base: dict[str, Any] | None, namespaces: list[str], ceilings: dict[str, int], basis: Basis,
    events: Sequence[Any], ns: str,
) -> Any:  # fmt: skip
    view = thread.from_answer(ns, base, namespaces, ceilings=ceilings, basis=basis)
    for event in events:
        view = thread.apply(view, event)
    return None if view.erased else view.answer("t", ns, None), view


def _fold_one(
    base: dict[str, Any] | None, newest: dict[str, Any] | None, namespaces: list[str], ceilings: dict[str, int],
    basis: Basis, events: Sequence[Any], ns: str, checkpoint_id: str,
) -> Any:  # fmt: skip
    if base is None:
        start = thread.from_answer(ns, newest, namespaces, ceilings=ceilings, basis=basis)
        view = thread.fold_to_checkpoint(start, events, ns, checkpoint_id)
        if isinstance(view, thread.Underivable):
            return view
    else:
        view = thread.from_answer(ns, base)
        for event in events:
            view = thread.apply_to_checkpoint(view, event, ns, checkpoint_id)
    return None if view.erased else view.answer("t", ns, checkpoint_id)


class TestCheckpointFold:
    """`graphledger.folds.thread` against `CheckpointProjection`'s SQL, for every checkpoint event type."""

    @pytest.mark.parametrize("scenario", list(_scenarios()))
    async def test_the_fold_of_unprojected_events_equals_the_projection(
        self, fresh_database: str, conn: asyncpg.Connection, scenario: str
    ) -> None:
        events = _scenarios()[scenario]
        records = [checkpoints.record(e, 0, offset) for offset, e in enumerate(events)]
        projection = CheckpointProjection("final")
        timed = [projection.to_event(envelope.decode(r.value or b""), r.timestamp) for r in records]
        mine = thread_events(list(enumerate(timed)), "t", FOLD_REF)
        positions = [offset for offset, e in enumerate(timed) if e.event in mine]
        subject = SealedSubject(FOLD_REF, "thread", "", "t")
        contract = TestCheckpointProjection()

        final = await contract.applier(fresh_database, conn, "final", [])
        await erasure.record_subjects(conn, erasure.ErasureStatements("final"), [subject])
        for record in records:  # one at a time: a barrier's copy must have committed before it
            await final.apply(conn, [record])
        steps = await contract.applier(fresh_database, conn, "steps", [])
        await erasure.record_subjects(conn, erasure.ErasureStatements("steps"), [subject])
        at_end, at_step = await _pg(fresh_database, "final"), await _pg(fresh_database, "steps")
        try:
            end, step = ThreadAnswers(at_end, "t"), ThreadAnswers(at_step, "t")
            namespaces_end = await end.namespaces()
            read_ns = sorted({"", *namespaces_end, *(e.checkpoint_ns for e in events if hasattr(e, "checkpoint_ns"))})
            expected = {ns: await end.get(ns) for ns in read_ns}
            ever = {
                (e.checkpoint_ns, e.checkpoint_id)
                for e in events
                if isinstance(e, CheckpointPut) and e.thread_id == "t"
            }
            expected_one = {key: await end.get(*key) for key in sorted(ever)}
            derived: set[str] = set()
            underivable: set[str] = set()
            folds = ones = 0
            for k in range(len(records) + 1):
                suffix = [e for offset, e in zip(positions, mine, strict=True) if offset >= k]
                kinds = {type(e).TYPE for e in suffix}
                namespaces = await step.namespaces()
                for ns in read_ns:
                    base, basis = await step.get(ns), await step.basis(ns)
                    answer, view = _fold_newest(base, namespaces, await step.ceilings(ns), basis, suffix, ns)
                    if isinstance(answer, thread.Underivable):
                        underivable |= kinds
                        continue
                    assert answer == expected[ns], (scenario, k, ns)
                    if view.complete and not view.erased:
                        held = sorted(n for n, h in view.namespaces.items() if h is None or h.newest)
                        assert held == namespaces_end, (scenario, k)
                    derived |= kinds
                    folds += len(suffix) > 0
                for ns, checkpoint_id in sorted(ever):
                    base, newest, basis = await step.get(ns, checkpoint_id), await step.get(ns), await step.basis(ns)
                    if base is None and await step.early_writes(ns, newest):
                        continue  # the read waits, as `_one_view` does
                    ceilings = await step.ceilings(ns)
                    answer = _fold_one(base, newest, namespaces, ceilings, basis, suffix, ns, checkpoint_id)
                    if isinstance(answer, thread.Underivable):
                        continue
                    assert answer == expected_one[(ns, checkpoint_id)], (scenario, k, ns, checkpoint_id)
                    ones += len(suffix) > 0
                if k < len(records):
                    await steps.apply(conn, [records[k]])
        finally:
            await at_end.close()
            await at_step.close()
        waiting = WAITS.get(scenario)
        if waiting is None:
            assert not underivable, f"{scenario}: the fold could not derive a read after {sorted(underivable)}"
        else:
            assert waiting.TYPE in underivable and waiting.TYPE not in derived  # the read waits: documented
        assert folds and ones, scenario  # the scenario exercised the fold, of the newest and of one checkpoint
