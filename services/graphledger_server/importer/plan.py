"""Turning rows of a `langgraph-checkpoint-postgres` database into graphledger events (pure).

A thread becomes, per namespace, its checkpoints in parent-before-child order, each `checkpoint.put`
followed by the `checkpoint.writes` made against it, as the official saver wrote them. A put carries
the blobs of the channel versions its checkpoint lists that no earlier put of the thread carried; blob
rows no checkpoint lists (left by deletions) ride on the namespace's last put, so the projection's
tables hold what the source's hold. A store row becomes one `store.put` with its vectors, its
`created_at` in `created_ms` and its `updated_at` as its time (what a copy carries in `gl-appended-ms`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from graphledger.events.checkpoint import Blob, CheckpointEvent, CheckpointPut, CheckpointWrites, Write
from graphledger.events.store import StorePut, Vector

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def epoch_ms(value: datetime) -> int:
    """Milliseconds since the epoch, truncated (the log's time resolution; Postgres keeps microseconds)."""
    return (value - _EPOCH) // timedelta(milliseconds=1)


@dataclass(frozen=True, slots=True)
class ThreadRows:
    """Every row of one thread: `checkpoints`, `checkpoint_blobs` and `checkpoint_writes` as mappings."""

    thread_id: str
    checkpoints: Sequence[Mapping[str, Any]]
    blobs: Sequence[Mapping[str, Any]]
    writes: Sequence[Mapping[str, Any]]


def thread_events(rows: ThreadRows) -> list[CheckpointEvent]:
    """The thread's events in publishing order."""
    events: list[CheckpointEvent] = []
    namespaces = sorted({r["checkpoint_ns"] for r in rows.checkpoints})
    for ns in namespaces:
        ordered = _parents_first([r for r in rows.checkpoints if r["checkpoint_ns"] == ns])
        blobs = {(b["channel"], b["version"]): b for b in rows.blobs if b["checkpoint_ns"] == ns}
        writes = _writes_by_checkpoint(rows.thread_id, ns, [w for w in rows.writes if w["checkpoint_ns"] == ns])
        for i, row in enumerate(ordered):
            checkpoint_json = row["checkpoint"].encode()
            versions = json.loads(checkpoint_json).get("channel_versions") or {}
            carried = [blobs.pop((ch, str(v))) for ch, v in versions.items() if (ch, str(v)) in blobs]
            if i == len(ordered) - 1:
                carried += [blobs.pop(k) for k in sorted(blobs)]
            events.append(
                CheckpointPut(
                    rows.thread_id,
                    ns,
                    row["checkpoint_id"],
                    row["parent_checkpoint_id"],
                    checkpoint_json,
                    row["metadata"].encode(),
                    tuple(Blob(b["channel"], b["version"], b["type"], b["blob"]) for b in carried),
                )
            )
            events.extend(writes.pop(row["checkpoint_id"], ()))
        for orphans in writes.values():  # writes against a checkpoint that is gone: keep them, as the source does
            events.extend(orphans)
    return events


def _parents_first(checkpoints: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Checkpoints ordered by id (uuid6: time), each moved after its parent when ids disagree."""
    by_id = {r["checkpoint_id"]: r for r in checkpoints}
    done: set[str] = set()
    ordered: list[Mapping[str, Any]] = []
    for row in sorted(checkpoints, key=lambda r: r["checkpoint_id"]):
        chain = []
        current: Mapping[str, Any] | None = row
        while current is not None and current["checkpoint_id"] not in done:
            chain.append(current)
            done.add(current["checkpoint_id"])
            parent = current["parent_checkpoint_id"]
            current = by_id.get(parent) if parent is not None else None
        ordered.extend(reversed(chain))
    return ordered


def _writes_by_checkpoint(
    thread_id: str, ns: str, rows: Iterable[Mapping[str, Any]]
) -> dict[str, list[CheckpointWrites]]:
    """One event per task and kind: special writes (negative idx: errors, interrupts) upsert, as the saver's."""
    groups: dict[tuple[str, str, str, bool], list[Write]] = {}
    for w in sorted(rows, key=lambda w: (w["checkpoint_id"], w["task_id"], w["idx"])):
        key = (w["checkpoint_id"], w["task_id"], w["task_path"], w["idx"] < 0)
        groups.setdefault(key, []).append(Write(w["idx"], w["channel"], w["type"] or "", w["blob"]))
    out: dict[str, list[CheckpointWrites]] = {}
    for (checkpoint_id, task_id, task_path, special), writes in groups.items():
        event = CheckpointWrites(thread_id, ns, checkpoint_id, task_id, task_path, special, tuple(writes))
        out.setdefault(checkpoint_id, []).append(event)
    return out


def store_put(row: Mapping[str, Any], vectors: Sequence[Vector]) -> tuple[StorePut, int]:
    """The put of one `store` row and its vector rows, and the time it carries as a copy (ms)."""
    ttl = row["ttl_minutes"]
    event = StorePut(
        tuple(row["prefix"].split(".")),
        row["key"],
        row["value"].encode(),
        None if ttl is None else float(ttl),
        tuple(vectors) if vectors else None,
        None if row["created_at"] is None else epoch_ms(row["created_at"]),
    )
    updated = row["updated_at"] or row["created_at"] or datetime.now(UTC)
    return event, epoch_ms(updated)
