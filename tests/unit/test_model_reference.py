"""The reference of the model-based test (`tests/model_reference.py`) passes LangGraph's conformance suite,
and follows the official Postgres saver where `InMemorySaver` does not (each rule below is one place
the two differ, or one the base class leaves to the saver)."""

from __future__ import annotations

from typing import Any

import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES

from model_reference import ReferenceSaver, jsonb, jsonb_contains


@pytest.mark.parametrize("capability", sorted(c.value for c in ALL_CAPABILITIES))
async def test_the_reference_passes_the_conformance_suite(capability: str) -> None:
    @checkpointer_test(name="ReferenceSaver")
    async def reference():
        yield ReferenceSaver()

    report = await validate(reference, capabilities={capability})
    result = report.results[capability]
    assert result.detected
    assert result.passed, f"{capability}: {result.tests_failed} failed: {result.failures}"


def _config(thread: str = "t", ns: str = "", checkpoint_id: str | None = None) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread, "checkpoint_ns": ns, "checkpoint_id": checkpoint_id}}


def _checkpoint(cid: str, values: dict[str, Any], versions: dict[str, str]) -> dict[str, Any]:
    return {"v": 4, "id": cid, "ts": "2026-01-01T00:00:00+00:00", "channel_values": values,
            "channel_versions": versions, "versions_seen": {}, "updated_channels": None}  # fmt: skip


def _put(saver: ReferenceSaver, cid: str, parent: str | None = None, ns: str = "", **kw: Any) -> None:
    values = kw.get("values", {"n": 1})
    versions = kw.get("versions", dict.fromkeys(values, "1"))
    saver.put(_config(ns=ns, checkpoint_id=parent), _checkpoint(cid, values, versions), kw.get("metadata", {}),
              kw.get("new_versions", versions))  # fmt: skip


def test_a_repeated_put_keeps_the_first_parent_and_the_first_blob() -> None:
    saver = ReferenceSaver()
    _put(saver, "1")
    _put(saver, "2", parent="1", values={"xs": [1]}, versions={"xs": "v"})
    _put(saver, "2", parent=None, values={"xs": [2]}, versions={"xs": "v"}, metadata={"again": True})
    found = saver.get_tuple(_config())
    assert found is not None
    assert found.parent_config == _config(checkpoint_id="1")
    assert found.checkpoint["channel_values"] == {"xs": [1]}
    assert found.metadata == {"again": True}


def test_primitives_are_read_inline_whatever_the_versions_say() -> None:
    saver = ReferenceSaver()
    _put(saver, "1", values={"s": "text", "xs": [1]}, versions={"s": "1", "xs": "1"}, new_versions={})
    found = saver.get_tuple(_config())
    assert found is not None and found.checkpoint["channel_values"] == {"s": "text"}


def test_special_writes_upsert_only_in_a_batch_of_special_writes() -> None:
    saver = ReferenceSaver()
    _put(saver, "1")
    config = _config(checkpoint_id="1")
    saver.put_writes(config, [("__error__", "first")], "task", "path-1")
    saver.put_writes(config, [("__error__", "second")], "task", "path-2")
    saver.put_writes(config, [("__error__", "third"), ("x", 1)], "task", "path-3")
    found = saver.get_tuple(config)
    assert found is not None and found.pending_writes == [("task", "__error__", "second"), ("task", "x", 1)]
    assert saver.writes[("t", "", "1")][("task", -1)][3] == "path-1"


def test_list_orders_by_id_over_namespaces_and_filters_by_containment() -> None:
    saver = ReferenceSaver()
    _put(saver, "1", metadata={"tags": ["a", "b"], "step": 1})
    _put(saver, "2", ns="inner", metadata={"tags": ["b"], "step": 2})
    _put(saver, "3", parent="1", metadata={"tags": ["c"], "step": 3})
    ids = [t.config["configurable"]["checkpoint_id"] for t in saver.list({"configurable": {"thread_id": "t"}})]
    assert ids == ["3", "2", "1"]
    found = saver.list({"configurable": {"thread_id": "t"}}, filter={"tags": ["b"]})
    assert [t.config["configurable"]["checkpoint_id"] for t in found] == ["2", "1"]


def test_keep_latest_nulls_the_kept_parent_keeps_writes_ahead_and_frees_blobs() -> None:
    saver = ReferenceSaver()
    _put(saver, "1", values={"xs": [1]}, versions={"xs": "v1"})
    _put(saver, "2", parent="1", values={"ys": [2]}, versions={"ys": "v2"})
    saver.put_writes(_config(checkpoint_id="1"), [("x", 1)], "task")
    saver.put_writes(_config(checkpoint_id="3"), [("x", 3)], "task")  # its put has not come yet
    saver.prune(["t"])
    found = saver.get_tuple(_config())
    assert found is not None and found.parent_config is None
    assert ("t", "", "1") not in saver.writes and ("t", "", "3") in saver.writes
    assert ("t", "", "xs", "v1") not in saver.blobs and ("t", "", "ys", "v2") in saver.blobs
    _put(saver, "3", parent="2", values={"xs": [9]}, versions={"xs": "v1"}, new_versions={})
    found = saver.get_tuple(_config())
    assert found is not None and found.checkpoint["channel_values"] == {} and found.pending_writes == [("task", "x", 3)]


def test_keep_latest_drops_a_subgraph_call_whose_saved_root_is_pruned() -> None:
    saver = ReferenceSaver()
    _put(saver, "1")
    _put(saver, "2", ns="call:1", metadata={"parents": {"": "1"}})
    _put(saver, "3", ns="inner", metadata={"parents": {"": "1"}})
    _put(saver, "4", parent="1")
    saver.prune(["t"])
    assert saver.get_tuple(_config(ns="call:1")) is None
    assert saver.get_tuple(_config(ns="inner")) is not None


def test_delete_for_runs_drops_the_runs_checkpoints_with_their_writes() -> None:
    saver = ReferenceSaver()
    _put(saver, "1", metadata={"run_id": "a"})
    _put(saver, "2", parent="1", metadata={"run_id": "b"})
    saver.put_writes(_config(checkpoint_id="2"), [("x", 1)], "task")
    saver.delete_for_runs(["b"])
    found = saver.get_tuple(_config())
    assert found is not None and found.config == _config(checkpoint_id="1") and found.pending_writes == []
    assert ("t", "", "2") not in saver.writes


def test_a_copy_keeps_what_the_target_has_and_erasure_is_for_ever() -> None:
    saver = ReferenceSaver()
    _put(saver, "1", metadata={"from": "source"})
    saver.put({"configurable": {"thread_id": "u", "checkpoint_ns": ""}}, _checkpoint("1", {}, {}), {"from": "u"}, {})
    saver.copy_thread("t", "u")
    found = saver.get_tuple({"configurable": {"thread_id": "u"}})
    assert found is not None and found.metadata == {"from": "u"}
    saver.erase("u")
    saver.copy_thread("t", "u")
    _put(saver, "2")
    saver.put({"configurable": {"thread_id": "u", "checkpoint_ns": ""}}, _checkpoint("3", {}, {}), {}, {})
    assert saver.get_tuple({"configurable": {"thread_id": "u"}}) is None
    assert list(saver.list({"configurable": {"thread_id": "u"}})) == []


def test_jsonb_orders_keys_and_contains_as_postgres() -> None:
    assert list(jsonb({"bb": 1, "a": 2, "ab": (1, 2)})) == ["a", "ab", "bb"]
    assert jsonb({"x": (1, 2)}) == {"x": [1, 2]}
    assert jsonb_contains({"tags": ["a", "b"], "n": 1}, {"tags": ["b"]})
    assert jsonb_contains({"n": 1.0}, {"n": 1})
    assert not jsonb_contains({"flag": True}, {"flag": 1})
    assert not jsonb_contains({"tags": "a"}, {"tags": ["a"]})
