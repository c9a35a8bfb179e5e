"""A key's unprojected records, opened and decoded as the projector does, for a read to fold them.

A read of a thread (or of a store item) that finds records of its key the projection has not applied
(`read_barrier.Settled.tail`) answers at the log's end without waiting: the projection's answer as of
its applied offset `a` on the key's partition (read in the same snapshot as `a`), and the key's
records in `[a, end)`, folded as the projector applies them (`graphledger.folds.thread` for a thread,
`folds.store_item` for an item). This module turns those records into events exactly as a projector batch
would: the data keys of sealed ones loaded first (`keys/lookup.py`), each record classified
(`opening/records.py`), chunks reassembled at the chunk that completes their event. A fresh key a
record opened with while bound to no subject is bound here as the projector binds it
(`opening/binding.py`: only by a record that opened with it, outside any transaction): the key
store's first binding decides for every reader, so what is folded here is what the projector applies.
What the projector would not apply is left out: dead letters, records of erased subjects (the key cache
asks the key store again when an erasure record is read: `erasure`), except for the erasure such a
record stands for, which the projector applies there (`records.erasure_at`). Whatever the read cannot
know from the records it holds is `thread.Underivable`, a result the read matches, and it waits for the
projection instead (`ReadBarrier.wait`):
- an erasure of the thread or its tenant (anyone can publish one: the projection decides);
- a record from a newer graphledger (the projector parks the record's subject there, and the read then
  fails `subject_parked`: `read_barrier.py`);
- a chunked event whose chunks are not all held (some went to the projection's chunk table);
- the key store not answering for a sealed record's key, or for the binding of a fresh key.
Decoding is kept per record (`Unprojected.note`), so each record is opened once while it is held.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, assert_never

from graphledger.errors import InvalidEventError, UnknownEventVersionError
from graphledger.events import checkpoint_event, envelope, store_event
from graphledger.events.checkpoint import (
    CHECKPOINT_EVENT_TYPES,
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
from graphledger.events.envelope import HEADER_CHUNK
from graphledger.events.erasure import NamespaceErase, TenantErase, ThreadErase
from graphledger.folds import thread
from graphledger.folds.views import ViewLru
from graphledger.log.records import LogRecord, Tail
from graphledger.opening.records import (
    Chunk,
    Classified,
    DeadLetter,
    Decoded,
    Erased,
    Opened,
    TooNew,
    erasure_at,
    unwrapped,
)
from graphledger.tenancy import THREAD_SEPARATOR
from graphledger_server.api.consistency.unprojected import Unprojected
from graphledger_server.opening.opener import RecordOpener

log = logging.getLogger(__name__)
T = TypeVar("T")

ERASURE_WAITS = "an erasure of the thread or its tenant: the projection applies it once the key store has it"
"""Why a read of a thread whose tail holds its erasure waits (`thread_events_to_fold`): anyone may publish one."""


class TailEvents:
    """A read's events from the unprojected records it holds, opened as the projector opens them
    (`opening/opener.py`), each record once while it is held (one per read API process)."""

    def __init__(self, unprojected: Unprojected, opener: RecordOpener) -> None:
        self._unprojected = unprojected
        self.opener = opener

    async def events(self, tail: Tail, since: int) -> list[tuple[int, Any]] | thread.Underivable:
        """`(offset, event)` of the projection's events (its `to_event`'s, with their time) among
        `tail`'s records at or after `since`, in log order (a chunked event at its completing chunk)."""
        # Before `since` only chunks matter (one may complete its event at or after it): nothing else
        # there is opened.
        records = [r for r in tail.records if r.offset >= since or envelope.header(r.headers, HEADER_CHUNK)]
        noted: list[Classified | None] = [self._unprojected.note(r) for r in records]
        new = [r for r, note in zip(records, noted, strict=True) if note is None]
        opening = await self._keyed(self.opener.open(new))
        if isinstance(opening, thread.Underivable):
            return opening
        opened = iter(opening)
        classified: list[Classified] = []
        for record, note in zip(records, noted, strict=True):
            if note is None:
                note = next(opened)
                self._unprojected.set_note(record, note)  # kept once its key is settled
            classified.append(note)
        out: list[tuple[int, Any]] = []
        parts: dict[str, dict[int, LogRecord]] = {}
        finished: set[str] = set()
        for record, item in zip(records, classified, strict=True):
            admitted: list[tuple[int, Any]] | thread.Underivable = []
            match item:
                case Chunk():
                    event_id = item.ref.event_id
                    if event_id in finished:
                        continue  # a duplicate of a chunk of an event already complete
                    got = parts.setdefault(event_id, {})
                    got.setdefault(item.ref.index, record)
                    if len(got) < item.ref.count:
                        continue
                    if record.offset >= since:
                        values = {i: r.value or b"" for i, r in got.items()}
                        event = await self._keyed(self.opener.reassembled_and_bound(item, values))
                        admitted = event if isinstance(event, thread.Underivable) else self._admitted(event, since)
                    del parts[event_id]
                    finished.add(event_id)
                case Decoded() | DeadLetter() | Erased() | TooNew():
                    admitted = self._admitted(item, since)
                case _:
                    assert_never(item)
            if isinstance(admitted, thread.Underivable):
                return admitted
            out.extend(admitted)
        if any(max(r.offset for r in got.values()) >= since for got in parts.values()):
            return thread.Underivable("a chunked event's chunks are not all held (some are in the chunk table)")
        return out

    def erasure(self, record: LogRecord) -> None:
        """An erasure record was read (`Unprojected`'s `on_erasure`): what is held of its subject's keys
        is dropped, so no record after it opens with a key the key store no longer answers. Anyone may
        publish an erasure record, so the key store decides: for a recorded erasure it answers the
        subject erased (the eraser records it before publishing), for a forged one the key as before.
        One that does not decode is a dead letter to the projector too, and changes nothing."""
        try:
            env = envelope.decode(record.value)
            event = (checkpoint_event if env.type in CHECKPOINT_EVENT_TYPES else store_event)(env)
        except (InvalidEventError, UnknownEventVersionError):
            return
        match event:
            case ThreadErase() | NamespaceErase():
                self.opener.keys.forget(event.ref)
            case TenantErase():
                self.opener.keys.forget_tenant(event.tenant)
            case _:
                pass  # not an erasure after all (its header said otherwise): nothing to forget

    def unread(self) -> None:
        """A partition is read on from the projection's applied offset (`Unprojected`'s `on_unread`): an
        erasure below it was never read here, so no key held from before opens a record after it."""
        self.opener.keys.forget_all()

    def _admitted(self, item: Opened, since: int) -> list[tuple[int, Any]] | thread.Underivable:
        match item:
            case Decoded():
                if item.record.offset < since:
                    return []
                if item.subject is not None and self.opener.keys.is_erased(item.subject):
                    return self._erasure(Erased(item.record, item.subject.ref, None, item.subject.kind))
                return [(item.record.offset, item.event)]
            case DeadLetter():
                return []  # the projector dead-letters it: no effect
            case Erased():
                return [] if item.record.offset < since else self._erasure(item)
            case TooNew():
                if item.record.offset < since:
                    return []
                return thread.Underivable(f"a record from a newer graphledger: {item.reason}")
            case _:
                assert_never(item)

    def _erasure(self, erased: Erased) -> list[tuple[int, Any]]:
        """The erasure a record of an erased subject stands for, where the projector applies it."""
        event = erasure_at(erased, self.opener.to_event(erased.record.topic))
        return [] if event is None else [(erased.record.offset, event)]

    @staticmethod
    async def _keyed(opening: Awaitable[T]) -> T | thread.Underivable:
        """What `opening` opens, unless the key store does not answer (the projector cannot apply those
        records either)."""
        try:
            return await opening
        except Exception as exc:
            log.warning("read-through could not load or bind data keys (%s); the read waits for the projection", exc)
            return thread.Underivable(f"the key store did not answer: {type(exc).__name__}")


def thread_events(
    events: Sequence[tuple[int, Any]], stored_thread_id: str, ref: str
) -> list[CheckpointEvent] | thread.Underivable:
    """The events among a thread key's records that concern the thread: a record keyed like it but
    naming another thread (a hash collision, a hostile producer) changes another thread's rows."""
    mine: list[CheckpointEvent] = []
    for _, timed in events:
        event = unwrapped(timed)
        match event:
            case CheckpointPut() | CheckpointWrites() | ThreadDelete() | ThreadPrune() | ThreadExpire():
                if event.thread_id == stored_thread_id:
                    mine.append(event)
            case ThreadCopy():
                pass  # keyed by its source, which it does not change
            case ThreadCopyBarrier():
                if event.target_thread_id == stored_thread_id:
                    mine.append(event)
            case RunsDelete():
                mine.append(event)
            case ThreadErase():
                if event.ref == ref:
                    mine.append(event)
            case TenantErase():
                if stored_thread_id.startswith(event.tenant + THREAD_SEPARATOR):
                    mine.append(event)
            case _:
                return thread.Underivable(f"an event {type(event).__name__} among a thread's records")
    return mine


def thread_events_to_fold(
    events: Sequence[tuple[int, Any]], stored_thread_id: str, ref: str
) -> list[CheckpointEvent] | thread.Underivable:
    """`thread_events`, for a read: an erasure among them makes the read wait for the projection, which
    applies it only once the key store recorded it (the fold trusts the erasures it is given)."""
    mine = thread_events(events, stored_thread_id, ref)
    if not isinstance(mine, thread.Underivable) and any(isinstance(e, ThreadErase | TenantErase) for e in mine):
        return thread.Underivable(ERASURE_WAITS)
    return mine


VIEWS_MAX_BYTES = 64 * 1024 * 1024
"""Most bytes of folded thread views a read API process keeps (`thread.View.size`)."""


@dataclass(frozen=True, slots=True)
class KeptView:
    """A thread as of an offset of its partition: every record of it below `through` folded in."""

    partition: int
    through: int
    view: thread.View


class ThreadViews:
    """The views the last reads of threads folded, least recently used first out, by record key.

    The log does not change, so a thread's view as of an offset stays its view as of that offset: the
    next read of the thread folds only the records since onto it, and reads neither the projection nor
    the records before (while the read API still holds the records since: `Unprojected`)."""

    def __init__(self, max_bytes: int = VIEWS_MAX_BYTES) -> None:
        self._views: ViewLru[bytes, KeptView] = ViewLru(max_bytes, lambda kept: kept.view.size)

    def usable(self, key: bytes, tail: Tail | None, partition: int) -> KeptView | None:
        """The thread's view, if the records since it are all in `tail` (or, without one, may be)."""
        kept = self._views.peek(key)
        if kept is None or kept.partition != partition:
            return None
        if tail is not None and not tail.start <= kept.through <= tail.end:
            return None
        return self._views.get(key)

    def keep(self, key: bytes, kept: KeptView) -> None:
        """Keep `kept` unless a view as of a later offset is kept already."""
        known = self._views.peek(key)
        if known is not None and known.partition == kept.partition and known.through > kept.through:
            return
        self._views.put(key, kept)
