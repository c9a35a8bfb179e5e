"""A client's own writes added to a read's answer, as the projection will hold them."""

from __future__ import annotations

from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint

from graphledger import KafkaSaver, Settings
from graphledger.client.own_writes import OwnWrites, Recent, Underivable, with_own_writes
from graphledger.events.checkpoint import CheckpointPut, CheckpointWrites

SAVER = KafkaSaver(Settings())  # builds events only: nothing is started or published


def _put(
    cid: str, parent: str | None, values: dict[str, Any], versions: dict[str, str], new: dict[str, str]
) -> CheckpointPut:
    checkpoint = empty_checkpoint()
    checkpoint["v"] = 4  # LangGraph's format since pending sends became a channel
    checkpoint["id"] = cid
    checkpoint["channel_values"] = values
    checkpoint["channel_versions"] = versions
    config = {"configurable": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": parent}}
    return SAVER._checkpoint_put(config, checkpoint, {"source": "loop", "step": 1, "score": 1e16}, new)


def _writes(cid: str, task: str, writes: list[tuple[str, Any]], path: str = "") -> CheckpointWrites:
    config = {"configurable": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": cid}}
    return SAVER._checkpoint_writes(config, writes, task, path)


def _decoded(wire: dict[str, Any]) -> dict[str, Any]:
    return {k: SAVER.serde.loads_typed((v["t"], v["b"])) if "t" in v else v["v"] for k, v in wire.items()}


def _merge(answer: dict[str, Any] | None, *events: Any, orphans: frozenset = frozenset(), cid: str | None = None):
    return with_own_writes(answer, Recent(list(events), orphans), "t", "", cid)


def test_a_put_after_the_answer_is_the_latest_with_every_channel_value() -> None:
    first = _merge(None, _put("01", None, {"msgs": ["a"], "n": 1}, {"msgs": "1", "n": "1"}, {"msgs": "1", "n": "1"}))
    assert first is not None
    second = _merge(first, _put("02", "01", {"msgs": ["a"], "n": 2}, {"msgs": "1", "n": "2"}, {"n": "2"}))
    assert second is not None
    assert second["config"] == {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": "02"}
    assert second["parent_config"]["checkpoint_id"] == "01"
    # The blob of the unchanged channel comes from the answer, the primitive inline from the put.
    assert _decoded(second["checkpoint"]["channel_values"]) == {"msgs": ["a"], "n": 2}
    # Metadata as jsonb returns it: keys by length, and 1e16 an integer.
    assert list(second["metadata"].items()) == [("step", 1), ("score", 10**16), ("source", "loop")]
    assert second["pending_writes"] == []


def test_writes_merge_as_the_projection_applies_them_in_the_savers_order() -> None:
    base = _merge(None, _put("01", None, {"msgs": ["a"]}, {"msgs": "1"}, {"msgs": "1"}))
    merged = _merge(
        base,
        _writes("01", "task-b", [("msgs", ["b"])], path="~b"),
        _writes("01", "task-a", [("msgs", ["a2"])], path="~a"),
        _writes("01", "task-a", [("msgs", ["never"])], path="~a"),  # a regular write never overwrites
        _writes("01", "task-b", [("__error__", ValueError("x"))], path="~b"),
        _writes("01", "task-b", [("__error__", ValueError("y"))], path="~b"),  # a special write replaces
    )
    assert merged is not None
    rows = [(task, channel, path, idx) for task, channel, _, path, idx in merged["pending_writes"]]
    assert rows == [("task-a", "msgs", "~a", 0), ("task-b", "__error__", "~b", -1), ("task-b", "msgs", "~b", 0)]
    error = merged["pending_writes"][1][2]
    assert "'y'" in str(SAVER.serde.loads_typed((error["t"], error["b"])))


def test_writes_that_reached_the_log_before_their_put_are_kept_for_it() -> None:
    base = _merge(None, _put("01", None, {"n": 1}, {"n": "1"}, {"n": "1"}))
    merged = _merge(base, _writes("02", "task", [("n", 5)]), _put("02", "01", {"n": 2}, {"n": "2"}, {"n": "2"}))
    assert merged is not None and merged["config"]["checkpoint_id"] == "02"
    assert [(w[0], w[1]) for w in merged["pending_writes"]] == [("task", "n")]


def test_a_put_whose_writes_were_forgotten_as_projected_cannot_be_derived() -> None:
    base = _merge(None, _put("01", None, {"n": 1}, {"n": "1"}, {"n": "1"}))
    with pytest.raises(Underivable):
        _merge(base, _put("02", "01", {"n": 2}, {"n": "2"}, {"n": "2"}), orphans=frozenset({("", "02")}))


def test_a_put_forked_from_an_unknown_checkpoint_with_an_unknown_blob_cannot_be_derived() -> None:
    base = _merge(None, _put("05", None, {"msgs": ["x"]}, {"msgs": "5"}, {"msgs": "5"}))
    with pytest.raises(Underivable):
        _merge(base, _put("06", "03", {"msgs": ["old"]}, {"msgs": "3"}, {}))


def test_a_specific_checkpoint_is_the_answer_or_an_own_put() -> None:
    base = _merge(None, _put("01", None, {"n": 1}, {"n": "1"}, {"n": "1"}))
    own = _put("02", "01", {"n": 2}, {"n": "2"}, {"n": "2"})
    assert _merge(base, own, cid="01") == base
    assert _merge(base, own, cid="02")["checkpoint"]["id"] == "02"  # type: ignore[index]
    assert _merge(None, own, cid="03") is None


def test_the_journal_names_its_records_and_forgets_what_the_projection_holds() -> None:
    journal = OwnWrites()
    put = _put("01", None, {"n": 1}, {"n": "1"}, {"n": "1"})
    writes = _writes("01", "task", [("n", 1)])
    journal.record("t", [("cp", 3, 10)], put)
    journal.record("t", [("cp", 3, 11), ("cp", 3, 12)], writes)  # a chunked event: two records
    named = journal.named("t")
    assert named is not None and named.header == "3:10,11,12" and named.last == 12
    later = _writes("01", "task2", [("n", 2)])
    journal.record("t", [("cp", 3, 13)], later)
    # The read looked up to offset 12: the write acknowledged after it named its records is left out.
    assert journal.since("t", 11, named).events == [writes]
    assert journal.named("t").header == "3:11,12,13"  # type: ignore[union-attr]
    # Writes of a checkpoint whose put the journal never held are remembered as such once forgotten.
    assert journal.since("t", 20, journal.named("t")).orphans == frozenset()  # type: ignore[arg-type]
    journal.record("t", [("cp", 3, 21)], _writes("07", "task", [("n", 3)]))
    assert journal.since("t", 30, journal.named("t")).orphans == {("", "07")}  # type: ignore[arg-type]
    assert journal.named("t") is None  # nothing left to name
