"""What a client process holds of each thread: one owner, one immutable snapshot per read.

A thread is held once a read of it came back from the read API, or once this process wrote to it.
What is held (`Held`) is a `thread.View` of the thread and the log position it is current through:
the view reflects every record of the thread below `through` on its partition, and this process's
own records since, folded in as each was acknowledged. The own records at or after `through` are
kept too, because a read that has to ask the read API names them and folds them onto its answer.

A read takes the thread's `Held` as it is when the read begins and never sees it change: a new
acknowledgement, an eviction or another read replaces the entry, never the object. So a read cannot
see half an eviction or half a trim (docs/architecture.md, "Consistency"). Its answer is:
- local, when the log shows no record of the thread since `through` but this process's own
  (`advance`): the view is then current through the log's end, and the own records below it are
  forgotten, so a conversation of any length holds one turn's records;
- the read API's, otherwise: the read API answers at the log's end, waiting for (or folding) every
  other record, and the client folds its own records the answer lacks (`install`).

Bounded by bytes: beyond `max_bytes` the least recently used threads are forgotten whole; a thread
not held is read from the read API, which then waits for the thread's records like any other
process's. A snapshot taken before an eviction stays whole; the read that holds it simply does not
put its result back.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from graphledger.answers import ChannelHistory
from graphledger.events.checkpoint import CheckpointEvent, CheckpointPut, CheckpointWrites
from graphledger.folds import thread
from graphledger.folds.views import ViewLru
from graphledger.ownership import Verdict

DEFAULT_MAX_BYTES = 64 * 1024 * 1024
"""Most bytes of thread state a client holds (the `client_thread_memory_bytes` setting's default)."""
MAX_RECENT_RECORDS = 4096
"""Own records a client remembers per partition, of every thread, to tell a tail of only its own records
from its offsets alone."""
MAX_NAMED_RECORDS = 256
"""Most own records a read names to the read API; with more, the read waits for the projection."""
_OWN_RECORD_BYTES = 64
"""What one own record counts against the bound besides its event's values."""


class Own(NamedTuple):
    """One of this process's own events of a thread, acknowledged."""

    offsets: tuple[int, ...]
    """Its records' offsets (more than one when chunked)."""
    event: CheckpointEvent

    @property
    def last(self) -> int:
        """The offset of its last record, where the event is complete in the log."""
        return self.offsets[-1]


@dataclass(slots=True)
class _Sending:
    """A thread's events on their way to the log: how many, and what a read waiting for them awaits."""

    count: int = 0
    settled: asyncio.Future[None] | None = None


_epochs = itertools.count(1)


@dataclass(frozen=True, slots=True)
class Held:
    """One thread as this process holds it. Immutable: a read's snapshot."""

    epoch: int
    """Which holding this is: a thread forgotten and held again gets a new epoch."""
    partition: int
    through: int | None
    """The view reflects every record of the thread below this offset of `partition`; None: only the
    own records since the thread was held are known (the view is `thread.UNKNOWN` for others)."""
    view: thread.View
    own: tuple[Own, ...]
    """Own records at or after `through` (all since the thread was held, when `through` is None)."""
    own_size: int
    """What `own` counts against the bound."""

    @property
    def size(self) -> int:
        return self.view.size + self.own_size

    @property
    def local(self) -> bool:
        """Whether a look at the log since `through` can decide a read."""
        return self.through is not None

    @property
    def own_offsets(self) -> frozenset[int]:
        """The offsets of every record of `own`."""
        return frozenset(o for offsets, _ in self.own for o in offsets)

    def named(self) -> frozenset[int] | None:
        """The own records a read of the read API names (None: too many to name)."""
        offsets = self.own_offsets
        return offsets if len(offsets) <= MAX_NAMED_RECORDS else None

    def own_since(self, offset: int) -> list[Own]:
        return [own for own in self.own if own.last >= offset]


class Acked(NamedTuple):
    """What the process's view of a thread decides of its own put or writes (`HeldThreads.acked`)."""

    verdict: Verdict
    """The one-writer rule's verdict, if no other writer's record of the thread lies in `[unknown, at)`."""
    unknown: int
    """The first offset the process's own records do not account for (`at`: every one)."""
    at: int
    """The event's last record's offset: a chunked event takes its place in the log at its last chunk."""

    @property
    def settled(self) -> bool:
        """Whether the process's own records account for every record before the event."""
        return self.unknown >= self.at


class HeldThreads:
    """Every thread a client holds, least recently used first. On the client's event loop only."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self._threads: ViewLru[str, Held] = ViewLru(max_bytes, lambda held: held.size)
        self._recent: dict[int, OrderedDict[int, str | None]] = {}
        """Per partition, this process's latest records, of every thread: offset -> thread (None: a
        record of every thread, `runs.delete`)."""
        self._sending: dict[str, _Sending] = {}
        """Per thread, this process's events sent and not acknowledged yet."""

    def __len__(self) -> int:
        return len(self._threads)

    @property
    def size(self) -> int:
        return self._threads.size

    @property
    def max_bytes(self) -> int:
        return self._threads.max_bytes

    @max_bytes.setter
    def max_bytes(self, max_bytes: int) -> None:
        self._threads.max_bytes = max_bytes

    def sending(self, thread_id: str) -> None:
        """An event of the thread goes to the log; `sent` once it is acknowledged or failed."""
        self._sending.setdefault(thread_id, _Sending()).count += 1

    def sent(self, thread_id: str) -> None:
        entry = self._sending[thread_id]
        entry.count -= 1
        if not entry.count:
            del self._sending[thread_id]
            if entry.settled is not None and not entry.settled.done():
                entry.settled.set_result(None)

    async def settled(self, thread_id: str) -> None:
        """Return once none of this process's events of the thread is on its way to the log: a read waits
        for them, so that its look at the log finds them acknowledged (own), not another writer's."""
        entry = self._sending.get(thread_id)
        if entry is None:
            return
        if entry.settled is None:
            entry.settled = asyncio.get_running_loop().create_future()
        await asyncio.shield(entry.settled)

    def get(self, thread_id: str) -> Held | None:
        """The thread's snapshot, marked as recently used."""
        return self._threads.get(thread_id)

    def peek(self, thread_id: str) -> Held | None:
        """The thread's snapshot, its place in the eviction order left as it is."""
        return self._threads.peek(thread_id)

    def before_newest(self, thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> bool:
        """Whether `checkpoint_id` is newer than the namespace's newest checkpoint held (not held: False)."""
        held = self._threads.peek(thread_id)
        if held is None or held.view.erased:
            return False
        ns = held.view.namespaces.get(checkpoint_ns, thread.EMPTY if held.view.complete else None)
        if ns is None:
            return False
        return ns.newest is None or checkpoint_id > ns.newest.checkpoint_id

    def clear(self) -> None:
        self._threads.clear()

    def forget(self, thread_id: str) -> None:
        self._threads.pop(thread_id)

    def unchanged_by_others(self, thread_id: str, snapshot: Held, end: int) -> bool:
        """Whether every record of the snapshot's partition in `[through, end)` is this process's, and
        those of the thread are the snapshot's own: the offsets decide, without the records' keys."""
        return snapshot.through is not None and self.first_unknown(thread_id, snapshot, end) >= end

    def first_unknown(self, thread_id: str, snapshot: Held, end: int | None = None) -> int:
        """The first offset from the snapshot's `through` (up to `end`) that its offsets alone cannot
        clear: a record that is not this process's, or one of the thread's that is not the snapshot's own.
        A look at the log needs only the records from there."""
        assert snapshot.through is not None
        recent: Mapping[int, str | None] = self._recent.get(snapshot.partition, {})
        own = snapshot.own_offsets
        offset = snapshot.through
        while (end is None or offset < end) and offset in recent:
            if recent[offset] in (thread_id, None) and offset not in own:
                break  # the thread's, but not in the snapshot: held anew since
            offset += 1
        return offset

    def _unknown_before(self, thread_id: str, held: Held, offsets: tuple[int, ...]) -> int:
        """`first_unknown` up to an own event's last record, where every reader completes a chunked event: its
        chunks account for the offsets between them only when nothing else lies there."""
        unknown = self.first_unknown(thread_id, held, offsets[0])
        contiguous = offsets[-1] - offsets[0] == len(offsets) - 1
        return offsets[-1] if unknown >= offsets[0] and contiguous else unknown

    def _remember(self, partition: int, offsets: tuple[int, ...], thread_id: str | None) -> None:
        recent = self._recent.setdefault(partition, OrderedDict())
        for offset in offsets:
            recent[offset] = thread_id
        while len(recent) > MAX_RECENT_RECORDS:
            recent.popitem(last=False)

    def acked(self, thread_id: str, partition: int, offsets: tuple[int, ...], event: CheckpointEvent) -> Acked | None:
        """This process's event of the thread, acknowledged at `offsets` of `partition`. For a put or writes
        of a thread held locally: the one-writer rule's verdict of it as the held view decides it, which holds
        if no other writer's record of the thread lies between the view's `through` and the event."""
        held = self._threads.peek(thread_id)
        decided = None
        if held is not None and held.partition == partition and held.through is not None:
            if isinstance(event, CheckpointPut | CheckpointWrites):
                verdict = thread.verdict(held.view, event)
                if verdict is not None:
                    decided = Acked(verdict, self._unknown_before(thread_id, held, offsets), offsets[-1])
        self._remember(partition, offsets, thread_id)
        own = Own(offsets, event)
        if held is None or held.partition != partition:
            view = thread.apply(thread.UNKNOWN, event)
            # A delete or an erasure leaves nothing of what came before: the view is then whole.
            if view is thread.NEW or view is thread.ERASED:
                self._put(thread_id, _held(next(_epochs), partition, offsets[-1] + 1, view, ()))
            else:
                self._put(thread_id, _held(next(_epochs), partition, None, view, (own,)))
        else:
            own_size = held.own_size + _own_size(event)
            entry = _held(
                held.epoch, partition, held.through, thread.apply(held.view, event), (*held.own, own), own_size
            )
            self._put(thread_id, entry)
        return decided

    def acked_everywhere(self, partition: int, offset: int, event: CheckpointEvent) -> None:
        """This process's event published to every partition (`runs.delete`): its copy on `partition`
        at `offset` is a record of every thread held there."""
        self._remember(partition, (offset,), None)
        for thread_id, held in self._threads.items():
            if held.partition == partition:
                own = (*held.own, Own((offset,), event))
                entry = _held(held.epoch, partition, held.through, thread.apply(held.view, event), own)
                self._put(thread_id, entry, touch=False)

    def advance(self, thread_id: str, snapshot: Held, end: int) -> Held:
        """A read found no record of the thread but own ones from the snapshot's `through` up to `end`:
        the thread's view is current through `end` (held so, if it is still the same holding). Returns the
        snapshot as of `end`, without the own records acknowledged since it was taken (those the holding
        has are folded onto a view that may lack another process's record before them)."""
        held = self._threads.peek(thread_id)
        if held is not None and held.epoch == snapshot.epoch and held.through is not None and held.through < end:
            current = _held(held.epoch, held.partition, end, held.view, tuple(held.own_since(end)))
            self._put(thread_id, current, touch=False)
        # Every own record of the snapshot lies below `end`: acknowledged before the read looked at the log.
        return _held(snapshot.epoch, snapshot.partition, end, snapshot.view, ())

    def folded(self, thread_id: str, snapshot: Held, view: thread.View, end: int) -> Held:
        """A read folded the other processes' records of the thread from the snapshot's `through` up to `end`
        onto its view (`others_records.py`): `view` is the thread as of `end`, held so if nothing replaced
        the snapshot meanwhile (an own record acknowledged since is not in `view`). Returns it as held."""
        # Every own record of the snapshot lies below `end`: acknowledged before the fetch was sent.
        current = _held(snapshot.epoch, snapshot.partition, end, view, ())
        if self._threads.peek(thread_id) is snapshot:
            self._put(thread_id, current, touch=False)
        return current

    def install(
        self,
        thread_id: str,
        snapshot: Held | None,
        partition: int,
        answer: thread.View,
        applied: int,
        end: int,
        *,
        hold: bool = True,
    ) -> Held:
        """The read API answered the thread as of `end` (the log's end when it read), holding every
        record below `applied` but the own ones the read named (`snapshot`'s). Returns the thread as of
        `end`: the answer with those folded in, the own records below `end`, never one past it (another
        process's record may lie before it). Holds the thread as of `end`, with every own record at or past
        `applied` folded in, when nothing replaced the snapshot meanwhile."""
        held = self._threads.peek(thread_id)
        current = held if held is not None and held.partition == partition else None
        named = snapshot.own if snapshot is not None and snapshot.partition == partition else ()
        mine = [own for own in (named if current is None else _merged(named, current.own)) if own.last >= applied]
        view = answer
        for _, event in (own for own in mine if own.last < end):
            view = thread.apply(view, event)
        if not hold or (snapshot is not None and (current is None or current.epoch != snapshot.epoch)):
            return _held(next(_epochs), partition, end, view, ())  # forgotten or held anew meanwhile: keep it
        beyond = [own for own in mine if own.last >= end]
        kept = view
        for _, event in beyond:
            kept = thread.apply(kept, event)
        epoch = current.epoch if current is not None else next(_epochs)
        self._put(thread_id, _held(epoch, partition, end, kept, tuple(beyond)))
        return _held(epoch, partition, end, view, ())

    def learn_history(
        self,
        thread_id: str,
        snapshot: Held,
        checkpoint_ns: str,
        checkpoint_id: str,
        answered: Mapping[str, ChannelHistory],
    ) -> None:
        """The read API's DeltaChannel history of the namespace's newest checkpoint, held from now on if
        the thread is still held as the snapshot was."""
        held = self._threads.peek(thread_id)
        if held is None or held.epoch != snapshot.epoch:
            return
        ns = held.view.namespaces.get(checkpoint_ns, thread.EMPTY if held.view.complete else None)
        if ns is None:
            return
        namespaces = dict(held.view.namespaces)
        namespaces[checkpoint_ns] = thread.with_history(ns, checkpoint_id, answered)
        view = thread.view(namespaces, held.view.complete, ledger=held.view.ledger)
        self._put(
            thread_id, _held(held.epoch, held.partition, held.through, view, held.own, held.own_size), touch=False
        )

    def erased(self, thread_id: str) -> None:
        """The thread was erased: it reads as empty from now on."""
        held = self._threads.peek(thread_id)
        if held is not None:
            self._put(thread_id, _held(held.epoch, held.partition, held.through, thread.ERASED, ()))

    def _put(self, thread_id: str, entry: Held, *, touch: bool = True) -> None:
        self._threads.put(thread_id, entry, touch=touch)


def _held(
    epoch: int,
    partition: int,
    through: int | None,
    view: thread.View,
    own: tuple[Own, ...],
    own_size: int | None = None,
) -> Held:
    if own_size is None:
        own_size = sum(_own_size(event) for _, event in own)
    return Held(epoch, partition, through, view, own, own_size)


def _merged(first: Iterable[Own], second: Iterable[Own]) -> list[Own]:
    """Own records of both, once each, in log order."""
    by_offset = {own.last: own for own in (*first, *second)}
    return [by_offset[offset] for offset in sorted(by_offset)]


def _own_size(event: CheckpointEvent) -> int:
    if isinstance(event, CheckpointPut):
        data = len(event.checkpoint_json) + len(event.metadata_json) + sum(len(b.data or b"") for b in event.blobs)
        return data + _OWN_RECORD_BYTES
    if isinstance(event, CheckpointWrites):
        return sum(len(w.data) for w in event.writes) + _OWN_RECORD_BYTES
    return _OWN_RECORD_BYTES
