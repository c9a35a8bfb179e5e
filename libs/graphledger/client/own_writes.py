"""A client's own acknowledged checkpoint writes the projection may not hold yet, and how a read adds
them to the projection's answer, so that a process continuing its own thread never waits for the
projector (docs/architecture.md, "Consistency").

A get names its own records of the thread (`header`); the read API waits only for the thread's other
unprojected records and answers with `own_writes_from`, the partition's offset from which on the
projection may lack the named ones. `with_own_writes` then applies the named events at or after it
to the answer exactly as the projection applies them, in log order: a put upserts its checkpoint
(the newest id is the thread namespace's latest, as the official saver orders them), writes merge by
`(task_id, idx)` (special writes replace, others never do) and sort as the saver sorts them. Applying
an event the answer already holds changes nothing, so an answer that is newer than `own_writes_from`
is still right.

A put carries blobs only for the channels whose version changed; the values of the others come from
the checkpoint it follows. When that checkpoint is neither the answer nor one of the client's own puts
(a put that forked from an older checkpoint), `with_own_writes` raises `Underivable` and the client
asks again without naming its records (the read API then waits for them). The same happens for a put
whose writes reached the log before it and were already forgotten as projected: the projection holds
them, but its answer cannot show them until the put's own row is there. The client publishes a
checkpoint's writes after its put is acknowledged when both are in flight at once (`ClientRuntime`),
so this is rare.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from langgraph.checkpoint.base import writes_sort_key

from graphledger.client.jsonb import jsonb_value
from graphledger.events.checkpoint import CheckpointPut, CheckpointWrites
from graphledger.wire import typed

OwnEvent = CheckpointPut | CheckpointWrites

DEFAULT_MAX_BYTES = 64 * 1024 * 1024
"""Most bytes of unprojected own writes a client keeps; beyond, the least recently written threads are
forgotten (their reads then wait for the projection, as any other process's would)."""
MAX_NAMED_RECORDS = 256
"""Most records one get names; a thread with more unprojected own records waits for the projection."""


@dataclass(frozen=True, slots=True)
class Named:
    """What one get names: the header's value, its offsets (the last: -1 for none), the partition."""

    header: str
    last: int
    partition: int
    offsets: frozenset[int]


@dataclass(frozen=True, slots=True)
class Recent:
    """What a read adds to its answer: own events, and checkpoints it cannot bring up to date."""

    events: list[OwnEvent]
    orphans: frozenset[tuple[str, str]]
    last_offsets: tuple[int, ...] = ()
    """The offset of each event's last record."""

    def from_offset(self, offset: int) -> Recent:
        """The events whose last record is at or after `offset`."""
        kept = [(o, e) for o, e in zip(self.last_offsets, self.events, strict=True) if o >= offset]
        return Recent([e for _, e in kept], self.orphans, tuple(o for o, _ in kept))


class Underivable(Exception):
    """The answer cannot be brought up to date from the client's own writes alone."""


MAX_REMEMBERED = 64
"""Most checkpoints per thread remembered as put here (`put_ids`) or as orphans (`orphans`). An orphan
matters only to a put of the same checkpoint that reaches the log after its writes, which follows them
within milliseconds, long before 64 newer ones push it out."""
_REMEMBERED_BYTES = 100
"""What one remembered checkpoint counts against `max_bytes`."""


@dataclass(slots=True)
class _Thread:
    partition: int
    events: list[tuple[tuple[int, ...], OwnEvent]] = field(default_factory=list)
    """The offsets of each event's records (more than one for a chunked event) and the event."""
    size: int = 0
    put_ids: OrderedDict[tuple[str, str], None] = field(default_factory=OrderedDict)
    """`(checkpoint_ns, checkpoint_id)` of the puts recorded, also once forgotten."""
    orphans: OrderedDict[tuple[str, str], None] = field(default_factory=OrderedDict)
    """`(checkpoint_ns, checkpoint_id)` of writes forgotten as projected while no put of theirs was
    recorded: a later put of that checkpoint cannot be brought up to date here."""


class OwnWrites:
    """Per thread, the client's acknowledged puts and writes that a read may still need to add."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self._threads: OrderedDict[str, _Thread] = OrderedDict()
        self._size = 0
        self._max_bytes = max_bytes
        self._lock = threading.Lock()
        """Acks are recorded on the client's loop thread; reads may come from the caller's."""

    def record(self, thread_id: str, acked: Sequence[tuple[str, int, int]], event: OwnEvent) -> None:
        """An acknowledged event: `acked` are its records' `(topic, partition, offset)`."""
        offsets = tuple(offset for _, _, offset in acked)
        partition = acked[0][1]
        size = _size(event)
        with self._lock:
            thread = self._threads.pop(thread_id, None)
            if thread is None or thread.partition != partition:
                self._size -= thread.size if thread is not None else 0
                thread = _Thread(partition)
            thread.events.append((offsets, event))
            if isinstance(event, CheckpointPut):
                size += _remember(thread.put_ids, (event.checkpoint_ns, event.checkpoint_id))
            thread.size += size
            self._size += size
            self._threads[thread_id] = thread
            while self._size > self._max_bytes and self._threads:
                _, forgotten = self._threads.popitem(last=False)
                self._size -= forgotten.size

    def named(self, thread_id: str, partition: int | None = None) -> Named | None:
        """The thread's recorded records for a get to name, or None (too many, or none and no
        `partition` known otherwise to name none on)."""
        with self._lock:
            thread = self._threads.get(thread_id)
            if thread is not None and thread.events:
                offsets = [o for offsets, _ in thread.events for o in offsets]
                partition = thread.partition
            else:
                offsets = []
        if partition is None or len(offsets) > MAX_NAMED_RECORDS:
            return None
        header = f"{partition}:{','.join(map(str, offsets))}"
        return Named(header, offsets[-1] if offsets else -1, partition, frozenset(offsets))

    def since(self, thread_id: str, offset: int | None, named: Named) -> Recent:
        """The thread's events named in `named` whose records are at or after `offset`, in log order.
        Events before `offset` are in the projection and are forgotten (None: nothing is known
        projected, nothing is forgotten); events acknowledged after the get named its records are left
        out (the log was not looked at past them)."""
        with self._lock:
            thread = self._threads.get(thread_id)
            if thread is None:
                return Recent([], frozenset())
            if offset is not None:
                self._forget_projected(thread, offset)
            named_events = [(offsets[-1], e) for offsets, e in thread.events if offsets[-1] <= named.last]
            recent = Recent([e for _, e in named_events], frozenset(thread.orphans), tuple(o for o, _ in named_events))
            if not thread.events and not thread.orphans:
                del self._threads[thread_id]
                self._size -= thread.size
            return recent

    def _forget_projected(self, thread: _Thread, offset: int) -> None:
        """Drop the events below `offset`, except writes of a checkpoint whose put is not below it."""
        puts = {(e.checkpoint_ns, e.checkpoint_id): o[-1] for o, e in thread.events if isinstance(e, CheckpointPut)}
        kept: list[tuple[tuple[int, ...], OwnEvent]] = []
        for offsets, event in thread.events:
            target = (event.checkpoint_ns, event.checkpoint_id)
            if offsets[-1] >= offset or (isinstance(event, CheckpointWrites) and puts.get(target, -1) >= offset):
                kept.append((offsets, event))
                continue
            freed = _size(event)
            if isinstance(event, CheckpointWrites) and target not in thread.put_ids:
                freed -= _remember(thread.orphans, target)
            thread.size -= freed
            self._size -= freed
        thread.events = kept


def _remember(remembered: OrderedDict[tuple[str, str], None], checkpoint: tuple[str, str]) -> int:
    """Remember `checkpoint`, forgetting the oldest beyond `MAX_REMEMBERED`; returns the bytes added."""
    if checkpoint in remembered:
        remembered.move_to_end(checkpoint)
        return 0
    remembered[checkpoint] = None
    if len(remembered) > MAX_REMEMBERED:
        remembered.popitem(last=False)
        return 0
    return _REMEMBERED_BYTES


def _size(event: OwnEvent) -> int:
    if isinstance(event, CheckpointPut):
        return len(event.checkpoint_json) + len(event.metadata_json) + sum(len(b.data or b"") for b in event.blobs)
    return sum(len(w.data) for w in event.writes)


# -- applying own events to an answer -------------------------------------------------------------------

_NO_BLOB = object()
"""A channel version without a stored blob: its value is inline in the checkpoint, or absent."""


def with_own_writes(
    answer: dict[str, Any] | None, recent: Recent, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None
) -> dict[str, Any] | None:
    """The read API's `get` answer (wire form) for `(thread_id, checkpoint_ns, checkpoint_id)`, brought
    up to date with the client's own recent events (in log order); raises `Underivable`."""
    tuples: dict[str, dict[str, Any]] = {}
    blobs: dict[tuple[str, str], Any] = {}
    writes: dict[str, list[list[Any]]] = {}
    """Pending writes by checkpoint id: the answer's, and the own ones of checkpoints put here."""
    if answer is not None:
        tuples[answer["config"]["checkpoint_id"]] = answer = dict(answer)  # its writes are replaced below
        writes[answer["config"]["checkpoint_id"]] = answer["pending_writes"]
        _learn_blobs(blobs, answer)
    for event in recent.events:
        if event.checkpoint_ns != checkpoint_ns:
            continue
        if isinstance(event, CheckpointPut):
            if event.checkpoint_id not in tuples and (checkpoint_ns, event.checkpoint_id) in recent.orphans:
                raise Underivable(f"writes of checkpoint {event.checkpoint_id} were projected before its put")
            built = _put_tuple(event, thread_id, tuples, blobs)
            tuples[event.checkpoint_id] = built
            _learn_blobs(blobs, built)
        else:
            # Writes before their checkpoint's put wait for it, as rows of the projection would.
            writes[event.checkpoint_id] = _merged_writes(writes.get(event.checkpoint_id, []), event)
    for cid, built in tuples.items():  # a repeated put keeps the checkpoint's writes
        built["pending_writes"] = writes.get(cid, [])
    if checkpoint_id is not None:
        return tuples.get(checkpoint_id)
    return tuples[max(tuples)] if tuples else None


def _learn_blobs(blobs: dict[tuple[str, str], Any], wire: dict[str, Any]) -> None:
    """Record which channel versions of a checkpoint have a blob, and its wire value."""
    checkpoint = wire["checkpoint"]
    values = checkpoint.get("channel_values") or {}
    for channel, version in (checkpoint.get("channel_versions") or {}).items():
        value = values.get(channel)
        blobs.setdefault((channel, str(version)), value if isinstance(value, dict) and "t" in value else _NO_BLOB)


def _put_tuple(
    event: CheckpointPut, thread_id: str, tuples: dict[str, dict[str, Any]], blobs: dict[tuple[str, str], Any]
) -> dict[str, Any]:
    """The wire tuple the projection answers for the checkpoint `event` puts."""
    checkpoint = jsonb_value(event.checkpoint_json)
    if event.parent_checkpoint_id and (not isinstance(checkpoint.get("v"), int) or checkpoint["v"] < 4):
        raise Underivable("a checkpoint before format 4 is read with the saver's pending-sends migration")
    inline = checkpoint.get("channel_values") or {}
    versions = checkpoint.get("channel_versions") or {}
    parent = tuples.get(event.parent_checkpoint_id) if event.parent_checkpoint_id else None
    parent_versions = parent["checkpoint"].get("channel_versions") or {} if parent is not None else None
    new = {(b.channel, b.version): b for b in event.blobs}
    values: dict[str, Any] = {channel: {"v": value} for channel, value in inline.items()}
    for channel, raw_version in versions.items():
        version = str(raw_version)
        blob = new.get((channel, version))
        if blob is not None:
            if blob.type != "empty":
                values[channel] = typed(blob.type, blob.data or b"")
            continue
        known = blobs.get((channel, version))
        if known is None:
            if parent_versions is not None and str(parent_versions.get(channel)) != version:
                continue  # the version is this put's own, written without a blob: inline or absent
            if channel in inline and inline[channel] is not True:
                continue  # a primitive: stored inline, never as a blob (True marks a DeltaChannel snapshot)
            raise Underivable(f"the value of channel {channel!r} at version {version} is not known here")
        if known is not _NO_BLOB:
            values[channel] = known
    checkpoint["channel_values"] = values
    config = {"thread_id": thread_id, "checkpoint_ns": event.checkpoint_ns, "checkpoint_id": event.checkpoint_id}
    parent_config = (
        {"thread_id": thread_id, "checkpoint_ns": event.checkpoint_ns, "checkpoint_id": event.parent_checkpoint_id}
        if event.parent_checkpoint_id
        else None
    )
    return {
        "config": config,
        "checkpoint": checkpoint,
        "metadata": jsonb_value(event.metadata_json),
        "parent_config": parent_config,
        "pending_writes": [],
    }


def _merged_writes(existing: list[list[Any]], event: CheckpointWrites) -> list[list[Any]]:
    """`existing` (task_id, channel, value, task_path, idx rows) after the projection applies `event`."""
    rows = {(row[0], row[4]): row for row in existing}
    for write in event.writes:
        key = (event.task_id, write.idx)
        row = [event.task_id, write.channel, typed(write.type, write.data), event.task_path, write.idx]
        if key not in rows:
            rows[key] = row
        elif event.upsert:  # the row keeps its task path; channel, type and blob are replaced
            rows[key] = [*row[:3], rows[key][3], write.idx]
    return sorted(rows.values(), key=lambda row: writes_sort_key(row[3], row[0], row[4]))
