"""Checkpoint events built as `KafkaSaver` builds them, and readers of a fold's answers, for the fold's
and the held threads' unit tests."""

from __future__ import annotations

from typing import Any

from langgraph.checkpoint.base import empty_checkpoint

from graphledger import KafkaSaver, Settings
from graphledger.events.checkpoint import CheckpointPut, CheckpointWrites
from graphledger.folds import thread

SAVER = KafkaSaver(Settings())  # builds events only: nothing is started or published


def put(
    cid: str,
    parent: str | None,
    values: dict[str, Any],
    versions: dict[str, str],
    new: dict[str, str],
    ns: str = "",
    run_id: str = "run-1",
) -> CheckpointPut:
    checkpoint = empty_checkpoint()
    checkpoint["v"] = 4  # LangGraph's format since pending sends became a channel
    checkpoint["id"] = cid
    checkpoint["channel_values"] = values
    checkpoint["channel_versions"] = versions
    config = {"configurable": {"thread_id": "t", "checkpoint_ns": ns, "checkpoint_id": parent}}
    metadata = {"source": "loop", "step": 1, "score": 1e16, "run_id": run_id}
    return SAVER._checkpoint_put(config, checkpoint, metadata, new)


def writes(cid: str, task: str, items: list[tuple[str, Any]], path: str = "", ns: str = "") -> CheckpointWrites:
    config = {"configurable": {"thread_id": "t", "checkpoint_ns": ns, "checkpoint_id": cid}}
    return SAVER._checkpoint_writes(config, items, task, path)


def folded(*events: Any, start: thread.View = thread.NEW) -> thread.View:
    view = start
    for event in events:
        view = thread.apply(view, event)
    return view


def newest(view: thread.View, ns: str = "", cid: str | None = None) -> dict[str, Any] | thread.Underivable | None:
    return view.answer("t", ns, cid)


def values(wire: dict[str, Any]) -> dict[str, Any]:
    channel_values = wire["checkpoint"]["channel_values"]
    return {k: SAVER.serde.loads_typed((v["t"], v["b"])) if "t" in v else v["v"] for k, v in channel_values.items()}


FIRST = put("01", None, {"msgs": ["a"], "n": 1}, {"msgs": "1", "n": "1"}, {"msgs": "1", "n": "1"})
SECOND = put("02", "01", {"msgs": ["a"], "n": 2}, {"msgs": "1", "n": "2"}, {"n": "2"})
