"""How `graphledger import` turns one thread's rows of a PostgresSaver database into events, pure. The
import itself, from a database the official saver and store wrote into the dev stack, is
`acceptance/test_import.py`."""

from __future__ import annotations

import json
from typing import Any

from graphledger.events.checkpoint import CheckpointPut, CheckpointWrites
from graphledger_server.importer.plan import ThreadRows, thread_events


def test_a_thread_is_planned_parents_first_with_each_blob_once() -> None:
    """Pure planning: a parent whose id sorts after its child's still comes first; blobs ride on the
    first put listing their version; a blob no checkpoint lists rides on the namespace's last put."""

    def checkpoint(checkpoint_id: str, parent: str | None, versions: dict[str, str]) -> dict[str, Any]:
        body = json.dumps({"id": checkpoint_id, "channel_versions": versions, "channel_values": {}})
        return {"checkpoint_ns": "", "checkpoint_id": checkpoint_id, "parent_checkpoint_id": parent,
                "checkpoint": body, "metadata": "{}"}  # fmt: skip

    def blob(channel: str, version: str) -> dict[str, Any]:
        return {"checkpoint_ns": "", "channel": channel, "version": version, "type": "bytes", "blob": b"x"}

    rows = ThreadRows(
        "t",
        [checkpoint("b", "z", {"m": "2"}), checkpoint("z", None, {"m": "1"}), checkpoint("c", "b", {"m": "2"})],
        [blob("m", "1"), blob("m", "2"), blob("gone", "9")],
        [{"checkpoint_ns": "", "checkpoint_id": "b", "task_id": "t1", "task_path": "", "idx": -3,
          "channel": "__interrupt__", "type": "msgpack", "blob": b"i"},
         {"checkpoint_ns": "", "checkpoint_id": "b", "task_id": "t2", "task_path": "", "idx": 0,
          "channel": "m", "type": "msgpack", "blob": b"w"}],
    )  # fmt: skip
    events = thread_events(rows)
    puts = [e for e in events if isinstance(e, CheckpointPut)]
    assert [p.checkpoint_id for p in puts] == ["z", "b", "c"]
    assert [[(b.channel, b.version) for b in p.blobs] for p in puts] == [[("m", "1")], [("m", "2")], [("gone", "9")]]
    assert [type(e).__name__ for e in events] == ["CheckpointPut", "CheckpointPut", "CheckpointWrites",
                                                  "CheckpointWrites", "CheckpointPut"]  # fmt: skip
    writes = [e for e in events if isinstance(e, CheckpointWrites)]
    assert {(w.task_id, w.upsert) for w in writes} == {("t1", True), ("t2", False)}
