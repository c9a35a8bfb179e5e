"""A thread as a reader holds it, immutable: per namespace the newest checkpoint (`Row`), the writes of it and
of newer checkpoints whose put has not come yet, what is known of its blob rows and its DeltaChannel history
(`Namespace`), and the thread's namespaces (`View`). Made from a read API answer (`from_answer`) or by the
fold (`thread.py`), through which every other module reaches these names.

A view holds per namespace the newest checkpoint, the writes of it and of any newer checkpoint whose
put has not come yet (writes can reach the log before their put), what is known of the channel
versions it references, and the DeltaChannel history of the newest checkpoint: per channel, the seed
and writes `get_delta_channel_history` walks to from its parent, carried forward put by put (a
channel the parent stores starts again from that value) and learned from the read API where unknown.
Values stay opaque, in the read API's wire form (`wire.py`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

import ormsgpack
from langgraph.checkpoint.base import writes_sort_key

from graphledger.answers import Basis, ChannelHistory
from graphledger.events.checkpoint import (
    CheckpointPut,
)
from graphledger.jsonb import jsonb_value
from graphledger.ownership import Ledger


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
    ledger: Ledger[str] | None = None
    """What the one-writer rule holds of the thread (`graphledger.ownership`): its operation count, and the
    lead of each namespace the view holds (one it holds without a lead there is open); None: not known, so
    a write carrying an intent cannot be decided here."""

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


def view(
    namespaces: dict[str, Namespace | None],
    complete: bool,
    *,
    erased: bool = False,
    ledger: Ledger[str] | None = None,
) -> View:
    if len(namespaces) > MAX_NAMESPACES:
        namespaces = {name: ns for name, ns in namespaces.items() if ns is not None}
        complete = False
        while len(namespaces) > MAX_NAMESPACES:
            del namespaces[next(iter(namespaces))]  # the least recently changed
    size = 100 + sum(ns.size for ns in namespaces.values() if ns is not None)
    return View(namespaces, complete, erased, size, ledger)


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
    basis: Basis | None = None,
) -> View:
    """The view a read API answer gives: the namespace's newest checkpoint (`answer`, None: none), the
    writes of newer checkpoints whose puts are still to come (`later_writes`), its blob rows' `ceilings`,
    with `namespaces` (every namespace of the thread) that the others exist but are not held, and with
    `basis` what the one-writer rule held of the thread then."""
    held: dict[str, Namespace | None] = dict.fromkeys(namespaces or (), None)
    held[checkpoint_ns] = namespace_of(answer, later_writes, ceilings)
    head = answer["config"]["checkpoint_id"] if answer is not None else None
    ledger = None if basis is None else ledger_of(checkpoint_ns, basis, head)
    return view(held, namespaces is not None, ledger=ledger)


def ledger_of(checkpoint_ns: str, basis: Basis, head_id: str | None) -> Ledger[str]:
    """The rule's state a read API answer's `basis` gives of its thread, namespace `checkpoint_ns` held, whose
    newest checkpoint is `head_id` (a namespace with a lead has it newest)."""
    lead_id = basis.lead_id if basis.lead_id is not None else head_id
    if basis.lead is None or lead_id is None:
        return Ledger(basis.operations)
    ns = checkpoint_ns
    writers = {ns: basis.lead_writer} if basis.lead_writer else {}
    return Ledger(basis.operations, {ns: basis.lead}, {ns: basis.lead_run}, {ns: lead_id}, writers)


def basis_of(held: View, checkpoint_ns: str) -> Basis | None:
    """What the rule holds of the view's thread for a read of `checkpoint_ns` (None: not known)."""
    ledger = held.ledger
    if ledger is None:
        return None
    run = ledger.lead_runs.get(checkpoint_ns)
    lead_id, writer = ledger.lead_ids.get(checkpoint_ns), ledger.lead_writers.get(checkpoint_ns)
    return Basis(ledger.operations, ledger.lead(checkpoint_ns), run if isinstance(run, str) else None, lead_id, writer)


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
