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

The views (`thread_view.py`, whose names this module gives too: `thread.View`, `thread.NEW`, ...) are
immutable: applying an event returns a new view, so a reader's snapshot never changes under it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any, assert_never

import orjson
from langgraph.checkpoint.serde.types import TASKS

from graphledger import ownership
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
from graphledger.folds.thread_view import (
    COUNTER_DIGITS,
    EMPTY,
    EMPTY_BLOB,
    ERASED,
    MAX_HISTORY_WRITES,
    MAX_NAMESPACES,
    MAX_PENDING_CHECKPOINTS,
    NEW,
    NO_BLOB,
    NOT_FOUND,
    OPAQUE_RUN_ID,
    UNCOUNTED,
    UNKNOWN,
    History,
    HistoryWrite,
    Namespace,
    Row,
    Underivable,
    View,
    WriteRow,
    _in_saver_order,
    basis_of,
    from_answer,
    ledger_of,
    namespace,
    namespace_of,
    run_id_text,
    version_counter,
    view,
    with_history,
)
from graphledger.jsonb import jsonb_value
from graphledger.ownership import COUNTED, Counted, Ledger, Refused, Verdict
from graphledger.wire import typed


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


def apply(held: View, event: CheckpointEvent, verdict: Verdict | None = None) -> View:
    """`view` after the projection applies `event`, one of the thread's records. What the view cannot
    follow becomes not held: the namespace (a put it cannot derive), or the whole thread. A put or writes
    the one-writer rule refuses changes nothing (but a refused put's writes, which go with it); `verdict`:
    the rule's verdict as its writer learned it, for a view that does not know the rule's state."""
    if held.erased:
        return held
    ledger = held.ledger
    match event:
        case CheckpointPut() | CheckpointWrites():
            return _data(held, event, verdict)
        case ThreadDelete():
            return _emptied(NEW, ledger)
        case ThreadPrune():
            # keep_latest unlinks kept checkpoints from their dropped parents and drops whole subgraph
            # namespaces (projection/prune.py): the view does not follow it. It keeps each namespace's newest,
            # so the rule's state stays.
            return _emptied(NEW, ledger) if event.strategy == "delete" else _with_ledger(UNKNOWN, ledger)
        case RunsDelete():
            return _runs_deleted(held, frozenset(event.run_ids))
        case ThreadCopy():
            return held  # keyed by its source, which it does not change
        case ThreadCopyBarrier() | ThreadExpire():
            # A copy onto the thread needs the source's rows; an expiry, the thread's activity time.
            return _emptied(UNKNOWN, ledger)
        case ThreadErase() | TenantErase():
            return ERASED
        case _:
            assert_never(event)


def _data(held: View, event: CheckpointPut | CheckpointWrites, verdict: Verdict | None) -> View:
    """A put or writes, as the one-writer rule decides it from the view's ledger, or as `verdict` says (its
    writer's own verdict, for a view that does not know the ledger)."""
    name, ledger = event.checkpoint_ns, held.ledger
    intent = None if event.intent is None else ownership.parsed(event.intent)
    if intent is not None and ledger is not None and not _holds(held, name):
        return held  # a protected write of a namespace whose lead the view does not know changes only that lead
    after = ledger
    if ledger is not None:
        if isinstance(event, CheckpointPut):
            run = run_of(event) if intent is not None else None
            after, verdict = ownership.put(ledger, name, intent, run, event.checkpoint_id)
        else:
            verdict = ownership.writes(ledger, name, intent, event.checkpoint_id)
    elif intent is None:
        verdict = COUNTED
    match verdict:
        case None:  # it carries an intent and the view knows neither the ledger nor its verdict
            return _in_namespace(held, name, lambda ns: Underivable("the verdict of a write is not known here"))
        case Counted():
            if isinstance(event, CheckpointPut):
                return _with_ledger(_in_namespace(held, name, lambda ns: _put(ns, event)), after)
            return _in_namespace(held, name, lambda ns: _writes(ns, event))
        case Refused():
            if isinstance(event, CheckpointPut):
                return _in_namespace(held, name, lambda ns: _without_writes_of(ns, event.checkpoint_id))
            return held
        case _:
            assert_never(verdict)


def _ledger_after_put(held: View, event: CheckpointPut) -> Ledger[str] | None:
    """The view's ledger after a put it holds nothing else of (None: the view knows no ledger)."""
    ledger = held.ledger
    intent = None if event.intent is None else ownership.parsed(event.intent)
    if ledger is None or (intent is not None and not _holds(held, event.checkpoint_ns)):
        return ledger
    run = run_of(event) if intent is not None else None
    return ownership.put(ledger, event.checkpoint_ns, intent, run, event.checkpoint_id)[0]


def verdict(held: View, event: CheckpointPut | CheckpointWrites) -> Verdict | None:
    """The one-writer rule's verdict of `event` if it came next after the records the view reflects (None:
    the view does not know the rule's state of its namespace)."""
    intent = None if event.intent is None else ownership.parsed(event.intent)
    if intent is None:
        return COUNTED
    ledger = held.ledger
    if held.erased or ledger is None or not _holds(held, event.checkpoint_ns):
        return None
    if isinstance(event, CheckpointPut):
        return ownership.put(ledger, event.checkpoint_ns, intent, checkpoint_id=event.checkpoint_id)[1]
    return ownership.writes(ledger, event.checkpoint_ns, intent, event.checkpoint_id)


def _holds(held: View, checkpoint_ns: str) -> bool:
    """Whether the view holds the namespace, and so knows its lead."""
    return held.namespaces.get(checkpoint_ns, EMPTY if held.complete else None) is not None


def _without_writes_of(ns: Namespace, checkpoint_id: str) -> Namespace:
    """`ns` without the writes of a checkpoint whose put the rule refused (written before their put)."""
    if checkpoint_id not in ns.writes or (ns.newest is not None and checkpoint_id <= ns.newest.checkpoint_id):
        return ns
    writes = {cid: rows for cid, rows in ns.writes.items() if cid != checkpoint_id}
    return namespace(ns.newest, writes, ns.blobs, ns.history, ns.history_complete, ns.ceilings)


def _with_ledger(held: View, ledger: Ledger[str] | None) -> View:
    if held.ledger is ledger or held.erased:
        return held
    return View(held.namespaces, held.complete, held.erased, held.size, ledger)


def _emptied(base: View, ledger: Ledger[str] | None) -> View:
    """`base` (a thread emptied, or no longer followed) after a thread operation: one more operation."""
    return _with_ledger(base, None if ledger is None else ownership.operation(ledger))


def run_of(event: CheckpointPut) -> object:
    """The metadata `run_id` of a put as `runs.delete` matches it (`run_id_text`)."""
    return run_id_text(orjson.loads(event.metadata_json).get("run_id"))


def _in_namespace(held: View, checkpoint_ns: str, change: Callable[[Namespace], Namespace | Underivable]) -> View:
    ns = held.namespaces.get(checkpoint_ns, EMPTY if held.complete else None)
    if ns is None:
        return held  # not held: it stays so
    changed = change(ns)
    namespaces = {name: other for name, other in held.namespaces.items() if name != checkpoint_ns}
    # last: the most recently changed; one the change cannot derive is no longer held
    namespaces[checkpoint_ns] = None if isinstance(changed, Underivable) else changed
    return view(namespaces, held.complete, ledger=held.ledger)


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
            # This put's own, which it wrote no blob for (inline, or absent): a row another put stored at the
            # version answers instead, as it does the official saver's read (its "empty" row stays out).
            if _maybe_stored(ns.ceilings, channel, version):
                return Underivable(f"a blob row of channel {channel!r} at version {version} may be stored already")
            blobs[key] = NO_BLOB
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
    # A lead of a deleted run opens its namespace and counts an operation: knowable when every namespace of
    # the thread with a lead is held.
    ledger = held.ledger
    every_held = held.complete and all(ns is not None for ns in held.namespaces.values())
    after = ownership.runs_deleted(ledger, run_ids) if ledger is not None and every_held else None
    return view(namespaces, held.complete, ledger=after)


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
            if isinstance(event, CheckpointWrites):
                return held
            if row is not None and event.checkpoint_ns == checkpoint_ns and _stores_missing_blob(ns, row, event):
                return UNKNOWN
            return _with_ledger(held, _ledger_after_put(held, event))  # another put moves the rule's state
        case ThreadDelete() | ThreadPrune(strategy="delete"):
            return _emptied(NEW, held.ledger)
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


# The fold and the view it folds into, under one name (`thread_view.py` holds the view's types).
__all__ = [
    "COUNTER_DIGITS",
    "EMPTY",
    "EMPTY_BLOB",
    "ERASED",
    "MAX_HISTORY_WRITES",
    "MAX_NAMESPACES",
    "MAX_PENDING_CHECKPOINTS",
    "NEW",
    "NOT_FOUND",
    "NO_BLOB",
    "OPAQUE_RUN_ID",
    "UNCOUNTED",
    "UNKNOWN",
    "History",
    "HistoryWrite",
    "Namespace",
    "Row",
    "Underivable",
    "View",
    "WriteRow",
    "apply",
    "apply_to_checkpoint",
    "basis_of",
    "fold_to_checkpoint",
    "from_answer",
    "ledger_of",
    "namespace",
    "namespace_of",
    "run_id_text",
    "verdict",
    "version_counter",
    "view",
    "with_history",
]
