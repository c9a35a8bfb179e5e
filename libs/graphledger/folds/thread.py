"""The fold of a thread's events into what a read of its checkpoints answers, as the projection would.

The projector applies events with set-based SQL; a process that holds a thread (the client's own
writes, `client/threads.py`) answers reads without the projection by folding the same events in
Python. One fold, written down once, with the projection's rules:
- a put upserts its checkpoint: a repeated put replaces checkpoint and metadata and keeps the first
  parent; a blob `(channel, version)` keeps its first value;
- writes merge by `(task_id, idx)`: special writes (`upsert`) replace channel, type and value and keep
  the row's task path, others never replace; they sort as the official saver sorts them;
- the newest checkpoint of a namespace is the one with the greatest id (the official saver's order);
- `thread.delete` and prune `delete` empty the thread; `runs.delete` leaves a namespace whose newest
  checkpoint it does not name as it is;
- an erasure ends the thread for good: nothing after it counts.
Whatever needs rows the view does not hold is `Underivable`, a result the reader matches, and it asks the
read API instead:
a put whose channel values come from a checkpoint the view never saw (a fork from an older
checkpoint, a version it does not call new that a blob row may hold: `Namespace.ceilings`), a copy
onto the thread, an expiry (it depends on the thread's activity time), a prune `keep_latest` (it
unlinks parents and drops subgraph namespaces), a `runs.delete` naming a newest checkpoint, a read of
a checkpoint older than the newest.

A view holds per namespace the newest checkpoint, the writes of it and of any newer checkpoint whose
put has not come yet (writes can reach the log before their put), what is known of the channel
versions it references, and the DeltaChannel history of the newest checkpoint: per channel, the seed
and writes `get_delta_channel_history` walks to from its parent, carried forward put by put (a
channel the parent stores starts again from that value) and learned from the read API where unknown.
Views are immutable: applying an event returns a new view, so a reader's snapshot never changes
under it. Values stay opaque, in the read API's wire form (`wire.py`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple, assert_never

import orjson
import ormsgpack
from langgraph.checkpoint.base import writes_sort_key
from langgraph.checkpoint.serde.types import TASKS

from graphledger.answers import ChannelHistory
from graphledger.events.checkpoint import (
    CheckpointEvent,
    CheckpointPut,
    CheckpointWrites,
    RunsDelete,
    ThreadCopy,
    ThreadCopyBarrier,
    ThreadDelete,
    ThreadExpire,
    ThreadPrune,
)
from graphledger.events.erasure import TenantErase, ThreadErase
from graphledger.jsonb import jsonb_value
from graphledger.wire import typed


@dataclass(frozen=True, slots=True)
class Underivable:
    """The view cannot answer as the projection would: ask the read API (which waits for the projection)."""

    reason: str
    """Why, as the logs and the errors that name it say it."""


NO_BLOB: Final = "no-blob"
"""A channel version without a blob row: its value is inline in the checkpoint, or absent."""
EMPTY_BLOB: Final = "empty-blob"
"""A blob row of type `empty`: the version has a row, and no value."""


class WriteRow(NamedTuple):
    """One row of `checkpoint_writes`: a pending write, as the read API answers it (`list(row)`)."""

    task_id: str
    channel: str
    value: dict[str, Any]
    """Wire form."""
    task_path: str
    idx: int


def _in_saver_order(rows: Iterable[WriteRow]) -> tuple[WriteRow, ...]:
    """`rows` as the official saver sorts a checkpoint's writes: by task path, task id, index."""
    return tuple(sorted(rows, key=lambda row: writes_sort_key(row.task_path, row.task_id, row.idx)))


class HistoryWrite(NamedTuple):
    """One write a DeltaChannel's history replays, as the read API answers it (`list(write)`)."""

    task_id: str
    channel: str
    value: Any
    """Wire form."""


class History(NamedTuple):
    """One channel's DeltaChannel history."""

    seed: Any
    """The value its replay starts from (wire form; None: none)."""
    writes: tuple[HistoryWrite, ...]
    """Oldest first."""


MAX_HISTORY_WRITES = 256
"""Most writes a view holds of one channel's history; a channel with more is no longer held (a
channel that never stores a value, such as a branch trigger, would otherwise grow for ever)."""

MAX_PENDING_CHECKPOINTS = 64
"""Most checkpoints ahead of the newest whose writes a namespace view holds before their put."""


@dataclass(frozen=True, slots=True, eq=False)
class Row:
    """One checkpoint as the projection holds it: from a put event, or from a read API answer."""

    checkpoint_id: str
    parent_id: str | None
    versions: Mapping[str, str]
    """Its `channel_versions`, as strings."""
    run_id: object
    """Its metadata's `run_id` as `runs.delete` matches it (`run_id_text`)."""
    legacy: bool = False
    """A checkpoint before format 4: the official saver reads it with its parent's pending sends."""
    stored: Mapping[str, Any] = field(default_factory=dict)
    """The channels with a stored value (a blob that is not empty, or an inline value that is not null),
    in wire form: where a DeltaChannel's history walk stops (its seed)."""
    put: CheckpointPut | None = None
    answer: Mapping[str, Any] | None = None
    """A read API answer's tuple (wire form), when the row came from one."""
    _packed: list[bytes] = field(default_factory=list)
    """The answer without its writes, packed once (an unpack is a cheap deep copy for each reader)."""

    def wire(self, thread_id: str, checkpoint_ns: str, values: Mapping[tuple[str, str], Any]) -> dict[str, Any]:
        """The tuple the read API answers for this checkpoint, less its pending writes (a fresh object)."""
        if not self._packed:
            self._packed.append(ormsgpack.packb(self._build(thread_id, checkpoint_ns, values)))
        wire: dict[str, Any] = ormsgpack.unpackb(self._packed[0])
        return wire

    def _build(self, thread_id: str, checkpoint_ns: str, values: Mapping[tuple[str, str], Any]) -> dict[str, Any]:
        if self.answer is not None:
            return {**self.answer, "pending_writes": []}
        assert self.put is not None
        checkpoint = jsonb_value(self.put.checkpoint_json)
        channel_values = {channel: {"v": value} for channel, value in (checkpoint.get("channel_values") or {}).items()}
        for channel, version in self.versions.items():
            value = values.get((channel, version))
            if isinstance(value, dict):
                channel_values[channel] = value
        checkpoint["channel_values"] = channel_values
        config = {"thread_id": thread_id, "checkpoint_ns": checkpoint_ns, "checkpoint_id": self.checkpoint_id}
        return {
            "config": config,
            "checkpoint": checkpoint,
            "metadata": jsonb_value(self.put.metadata_json),
            "parent_config": {**config, "checkpoint_id": self.parent_id} if self.parent_id else None,
            "pending_writes": [],
        }


@dataclass(frozen=True, slots=True)
class Namespace:
    """What one thread namespace's reads need: its newest checkpoint (None: it has none), the writes
    of that checkpoint and of newer ones not put yet, and the blobs of the versions it references.
    Make one with `namespace`, which sizes it."""

    newest: Row | None
    writes: Mapping[str, tuple[WriteRow, ...]]
    blobs: Mapping[tuple[str, str], Any]
    """`(channel, version)` -> wire value, or `NO_BLOB` / `EMPTY_BLOB`."""
    history: Mapping[str, History] | None
    """The DeltaChannel history of the newest checkpoint per channel (None: not known); with
    `history_complete`, a channel missing from it has none (no seed, no writes)."""
    history_complete: bool
    ceilings: Mapping[str, int] | None
    """Per channel, the highest counter of the namespace's blob rows whose versions have one
    (`version_counter`; a channel missing from it has none; `UNCOUNTED`: not known); None: not known
    for any channel. A put's version with a counter above it names no blob row, whoever wrote the rows."""
    size: int
    """Roughly the bytes it holds."""

    def delta_history(
        self, checkpoint_id: str | None, channels: Iterable[str]
    ) -> dict[str, ChannelHistory] | Underivable:
        """`get_delta_channel_history` of the newest checkpoint (or `checkpoint_id`, which must be it), as
        the read API answers it."""
        newest = self.newest
        if newest is None:
            return {channel: ChannelHistory([]) for channel in channels}
        if checkpoint_id is not None and checkpoint_id != newest.checkpoint_id:
            return Underivable(f"the history of checkpoint {checkpoint_id} is not held")
        answer: dict[str, ChannelHistory] = {}
        for channel in channels:
            known = self.history.get(channel) if self.history is not None else None
            if known is None and not (self.history is not None and self.history_complete):
                return Underivable(f"the history of channel {channel!r} is not held")
            known = known if known is not None else History(None, ())
            answer[channel] = ChannelHistory([list(write) for write in known.writes], known.seed)
        return answer

    def answer(
        self, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None
    ) -> dict[str, Any] | Underivable | None:
        """The read API's tuple for the newest checkpoint or for `checkpoint_id` (which must be it); None: no
        checkpoint."""
        newest = self.newest
        if newest is None:
            return None
        if checkpoint_id is not None and checkpoint_id != newest.checkpoint_id:
            return Underivable(f"checkpoint {checkpoint_id} is older than the newest held")
        wire = newest.wire(thread_id, checkpoint_ns, self.blobs)
        wire["pending_writes"] = [list(row) for row in self.writes.get(newest.checkpoint_id, ())]
        return wire


def namespace(
    newest: Row | None,
    writes: Mapping[str, tuple[WriteRow, ...]],
    blobs: Mapping[tuple[str, str], Any],
    history: Mapping[str, History] | None = None,
    history_complete: bool = False,
    ceilings: Mapping[str, int] | None = None,
) -> Namespace:
    size = 200
    if newest is not None and newest.put is not None:
        size += len(newest.put.checkpoint_json) + len(newest.put.metadata_json)
    elif newest is not None and newest.answer is not None:
        size += 500 + sum(_wire_size(v) for v in newest.answer["checkpoint"]["channel_values"].values())
    size += sum(_wire_size(v) for v in blobs.values())
    size += sum(_wire_size(row.value) + 64 for rows in writes.values() for row in rows)
    if history:
        size += sum(_wire_size(write.value) + 48 for known in history.values() for write in known.writes)
    return Namespace(newest, writes, blobs, history, history_complete, ceilings, size)


def _wire_size(value: Any) -> int:
    return len(value.get("b") or b"") + 32 if isinstance(value, dict) else 32


EMPTY: Final = namespace(None, {}, {}, {}, True, {})
"""A namespace with no checkpoint and no blob row (its history, when one comes, starts at the root)."""
NOT_FOUND: Final = namespace(None, {}, {}, {}, True)
"""A namespace whose checkpoint was not found: its blob rows are not known."""
UNCOUNTED: Final = 2**63
"""The ceiling of a channel whose highest counter is not known: no version is above it."""
COUNTER_DIGITS: Final = 32


def version_counter(version: str) -> int | None:
    """The counter of a version in LangGraph's form, 32 zero-padded digits before an optional random
    tiebreak (`"00..07.0.42"`, as `get_next_version` of the official savers and this one makes them);
    None for any other form. Versions of that form sort by their counters in any collation, so the
    projection finds a channel's highest with one index probe (`api/reads/checkpoint_sql.py`); a version of
    another form never equals one of that form."""
    head = version[:COUNTER_DIGITS]
    if len(head) < COUNTER_DIGITS or not (head.isascii() and head.isdigit()):
        return None
    if len(version) > COUNTER_DIGITS and version[COUNTER_DIGITS] != ".":
        return None
    return int(head)


def _above(ceilings: Mapping[str, int] | None, channel: str, version: str) -> bool:
    """Whether the namespace certainly holds no blob row of `channel` at `version`."""
    if ceilings is None:
        return False
    counter = version_counter(version)
    return counter is not None and counter > ceilings.get(channel, -1)


def _maybe_stored(ceilings: Mapping[str, int] | None, channel: str, version: str) -> bool:
    """Whether a put storing a value of `channel` at `version` may find a row there already (which stays):
    a version of LangGraph's form at or below the highest stored. One of another form (not made by
    `get_next_version`) is taken as new: such versions have no order to tell by."""
    counter = version_counter(version)
    if counter is None:
        return False
    return ceilings is None or counter <= ceilings.get(channel, -1)


def _raised(ceilings: Mapping[str, int] | None, event: CheckpointPut) -> Mapping[str, int] | None:
    """`ceilings` after the rows `event` stores (an empty blob is a row too; a row without a counter
    never equals a version with one)."""
    if ceilings is None or not event.blobs:
        return ceilings
    raised = dict(ceilings)
    for blob in event.blobs:
        counter = version_counter(blob.version)
        if counter is not None:
            raised[blob.channel] = max(raised.get(blob.channel, -1), counter)
    return raised


MAX_NAMESPACES = 256
"""Most namespaces a view knows of; beyond, it forgets those not held and no longer claims the rest empty."""


@dataclass(frozen=True, slots=True)
class View:
    """What a process knows of one thread: per namespace, `Namespace` or `None` for one that exists
    but is not held; a namespace missing from `namespaces` has no checkpoint when `complete`, and is
    not known otherwise. `erased`: the thread was erased; it reads as empty for ever. Make one with
    `view`, which sizes it."""

    namespaces: Mapping[str, Namespace | None]
    complete: bool
    erased: bool
    size: int

    def namespace(self, checkpoint_ns: str) -> Namespace | Underivable:
        """The namespace's view, unless it is not held."""
        if self.erased:
            return EMPTY
        held = self.namespaces.get(checkpoint_ns, EMPTY if self.complete else None)
        if held is None:
            return Underivable(f"namespace {checkpoint_ns!r} is not held")
        return held

    def answer(
        self, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None
    ) -> dict[str, Any] | Underivable | None:
        """The read API's tuple for the namespace's newest checkpoint, or for `checkpoint_id` (which must be
        it); None: no checkpoint."""
        held = self.namespace(checkpoint_ns)
        if isinstance(held, Underivable):
            return held
        return held.answer(thread_id, checkpoint_ns, checkpoint_id)


def view(namespaces: dict[str, Namespace | None], complete: bool, *, erased: bool = False) -> View:
    if len(namespaces) > MAX_NAMESPACES:
        namespaces = {name: ns for name, ns in namespaces.items() if ns is not None}
        complete = False
        while len(namespaces) > MAX_NAMESPACES:
            del namespaces[next(iter(namespaces))]  # the least recently changed
    size = 100 + sum(ns.size for ns in namespaces.values() if ns is not None)
    return View(namespaces, complete, erased, size)


UNKNOWN: Final = view({}, False)
"""Nothing known of the thread."""
NEW: Final = view({}, True)
"""A thread with no checkpoint in any namespace."""
ERASED: Final = view({}, True, erased=True)


def from_answer(
    checkpoint_ns: str,
    answer: Mapping[str, Any] | None,
    namespaces: Iterable[str] | None = None,
    later_writes: Mapping[str, Any] | None = None,
    ceilings: Mapping[str, int] | None = None,
) -> View:
    """The view a read API answer gives: the namespace's newest checkpoint (`answer`, None: none), the
    writes of newer checkpoints whose puts are still to come (`later_writes`), its blob rows' `ceilings`
    and, with `namespaces` (every namespace of the thread), that the others exist but are not held."""
    held: dict[str, Namespace | None] = dict.fromkeys(namespaces or (), None)
    held[checkpoint_ns] = namespace_of(answer, later_writes, ceilings)
    return view(held, namespaces is not None)


def namespace_of(
    answer: Mapping[str, Any] | None,
    later_writes: Mapping[str, Any] | None = None,
    ceilings: Mapping[str, int] | None = None,
) -> Namespace:
    """A namespace whose newest checkpoint is the read API's `answer` (a get of the newest)."""
    later = {cid: _in_saver_order(_write_row(w) for w in rows) for cid, rows in (later_writes or {}).items()}
    if answer is None:
        return namespace(None, later, {}, {}, True, ceilings)
    checkpoint = answer["checkpoint"]
    versions = {channel: str(v) for channel, v in (checkpoint.get("channel_versions") or {}).items()}
    cid = answer["config"]["checkpoint_id"]
    parent = answer.get("parent_config")
    stored = {
        channel: value
        for channel, value in (checkpoint.get("channel_values") or {}).items()
        if isinstance(value, dict) and ("t" in value or value.get("v") is not None)
    }
    row = Row(
        cid,
        parent["checkpoint_id"] if parent else None,
        versions,
        run_id_text((answer.get("metadata") or {}).get("run_id")),
        stored=stored,
        legacy=not isinstance(checkpoint.get("v"), int) or checkpoint["v"] < 4,
        answer={k: v for k, v in answer.items() if k != "pending_writes"},
    )
    values = checkpoint.get("channel_values") or {}
    blobs = {
        (channel, version): value if isinstance(value, dict) and "t" in value else NO_BLOB
        for channel, version in versions.items()
        for value in (values.get(channel),)
    }
    writes = tuple(_write_row(w) for w in answer.get("pending_writes") or ())
    return namespace(row, {**later, cid: writes} if writes else later, blobs, ceilings=ceilings)


def with_history(ns: Namespace, checkpoint_id: str, answered: Mapping[str, ChannelHistory]) -> Namespace:
    """`ns` knowing the read API's DeltaChannel history of its newest checkpoint for some channels."""
    if ns.newest is None or ns.newest.checkpoint_id != checkpoint_id:
        return ns
    history = dict(ns.history or {})
    for channel, entry in answered.items():
        writes = tuple(HistoryWrite(task_id, ch, value) for task_id, ch, value, *_ in entry.writes)
        history[channel] = History(entry.seed, writes)
    complete = ns.history is not None and ns.history_complete
    return namespace(ns.newest, ns.writes, ns.blobs, history, complete, ns.ceilings)


def _write_row(raw: Any) -> WriteRow:
    """A pending write of a read API answer (`[task_id, channel, value, task_path, idx]`)."""
    task_id, channel, value, task_path, idx = raw
    return WriteRow(task_id, channel, value, task_path, int(idx))


def apply(held: View, event: CheckpointEvent) -> View:
    """`view` after the projection applies `event`, one of the thread's records. What the view cannot
    follow becomes not held: the namespace (a put it cannot derive), or the whole thread."""
    if held.erased:
        return held
    match event:
        case CheckpointPut():
            return _in_namespace(held, event.checkpoint_ns, lambda ns: _put(ns, event))
        case CheckpointWrites():
            return _in_namespace(held, event.checkpoint_ns, lambda ns: _writes(ns, event))
        case ThreadDelete():
            return NEW
        case ThreadPrune():
            # keep_latest unlinks kept checkpoints from their dropped parents and drops whole subgraph
            # namespaces (projection/prune.py): the view does not follow it.
            return NEW if event.strategy == "delete" else UNKNOWN
        case RunsDelete():
            return _runs_deleted(held, frozenset(event.run_ids))
        case ThreadCopy():
            return held  # keyed by its source, which it does not change
        case ThreadCopyBarrier() | ThreadExpire():
            # A copy onto the thread needs the source's rows; an expiry, the thread's activity time.
            return UNKNOWN
        case ThreadErase() | TenantErase():
            return ERASED
        case _:
            assert_never(event)


def _in_namespace(held: View, checkpoint_ns: str, change: Callable[[Namespace], Namespace | Underivable]) -> View:
    ns = held.namespaces.get(checkpoint_ns, EMPTY if held.complete else None)
    if ns is None:
        return held  # not held: it stays so
    changed = change(ns)
    namespaces = {name: other for name, other in held.namespaces.items() if name != checkpoint_ns}
    # last: the most recently changed; one the change cannot derive is no longer held
    namespaces[checkpoint_ns] = None if isinstance(changed, Underivable) else changed
    return view(namespaces, held.complete)


def _put(ns: Namespace, event: CheckpointPut) -> Namespace | Underivable:
    newest = ns.newest
    if newest is not None and event.checkpoint_id < newest.checkpoint_id:
        # Not the newest: a read of the newest is unchanged, unless this put stores a value at a channel
        # version the newest names and the view holds no blob row of (puts of two writers can reach the
        # log out of order: the projection's answer of the newest then lacked the value this put brings).
        if _stores_missing_blob(ns, newest, event):
            return Underivable("an older checkpoint's put stores a value at a version the newest names")
        ceilings = _raised(ns.ceilings, event)
        if ceilings is ns.ceilings:
            return ns
        return namespace(newest, ns.writes, ns.blobs, ns.history, ns.history_complete, ceilings)
    checkpoint = orjson.loads(event.checkpoint_json)
    legacy = not isinstance(checkpoint.get("v"), int) or checkpoint["v"] < 4
    if legacy and event.parent_checkpoint_id and _sends_of(ns, event.parent_checkpoint_id):
        return Underivable("a checkpoint before format 4 is read with its parent's pending sends")
    versions = {channel: str(v) for channel, v in (checkpoint.get("channel_versions") or {}).items()}
    inline = checkpoint.get("channel_values") or {}
    repeated = newest is not None and event.checkpoint_id == newest.checkpoint_id
    parent_id = newest.parent_id if repeated and newest is not None else event.parent_checkpoint_id
    parent_versions = (
        newest.versions if newest is not None and newest.checkpoint_id == event.parent_checkpoint_id else None
    )
    new = {(b.channel, b.version): b for b in event.blobs}
    blobs: dict[tuple[str, str], Any] = {}
    for channel, version in versions.items():
        key = (channel, version)
        known, blob = ns.blobs.get(key), new.get(key)
        if known is not None and known is not NO_BLOB:
            blobs[key] = known  # a blob row is never replaced
        elif blob is not None:
            if known is None and _maybe_stored(ns.ceilings, channel, version):
                # The row another put may have stored there stays, and the view does not hold it.
                return Underivable(f"a blob row of channel {channel!r} at version {version} may be stored already")
            blobs[key] = typed(blob.type, blob.data or b"") if blob.type != "empty" else EMPTY_BLOB
        elif known is not None:
            blobs[key] = known
        elif event.new_channels is not None and channel in event.new_channels:
            blobs[key] = NO_BLOB  # this put's own, which it wrote no blob for (inline, or absent)
        elif _above(ns.ceilings, channel, version):
            blobs[key] = NO_BLOB  # no put stored a row at this version: the value is inline, or absent
        elif event.new_channels is None and (
            (parent_versions is not None and _newer(version, parent_versions.get(channel)))
            or (newest is None and event.parent_checkpoint_id is None)
        ):
            # A put recorded before its new channels were: a version newer than the parent's (LangGraph's
            # versions only grow), or any of the first checkpoint, is taken for this put's own. A version
            # a put names and does not call new names a blob row another put stored (a copy's, a
            # sibling's), or none: only the projection knows which, whatever the put holds inline.
            blobs[key] = NO_BLOB
        else:
            return Underivable(f"the value of channel {channel!r} at version {version} is not held")
    stored = {
        channel: _jsonb_inline(value) for channel, value in inline.items() if value is not None and value is not True
    }
    for (channel, _), value in blobs.items():
        if isinstance(value, dict):
            stored[channel] = value  # a blob wins over the inline marker
    run_id = run_id_text(orjson.loads(event.metadata_json).get("run_id"))
    row = Row(event.checkpoint_id, parent_id, versions, run_id, legacy=legacy, stored=stored, put=event)
    writes = {cid: rows for cid, rows in ns.writes.items() if cid >= event.checkpoint_id}
    ceilings = _raised(ns.ceilings, event)
    if repeated:
        return namespace(row, writes, blobs, ns.history, ns.history_complete, ceilings)
    history, complete = _child_history(ns, event.parent_checkpoint_id)
    return namespace(row, writes, blobs, history, complete, ceilings)


def _stores_missing_blob(ns: Namespace, row: Row, event: CheckpointPut) -> bool:
    """Whether another checkpoint's put stores a value at a channel version `row` names and the view holds
    no blob row of: the projection's blob rows are shared by every checkpoint naming the version, so
    `row`'s read then gains the value (puts of two writers reaching the log out of order, or a version
    whose row a delete dropped stored again)."""
    for stored_blob in event.blobs:
        channel, version = stored_blob.channel, stored_blob.version
        if stored_blob.type != "empty" and row.versions.get(channel) == version:
            if ns.blobs.get((channel, version)) in (None, NO_BLOB):
                return True
    return False


def _newer(version: str, parent: str | None) -> bool:
    """Whether `version` is later than the parent's version of the channel (None: the parent has none).
    Versions are compared as LangGraph makes them: integers, or zero-padded strings."""
    if parent is None:
        return True
    try:
        return float(version) > float(parent)  # integer (or float) versions
    except ValueError:
        return version > parent  # LangGraph's zero-padded `counter.random` strings


def _jsonb_inline(value: Any) -> dict[str, Any]:
    """An inline value as a read of its jsonb gives it back."""
    return {"v": jsonb_value(json.dumps(value)) if isinstance(value, float) else value}


def _child_history(ns: Namespace, parent_id: str | None) -> tuple[dict[str, History] | None, bool]:
    """The DeltaChannel history of a new newest checkpoint whose parent is `parent_id`: the walk from
    its parent stops there for the channels the parent stores, and goes on into the parent's own
    history for the others."""
    parent = ns.newest
    if parent is None:
        return ({}, True) if parent_id is None and ns.history_complete else (None, False)
    if parent.checkpoint_id != parent_id or ns.history is None:
        return None, False
    written: dict[str, list[HistoryWrite]] = {}
    for row in ns.writes.get(parent.checkpoint_id, ()):
        written.setdefault(row.channel, []).append(HistoryWrite(row.task_id, row.channel, row.value))
    complete = ns.history_complete
    history: dict[str, History] = {}
    for channel in {*ns.history, *parent.stored, *written}:
        own = tuple(written.get(channel, ()))
        if channel in parent.stored:
            history[channel] = History(parent.stored[channel], own)
        elif channel in ns.history:
            known = ns.history[channel]
            history[channel] = History(known.seed, known.writes + own)
        elif complete:
            history[channel] = History(None, own)
        if channel in history and len(history[channel].writes) > MAX_HISTORY_WRITES:
            del history[channel]
            complete = False
    return history, complete


def _sends_of(ns: Namespace, parent_id: str) -> bool:
    """Whether the official saver's migration of a pre-format-4 checkpoint would add its parent's pending
    sends (writes to `TASKS`): unknown unless the parent is the newest held."""
    if ns.newest is None or ns.newest.checkpoint_id != parent_id:
        return True
    return any(row.channel == TASKS for row in ns.writes.get(parent_id, ()))


def _writes(ns: Namespace, event: CheckpointWrites) -> Namespace | Underivable:
    cid = event.checkpoint_id
    newest = ns.newest
    if newest is not None and cid < newest.checkpoint_id:
        if newest.legacy and cid == newest.parent_id and any(w.channel == TASKS for w in event.writes):
            return Underivable("a pending send of the parent of a checkpoint before format 4 changes its read")
        if cid == newest.parent_id and ns.history is not None:
            # A late write of the parent is in the newest's DeltaChannel history: no longer held.
            late = {w.channel for w in event.writes}
            history = {channel: h for channel, h in ns.history.items() if channel not in late}
            return namespace(newest, ns.writes, ns.blobs, history, False, ns.ceilings)
        return ns  # writes of an older checkpoint: no read of the newest shows them
    rows = {(row.task_id, row.idx): row for row in ns.writes.get(cid, ())}
    for write in event.writes:
        key = (event.task_id, write.idx)
        row = WriteRow(event.task_id, write.channel, typed(write.type, write.data), event.task_path, write.idx)
        held = rows.get(key)
        if held is None:
            rows[key] = row
        elif event.upsert:  # the row keeps its task path; channel, type and value are replaced
            rows[key] = row._replace(task_path=held.task_path)
    writes = {**ns.writes, cid: _in_saver_order(rows.values())}
    if len(writes) > MAX_PENDING_CHECKPOINTS + 1:
        return Underivable(f"writes of more than {MAX_PENDING_CHECKPOINTS} checkpoints wait for their puts")
    return namespace(ns.newest, writes, ns.blobs, ns.history, ns.history_complete, ns.ceilings)


OPAQUE_RUN_ID: Final = object()
"""A metadata `run_id` whose text in Postgres the fold does not reproduce (a float, an object, a list)."""


def run_id_text(value: Any) -> object:
    """A metadata `run_id` as `runs.delete` matches it: the text of the projection's
    `metadata ->> 'run_id'` (None: no run id, never matched), or `OPAQUE_RUN_ID`."""
    match value:
        case None:
            return None
        case str():
            return value
        case bool():
            return "true" if value else "false"
        case int():
            return str(value)
        case _:
            return OPAQUE_RUN_ID


def _run_deleted(run_id: object, run_ids: Collection[str]) -> bool | None:
    """Whether `runs.delete` of `run_ids` drops a checkpoint of `run_id` (None: the fold cannot tell)."""
    return None if run_id is OPAQUE_RUN_ID else run_id in run_ids


def _runs_deleted(held: View, run_ids: frozenset[str]) -> View:
    """`runs.delete` drops the checkpoints whose metadata `run_id` it lists, with their writes: a
    namespace whose newest checkpoint it names is no longer held (its next newest is not), and one whose
    ancestors it may have dropped no longer knows its DeltaChannel history (the walk stops at a gap)."""
    namespaces: dict[str, Namespace | None] = {}
    for name, ns in held.namespaces.items():
        if ns is not None and ns.newest is not None and _run_deleted(ns.newest.run_id, run_ids) is not False:
            namespaces[name] = None
        elif ns is not None and ns.history is not None:
            namespaces[name] = namespace(ns.newest, ns.writes, ns.blobs, ceilings=ns.ceilings)
        else:
            namespaces[name] = ns
    return view(namespaces, held.complete)


def apply_to_checkpoint(held: View, event: CheckpointEvent, checkpoint_ns: str, checkpoint_id: str) -> View:
    """`held`, a view of one checkpoint that need not be its namespace's newest (`from_answer` of a get by
    id), after the projection applies `event`: a read of that checkpoint answers from the result. Its
    own put and writes change it; a delete empties the thread; `runs.delete` drops it if it names
    its run; what else could drop or change it (a prune `keep_latest`, a copy onto the thread, an expiry,
    a pending send of a checkpoint before format 4, another put storing a value at a version it names
    and holds no blob row of) makes it not held."""
    if held.erased:
        return held
    ns = held.namespace(checkpoint_ns)
    if isinstance(ns, Underivable):
        return held
    row = ns.newest
    match event:
        case CheckpointPut() | CheckpointWrites():
            if (event.checkpoint_ns, event.checkpoint_id) == (checkpoint_ns, checkpoint_id):
                return apply(held, event)
            if row is not None and row.legacy and isinstance(event, CheckpointWrites):
                return UNKNOWN  # a pending send of its parent changes its read
            if row is not None and isinstance(event, CheckpointPut) and event.checkpoint_ns == checkpoint_ns:
                return UNKNOWN if _stores_missing_blob(ns, row, event) else held
            return held
        case ThreadDelete():
            return NEW
        case ThreadPrune(strategy="delete"):
            return NEW
        case RunsDelete():
            if row is None:
                return held
            deleted = _run_deleted(row.run_id, event.run_ids)
            if deleted:
                return view({checkpoint_ns: NOT_FOUND}, False)  # dropped: a read of it finds nothing
            return UNKNOWN if deleted is None or row.legacy else held
        case ThreadPrune() | ThreadCopyBarrier() | ThreadExpire():
            return UNKNOWN
        case ThreadCopy():
            return held
        case ThreadErase() | TenantErase():
            return ERASED
        case _:
            assert_never(event)


def fold_to_checkpoint(
    newest: View, events: Iterable[CheckpointEvent], checkpoint_ns: str, checkpoint_id: str
) -> View | Underivable:
    """The view of one checkpoint that `newest` (a view of its thread, as of before `events`) does not
    hold, after `events`: they fold into `newest` until the checkpoint is its namespace's newest, and
    from then on only what changes it does (`apply_to_checkpoint`). A checkpoint never put has no
    answer; one put without becoming the newest (an older id), or put while the namespace was not held,
    is `Underivable`."""
    held, one = newest, None
    lost = put = False
    for event in events:
        if one is not None:
            one = apply_to_checkpoint(one, event, checkpoint_ns, checkpoint_id)
            continue
        if isinstance(event, CheckpointPut) and (event.checkpoint_ns, event.checkpoint_id) == (
            checkpoint_ns,
            checkpoint_id,
        ):
            put = True
        held = apply(held, event)
        ns = held.namespace(checkpoint_ns)
        if isinstance(ns, Underivable):
            lost = True
            continue
        row = ns.newest
        if row is not None and row.checkpoint_id == checkpoint_id:
            one = held
    if one is not None:
        return one
    if lost or put:
        return Underivable(f"checkpoint {checkpoint_id} was never the newest held")
    return view({checkpoint_ns: NOT_FOUND}, False)
