"""The events of the v1 fixtures (tests/fixtures/events_v1): one per event type, each field set.

The fixture files hold these events as graphledger wrote them at schema version 1; the test decodes
the files and compares with these objects, so a change that stops reading a v1 record fails there.
"""

from __future__ import annotations

import json
from pathlib import Path

from graphledger.events.checkpoint import (
    Blob,
    CheckpointPut,
    CheckpointWrites,
    RunsDelete,
    ThreadCopy,
    ThreadCopyBarrier,
    ThreadDelete,
    ThreadExpire,
    ThreadPrune,
    Write,
)
from graphledger.events.store import StoreDelete, StoreExpire, StorePut, StoreRefresh

FIXTURES = Path(__file__).parent / "fixtures" / "events_v1"
CHECKPOINT_TOPIC, STORE_TOPIC = "v1.checkpoints", "v1.store"
"""The topics the tests replay the fixtures' records on."""

EVENT_ID = "00000000-0000-4000-8000-0000000000v1"
PRODUCED_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
VECTOR_DIMS = 3

CHECKPOINT_ID = "1f000000-0000-6000-8000-000000000002"
PARENT_ID = "1f000000-0000-6000-8000-000000000001"
VERSION = f"{2:032}.{0.5:016}"

EVENTS = {
    "checkpoint.put": CheckpointPut(
        "thread-v1",
        "",
        CHECKPOINT_ID,
        PARENT_ID,
        json.dumps(
            {
                "v": 4,
                "ts": "2026-01-01T00:00:00+00:00",
                "id": CHECKPOINT_ID,
                "channel_values": {"counter": 2},
                "channel_versions": {"counter": VERSION, "messages": VERSION, "gone": VERSION},
                "versions_seen": {"node": {"counter": VERSION}},
                "updated_channels": ["counter", "messages"],
            }
        ).encode(),
        json.dumps({"source": "loop", "step": 2, "parents": {}, "run_id": "run-v1"}).encode(),
        (Blob("messages", VERSION, "msgpack", b"\x92\xa2hi\xa5there"), Blob("gone", VERSION, "empty", None)),
    ),
    "checkpoint.writes": CheckpointWrites(
        "thread-v1",
        "",
        CHECKPOINT_ID,
        "task-v1",
        "~__pregel_pull, node",
        False,
        (Write(0, "messages", "msgpack", b"\xa3new"), Write(1, "counter", "msgpack", b"\x03")),
    ),
    "thread.delete": ThreadDelete("thread-v1-deleted"),
    "thread.copy": ThreadCopy("thread-v1", "thread-v1-copy"),
    "thread.copy.barrier": ThreadCopyBarrier("thread-v1-copy", 3, 1041),
    "thread.prune": ThreadPrune("thread-v1-copy", "keep_latest"),
    "thread.prune-keep-n": ThreadPrune("thread-v1", "keep_latest", 2),
    "thread.expire": ThreadExpire("thread-v1-idle", PRODUCED_MS - 3_600_000),
    "runs.delete": RunsDelete(("run-v1-other",)),
    "store.put": StorePut(
        ("users", "v1"),
        "profile",
        json.dumps({"text": "likes pizza", "n": 1}).encode(),
        None,
        (("text", (0.5, -0.25, 1.0)),),
    ),
    "store.put-imported": StorePut(
        ("users", "v1"), "imported", json.dumps({"text": "old"}).encode(), 60.0, None, PRODUCED_MS - 86_400_000
    ),
    "store.delete": StoreDelete(("users", "v1"), "gone"),
    "store.refresh": StoreRefresh(("users", "v1"), "imported"),
    "store.expire": StoreExpire(("users", "v1"), "expired", PRODUCED_MS - 1_000),
}


def fixture(name: str) -> bytes:
    """The record value of fixture `name` (a key of `EVENTS`), as graphledger 1 wrote it."""
    return (FIXTURES / f"{name}.msgpack").read_bytes()
