"""The checkpoint projection's pure half: how a batch is planned, and which events are refused before SQL."""

from __future__ import annotations

import dataclasses

import pytest

from graphledger.errors import InvalidEventError
from graphledger.events import to_envelope
from graphledger.events.checkpoint import (
    RunsDelete,
    ThreadCopy,
    ThreadCopyBarrier,
    ThreadDelete,
    ThreadExpire,
    ThreadPrune,
)
from graphledger.opening.checkpoint_events import to_checkpoint_event
from graphledger.ownership import SUPERSEDED, THREAD_CHANGED, Ledger
from graphledger_server.projection.checkpoint_plan import (
    ApplyCopy,
    DataRun,
    DeleteRuns,
    DeleteThreads,
    Plan,
    PruneKeepLatest,
    StageCopy,
    plan_batch,
)
from projection_helpers import TOPIC, cid, items, protected, put, writes


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
    ).steps
    assert [type(s) for s in plan] == [
        DataRun,
        DeleteThreads,
        DataRun,
        StageCopy,
        DeleteRuns,
        PruneKeepLatest,
        DataRun,
    ]
    assert plan[1] == DeleteThreads(("a", "b"))
    assert plan[3] == StageCopy("a", "c", TOPIC, 0, 5)  # staged under the copy record's offset


def test_a_copy_stages_at_its_record_and_applies_at_its_barrier_on_the_targets_partition() -> None:
    copy = items([ThreadCopy("src", "dst")], partition=0, first_offset=7)
    assert plan_batch(copy).steps == [StageCopy("src", "dst", TOPIC, 0, 7)]
    barrier = items([put("dst", 1), ThreadCopyBarrier("dst", 0, 7), put("dst", 2)], partition=2)
    before, applied, after = plan_batch(barrier).steps
    assert applied == ApplyCopy("dst", TOPIC, 2, 0, 7)  # between the target's records, not merged into them
    assert isinstance(before, DataRun) and isinstance(after, DataRun)


def test_a_copy_written_before_version_3_lands_at_its_record() -> None:
    copy = items([ThreadCopy("src", "dst", at_record=True)], partition=0, first_offset=7)
    assert plan_batch(copy).steps == [StageCopy("src", "dst", TOPIC, 0, 7), ApplyCopy("dst", TOPIC, 0, 0, 7)]


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
    ).steps
    assert isinstance(run, DataRun)
    checkpoints = [tuple(row) for row in run.checkpoints]
    assert len(checkpoints) == 1
    assert checkpoints[0][3] == cid(0)  # the first put's parent: the upsert does not touch it
    assert '"n": 2' in checkpoints[0][5]  # the last put's metadata
    assert run.blobs[0][5] == b"first"
    assert [tuple(row) for row in run.writes_insert] == [("t", "", cid(1), "task", "", 0, "x", "bytes", b"insert-1")]
    upserts = sorted(tuple(row) for row in run.writes_upsert)
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


def test_a_prune_keep_and_a_thread_expire_are_validated() -> None:
    assert ThreadPrune.from_payload({"thread_id": "t", "strategy": "keep_latest"}).keep == 1
    assert ThreadPrune("t", "keep_latest", 4).to_payload()["keep"] == 4
    for bad in (0, -1, True, 1.5, "2"):
        with pytest.raises(InvalidEventError, match="prune keep"):
            ThreadPrune.from_payload({"thread_id": "t", "strategy": "keep_latest", "keep": bad})
    with pytest.raises(InvalidEventError, match="idle_before_ms"):
        ThreadExpire.from_payload({"thread_id": "t", "idle_before_ms": -5})


# -- one writer per thread ----------------------------------------------------------------------------


def _puts(plan: Plan) -> list[tuple[str, str]]:
    return [(p.thread_id, p.checkpoint_id) for step in plan.steps if isinstance(step, DataRun) for p in step.puts]


def test_of_two_turns_started_on_one_head_the_later_in_the_log_is_refused_with_its_writes() -> None:
    plan = plan_batch(
        items(
            [
                protected(writes("t", 2, "b-task", [("x", b"early")]), expects=0),  # b's, before a's put: counted
                protected(put("t", 1, parent=0), expects=0),
                protected(put("t", 2, parent=0), expects=0),  # b read the same head: refused, its writes dropped
                protected(writes("t", 0, "b-task", [("x", b"late")]), expects=2),  # b's late write of the head
                protected(writes("t", 1, "a-task", [("x", b"a")]), expects=1),
            ]
        ),
        {"t": Ledger(0, {"": cid(0).encode()}, {}, {"": cid(0)})},
    )
    assert _puts(plan) == [("t", cid(1))]
    (run,) = plan.steps
    assert isinstance(run, DataRun)
    assert [tuple(w[2:4]) for w in run.writes_insert] == [(cid(1), "a-task")]
    assert [(r.checkpoint_id, r.event_type, r.cause, r.offset) for r in plan.refusals] == [
        (cid(2), "checkpoint.put", SUPERSEDED, 2),
        (cid(0), "checkpoint.writes", SUPERSEDED, 3),
    ]
    assert plan.ledgers == {"t": Ledger(0, {"": cid(1).encode()}, {"": None}, {"": cid(1)})}


def test_a_zombies_late_writes_and_put_are_refused_against_the_lead_it_did_not_expect() -> None:
    ledger = Ledger(0, {"": cid(2).encode()}, {}, {"": cid(2)})  # B's checkpoint 2 leads; A still thinks 1 does
    plan = plan_batch(
        items([protected(writes("t", 1, "task", [("x", b"1")]), expects=1), protected(put("t", 3, parent=1), 1)]),
        {"t": ledger},
    )
    assert plan.steps == [] and plan.ledgers == {}
    assert [(r.event_type, r.superseded_by) for r in plan.refusals] == [
        ("checkpoint.writes", cid(2).encode()),
        ("checkpoint.put", cid(2).encode()),
    ]


def test_an_operation_counts_and_refuses_writers_that_read_before_it() -> None:
    plan = plan_batch(
        items([put("t", 1), ThreadDelete("t"), protected(put("t", 2), expects=1), protected(put("t", 3), None, 2)])
    )
    assert _puts(plan) == [("t", cid(1)), ("t", cid(3))]
    (refusal,) = plan.refusals
    assert (refusal.checkpoint_id, refusal.cause) == (cid(2), THREAD_CHANGED)
    # The unprotected put and the delete are two operations; the put that read after both leads.
    assert plan.ledgers == {"t": Ledger(2, {"": cid(3).encode()}, {"": None}, {"": cid(3)})}


def test_runs_delete_opens_the_planned_threads_it_reaches_and_names_them_to_the_statement() -> None:
    run_put = protected(put("t", 1, metadata={"run_id": "r1"}), None)
    plan = plan_batch(items([run_put, put("u", 1), RunsDelete(("r1",)), protected(put("t", 2), 1)]))
    assert _puts(plan) == [("t", cid(1)), ("u", cid(1))]  # t's next put read before the delete: refused
    delete = next(step for step in plan.steps if isinstance(step, DeleteRuns))
    assert delete.planned_threads == ("t", "u")
    assert plan.ledgers["t"].operations == 1 and plan.ledgers["t"].lead("") is None
