"""The fold of a thread's events into what its reads answer, as the projection applies them."""

from __future__ import annotations

from checkpoint_builders import FIRST, SAVER, SECOND, folded, newest, put, values, writes
from graphledger.events.checkpoint import (
    RunsDelete,
    ThreadCopyBarrier,
    ThreadDelete,
    ThreadPrune,
)
from graphledger.events.erasure import ThreadErase
from graphledger.folds import thread


def test_a_put_is_the_newest_with_every_channel_value_and_jsonb_metadata() -> None:
    answer = newest(folded(FIRST, SECOND))
    assert answer is not None
    assert answer["config"] == {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": "02"}
    assert answer["parent_config"]["checkpoint_id"] == "01"
    # The blob of the unchanged channel comes from the parent, the primitive inline from the put.
    assert values(answer) == {"msgs": ["a"], "n": 2}
    # Metadata as jsonb returns it: keys by length, then bytes, and 1e16 an integer.
    assert list(answer["metadata"]) == ["step", "score", "run_id", "source"]
    assert answer["metadata"]["score"] == 10**16
    assert answer["pending_writes"] == []


def test_each_answer_is_a_fresh_object() -> None:
    view = folded(FIRST)
    first = newest(view)
    assert first is not None
    first["checkpoint"]["channel_values"].clear()
    assert values(newest(view)) == {"msgs": ["a"], "n": 1}  # type: ignore[arg-type]


def test_writes_merge_as_the_projection_applies_them_in_the_savers_order() -> None:
    view = folded(
        FIRST,
        writes("01", "task-b", [("msgs", ["b"])], path="~b"),
        writes("01", "task-a", [("msgs", ["a2"])], path="~a"),
        writes("01", "task-a", [("msgs", ["never"])], path="~a"),  # a regular write never overwrites
        writes("01", "task-b", [("__error__", ValueError("x"))], path="~b"),
        writes("01", "task-b", [("__error__", ValueError("y"))], path="~b"),  # a special write replaces
    )
    answer = newest(view)
    assert answer is not None
    rows = [(task, channel, path, idx) for task, channel, _, path, idx in answer["pending_writes"]]
    assert rows == [("task-a", "msgs", "~a", 0), ("task-b", "__error__", "~b", -1), ("task-b", "msgs", "~b", 0)]
    error = answer["pending_writes"][1][2]
    assert "'y'" in str(SAVER.serde.loads_typed((error["t"], error["b"])))


def test_writes_that_reach_the_log_before_their_put_wait_for_it() -> None:
    view = folded(FIRST, writes("02", "task", [("n", 5)]))
    assert newest(view)["config"]["checkpoint_id"] == "01"  # type: ignore[index]
    assert newest(view)["pending_writes"] == []  # type: ignore[index]
    answer = newest(thread.apply(view, SECOND))
    assert answer is not None and [(w[0], w[1]) for w in answer["pending_writes"]] == [("task", "n")]


def test_a_repeated_put_replaces_checkpoint_and_metadata_and_keeps_parent_and_writes() -> None:
    again = put("02", "99", {"msgs": ["a"], "n": 3}, {"msgs": "1", "n": "2"}, {})
    answer = newest(folded(FIRST, SECOND, writes("02", "task", [("n", 7)]), again))
    assert answer is not None
    assert answer["parent_config"]["checkpoint_id"] == "01"
    assert values(answer)["n"] == 3
    assert len(answer["pending_writes"]) == 1


def test_an_older_put_leaves_the_newest_as_it_is() -> None:
    older = put("00", None, {"n": 0}, {"n": "0"}, {"n": "0"})
    view = folded(FIRST, SECOND)
    assert newest(thread.apply(view, older)) == newest(view)


def test_an_older_put_storing_a_value_the_newest_names_leaves_the_namespace_not_held() -> None:
    # Checkpoint 03 names msgs at version 2, which its parent 02 stores; 03's put reached the log first
    # (another writer's), and the projection answered 03 before 02's put applied: without msgs.
    answer = newest(folded(FIRST, SECOND))
    assert answer is not None
    answer["config"]["checkpoint_id"] = "03"
    answer["checkpoint"]["channel_versions"]["msgs"] = "2"
    del answer["checkpoint"]["channel_values"]["msgs"]
    view = thread.from_answer("", answer, namespaces=[""])
    parent = put("02", "01", {"msgs": ["b"], "n": 2}, {"msgs": "2", "n": "2"}, {"msgs": "2", "n": "2"})
    assert thread.apply(view, parent).namespaces[""] is None  # the projection reads 03 with msgs now
    unrelated = put("02", "01", {"msgs": ["b"], "n": 2}, {"msgs": "3", "n": "2"}, {"msgs": "3", "n": "2"})
    assert newest(thread.apply(view, unrelated)) == newest(view)


def test_a_newer_put_storing_a_value_an_older_checkpoint_names_leaves_a_read_of_it_not_held() -> None:
    # A get by id of 02, which names msgs at version 2 and holds no blob row of it (a delete dropped the
    # row); 03 stores msgs at 2 again, and the projection then reads 02 with it (rows are per version).
    answer = newest(folded(FIRST, SECOND))
    assert answer is not None
    answer["checkpoint"]["channel_versions"]["msgs"] = "2"
    del answer["checkpoint"]["channel_values"]["msgs"]
    one = thread.from_answer("", answer)
    stores = put("03", "02", {"msgs": ["b"], "n": 2}, {"msgs": "2", "n": "2"}, {"msgs": "2"})
    assert thread.apply_to_checkpoint(one, stores, "", "02").namespaces.get("") is None
    unrelated = put("03", "02", {"msgs": ["b"], "n": 2}, {"msgs": "3", "n": "2"}, {"msgs": "3"})
    assert thread.apply_to_checkpoint(one, unrelated, "", "02") is one


def _v(counter: int) -> str:
    """A version in LangGraph's form: 32 zero-padded digits and a tiebreak."""
    return f"{counter:032}.0.5"


def test_a_version_a_put_does_not_call_new_answers_inline_only_above_every_blob_row() -> None:
    # Checkpoint 02 names n at version 7 without calling it new and holds n inline (code that calls the
    # saver itself). The official saver reads a blob row at version 7 over the inline value if any put
    # stored one (a copied thread's, a sibling's): only above every row's counter is the inline value it.
    foreign = put("02", "01", {"msgs": ["a"], "n": 2}, {"msgs": "1", "n": _v(7)}, {})
    answer = newest(folded(FIRST))
    unknown = thread.from_answer("", answer, [""])
    assert thread.apply(unknown, foreign).namespaces[""] is None
    at_a_row = thread.from_answer("", answer, [""], ceilings={"n": 7})
    assert thread.apply(at_a_row, foreign).namespaces[""] is None
    uncounted = thread.from_answer("", answer, [""], ceilings={"n": thread.UNCOUNTED})
    assert thread.apply(uncounted, foreign).namespaces[""] is None
    above = thread.from_answer("", answer, [""], ceilings={"n": 6})
    assert values(newest(thread.apply(above, foreign))) == {"msgs": ["a"], "n": 2}  # type: ignore[arg-type]
    # A thread folded from its start has seen every row; a put's rows raise its ceilings.
    assert values(newest(thread.apply(folded(FIRST), foreign))) == {"msgs": ["a"], "n": 2}  # type: ignore[arg-type]
    stores_n = put("02", "01", {"msgs": ["a"], "n": ["x"]}, {"msgs": "1", "n": _v(7)}, {"n": _v(7)})
    assert folded(FIRST, stores_n).namespaces[""].ceilings == {"n": 7}  # type: ignore[union-attr]
    # A version of another form has no counter: it is never taken for above the rows.
    integer = put("02", "01", {"msgs": ["a"], "n": 2}, {"msgs": "1", "n": "7"}, {})
    assert thread.apply(above, integer).namespaces[""] is None


def test_a_version_counter_is_its_32_zero_padded_digits() -> None:
    assert thread.version_counter(_v(12)) == 12
    assert thread.version_counter("0" * 31 + "9") == 9
    for other in ("12", "12.0.5", "0" * 33 + ".0.5", "0" * 32 + "x", "٠" * 32):
        assert thread.version_counter(other) is None, other


def test_a_fork_from_a_checkpoint_not_held_leaves_the_namespace_not_held() -> None:
    view = folded(put("05", None, {"msgs": ["x"]}, {"msgs": "5"}, {"msgs": "5"}))
    forked = thread.apply(view, put("06", "03", {"msgs": ["old"]}, {"msgs": "3"}, {}))
    assert forked.namespaces[""] is None
    assert isinstance(newest(forked), thread.Underivable), "a namespace not held answered"


def test_an_older_checkpoint_is_not_answered_from_the_newest() -> None:
    view = folded(FIRST, SECOND)
    assert newest(view, cid="02") == newest(view)
    assert isinstance(newest(view, cid="01"), thread.Underivable), "an older checkpoint was answered"


def test_namespaces_are_apart_and_a_complete_view_knows_new_ones_are_empty() -> None:
    sub = put("03", None, {"x": "s"}, {"x": "1"}, {"x": "1"}, ns="child:1")
    view = folded(FIRST, sub)
    assert values(newest(view)) == {"msgs": ["a"], "n": 1}  # type: ignore[arg-type]
    assert values(newest(view, "child:1")) == {"x": "s"}  # type: ignore[arg-type]
    assert newest(view, "other:2") is None
    answered = thread.from_answer("", newest(view), namespaces=["", "child:1"])
    assert newest(answered, "other:2") is None
    not_held = newest(answered, "child:1")  # exists, not held
    assert isinstance(not_held, thread.Underivable), "a namespace not held answered"


def test_an_answer_folds_like_the_events_it_came_from() -> None:
    answer = newest(folded(FIRST))
    from_answer = thread.from_answer("", answer, namespaces=[""])
    assert newest(thread.apply(from_answer, SECOND)) == newest(folded(FIRST, SECOND))


def test_delete_prune_runs_copy_and_erasure() -> None:
    view = folded(FIRST, SECOND, writes("02", "task", [("n", 7)]))
    assert newest(thread.apply(view, ThreadDelete("t"))) is None
    assert newest(thread.apply(view, ThreadPrune("t", "delete"))) is None
    assert thread.apply(view, ThreadPrune("t", "keep_latest")) is thread.UNKNOWN
    assert newest(thread.apply(view, RunsDelete(("other-run",)))) == newest(view)
    assert thread.apply(view, RunsDelete(("run-1",))).namespaces[""] is None  # its next newest is not held
    assert thread.apply(view, ThreadCopyBarrier("t", 1, 5)) is thread.UNKNOWN
    erased = thread.apply(view, ThreadErase("ref"))
    assert newest(erased) is None and newest(thread.apply(erased, FIRST)) is None


def test_a_run_id_matches_as_the_text_postgres_gives_it() -> None:
    """`runs.delete` deletes where `metadata ->> 'run_id'` is one of its ids: a number or a boolean by its
    JSON text; a value whose text the fold does not reproduce makes the read wait for the projection."""
    assert [thread.run_id_text(v) for v in ("r", 7, True, False, None)] == ["r", "7", "true", "false", None]
    assert thread.run_id_text(1.5) is thread.OPAQUE_RUN_ID and thread.run_id_text({"a": 1}) is thread.OPAQUE_RUN_ID
