"""The records of the log the projector has not applied yet, held by the read API and found by key.

The read API answers a read of a thread (or a store item) at the log's end without waiting for the
projector: the projection's answer, plus the key's records the projection has not applied, folded as
the projector applies them (`read_through.py`). This module holds those records. It is a projection
of the log too: per partition of the followed topics, every record from the projection's applied
offset (`low`) up to where it has read (`position`), in offset order and by record key.

A read asks `tail(partition, key)`: a fetch sent after the read arrived (shared with the other reads of
its loop turn, `LogTail.pages`) tells where the log ends and brings the records since `position`, and
the answer is the key's records (and the keyless ones, `runs.delete` and erasures, which are every
key's) in `[low, end)`. Between reads a background task reads on every `FOLLOW_INTERVAL_S`, so a read
rarely fetches more than a few records, and drops what the projection has applied since (the applied
offsets are the process's `AppliedOffsets`).

Erasure records are reported as they are read (`on_erasure`), so the key cache the records are opened
with forgets an erased subject before any record after its erasure is opened, wherever its erasure
was made: as the projector's cache forgets it when it applies the erasure. So every record is read, the
ones the projection applied before this process read them included (read, reported if an erasure, not
held): a partition read on from where the projection got to would pass over an erasure, and a key held
from before it would open its subject's later records. Where a partition is (re)started at the applied
offset, the records below it were never read here: `on_unread` says so, and the key cache lets go of
every key. That is so for a new partition, after an operator's reset going back, and where reading on
stopped below the applied offset at a record batch it cannot read (the projector dead-lettered it).

Bounded by bytes (`api_read_through_max_bytes`): beyond it nothing more is read until the projector
applies what is held; a read whose end lies beyond what is held gets None, and waits for the projection
instead (the read says so when it times out). Nothing is held until the applied offsets were read once
(a read then waits too), so a start never reads the log from its beginning.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from aiokafka import TopicPartition

from graphledger.errors import LogUnavailableError
from graphledger.events import envelope
from graphledger.events.erasure import NamespaceErase, TenantErase, ThreadErase
from graphledger.log.records import LogRecord, Tail
from graphledger.log.tail import LogTail, Page
from graphledger.tasks import cancel_and_wait
from graphledger_server.log.applied import AppliedOffsets

log = logging.getLogger(__name__)

FOLLOW_INTERVAL_S = 0.2
"""Pause between two background reads of every followed partition (reads fetch what they need themselves)."""
RECORD_OVERHEAD_BYTES = 200
"""What one held record costs beside its key, value and headers (objects, index entries)."""
WARN_EVERY_S = 60.0
ERASURES = frozenset(cls.TYPE.encode() for cls in (ThreadErase, NamespaceErase, TenantErase))
"""The `gl-type` headers of erasure records."""


@dataclass(slots=True)
class _Partition:
    low: int
    position: int
    records: deque[LogRecord] = field(default_factory=deque)
    by_key: dict[bytes | None, deque[LogRecord]] = field(default_factory=dict)
    size: int = 0
    notes: dict[int, Any] = field(default_factory=dict)
    """What readers learned of a held record (its decoding), by offset; dropped with the record."""


class Unprojected:
    """The unprojected records of `topics`, for one read API process."""

    def __init__(self, log_tail: LogTail, offsets: AppliedOffsets, topics: Iterable[str], max_bytes: int) -> None:
        self._log = log_tail
        self.on_erasure: Callable[[LogRecord], None] | None = None
        """Told of every erasure record as it is read, before any record after it is held."""
        self.on_unread: Callable[[], None] | None = None
        """Told when a partition is read from the applied offset on, the records below never read here."""
        self._offsets = offsets
        self._topics = tuple(topics)
        self.max_bytes = max_bytes
        self._partitions: dict[TopicPartition, _Partition] = {}
        self._size = 0
        self._full = False
        """An ingest stopped at the bound; cleared when a trim frees room."""
        self._offsets_known = False
        self._task: asyncio.Task[None] | None = None
        self._warned_at = float("-inf")
        self.over_bound = 0
        """Reads that found the bound reached (they waited for the projection instead)."""
        self.unreadable = 0
        """Reads that found no records below the log's end where they read on (they waited instead)."""

    @property
    def size(self) -> int:
        """Bytes held, as the bound counts them."""
        return self._size

    @property
    def offsets_known(self) -> bool:
        """Whether the applied offsets were read at least once. While the offsets watcher reconnects, the
        last ones it read still bound what the projection has applied (committed offsets only grow; an
        operator's reset going back starts the partition again at the next read of it)."""
        if not self._offsets_known and self._offsets.listening.is_set():
            self._offsets_known = True
        return self._offsets_known

    @property
    def full(self) -> bool:
        """Whether reading stopped at the bound (until the projector applies what is held)."""
        return self._full

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    async def start(self) -> None:
        if self.enabled:
            self._task = asyncio.create_task(self._follow(), name="graphledger-read-through")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None

    async def tail(self, tp: TopicPartition, key: bytes, timeout_s: float) -> Tail | None:
        """The key's records up to the log's end now (a fetch sent after this call), or None when they
        are not all held: read-through off, the applied offsets never known yet, or the bound reached."""
        if not self.enabled or not self.offsets_known:
            return None
        part = self._trimmed(tp)
        pages = await self._log.pages({tp: part.position}, timeout_s)
        end = pages[tp].end
        part = self._read_on(tp, part, pages[tp])
        deadline = time.monotonic() + timeout_s
        while part.position < end:  # more than a page behind: read on, within the bound
            if self._full:
                self._over_bound()
                return None
            before = part.position
            remaining = max(0.001, deadline - time.monotonic())
            page = (await self._log.pages({tp: part.position}, remaining, below_end=True))[tp]
            part = self._read_on(tp, part, page)
            if part.position == before:
                self.unreadable += 1
                log.warning("no records of %s:%d from %d, below its end %d: the read waits", *tp, before, end)
                return None
        part = self._partitions[tp]  # a reset meanwhile replaced it
        if part.low > end or part.position < end:
            self.unreadable += 1
            log.warning("%s:%d is held from %d to %d, not up to its end %d: the read waits", *tp, part.low,
                        part.position, end)  # fmt: skip
            return None
        return Tail(part.low, end, _below(_merged(part.by_key.get(key), part.by_key.get(None)), end))

    def note(self, record: LogRecord) -> Any:
        """What a reader noted of `record` (None: nothing, or it is no longer held)."""
        part = self._partitions.get(TopicPartition(record.topic, record.partition))
        return None if part is None else part.notes.get(record.offset)

    def set_note(self, record: LogRecord, value: Any) -> None:
        """Keep `value` with the record while it is held; it counts against the bound as the record does."""
        part = self._partitions.get(TopicPartition(record.topic, record.partition))
        if part is not None and part.low <= record.offset < part.position and record.offset not in part.notes:
            part.notes[record.offset] = value
            size = _size(record)
            part.size += size
            self._size += size

    # -- holding -------------------------------------------------------------------------------------

    def _trimmed(self, tp: TopicPartition) -> _Partition:
        """The partition's holding, less what the projection has applied (started at its applied offset).
        Where it is read on from stays: what the projection applied since is still read, not held."""
        applied = self._offsets.applied(tp.topic, tp.partition)
        part = self._partitions.get(tp)
        if part is None or applied < part.low:
            # New, or the applied offset went back (`graphledger offsets reset`): start again from it.
            return self._restarted(tp, applied)
        while part.records and part.records[0].offset < applied:
            record = part.records.popleft()
            part.by_key[record.key].popleft()
            if not part.by_key[record.key]:
                del part.by_key[record.key]
            size = _size(record) * (2 if part.notes.pop(record.offset, None) is not None else 1)
            part.size -= size
            self._size -= size
        part.low = max(part.low, applied)
        if self._full and self._size < self.max_bytes * 0.9:
            self._full = False  # room again, with some hysteresis
        return part

    def _restarted(self, tp: TopicPartition, applied: int) -> _Partition:
        """The partition held anew from the applied offset, the records below never read here (`on_unread`)."""
        part = self._partitions.get(tp)
        if part is not None:
            self._size -= part.size
            self._full = False
        part = self._partitions[tp] = _Partition(applied, applied)
        if self.on_unread is not None:
            self.on_unread()
        return part

    def _read_on(self, tp: TopicPartition, part: _Partition, page: Page) -> _Partition:
        """The partition's holding with `page` (fetched from its position) ingested. One that read nothing
        there, below what the projection applied (so the log goes on past it), stopped at a record batch it
        cannot read (the projector dead-lettered it): reading on from there would find nothing for ever, so
        it starts again at the applied offset."""
        before = part.position
        self._ingest(tp, part, page.records)
        if self._partitions[tp] is not part:
            return self._partitions[tp]  # restarted meanwhile (a reset, or a read stuck as below): read on with it
        if before == part.position < part.low:
            return self._restarted(tp, part.low)
        return part

    def _ingest(self, tp: TopicPartition, part: _Partition, records: Iterable[LogRecord]) -> None:
        """Append the fetched records after `position` (each fetch began at or before it), within the bound;
        those the projection applied meanwhile (below `low`) are read past, reporting their erasures."""
        if self._partitions.get(tp) is not part:
            return  # reset meanwhile
        for record in records:
            if record.offset < part.position:
                continue
            size = _size(record)
            if record.offset >= part.low and self._size + size > self.max_bytes:
                self._full = True
                return
            if self.on_erasure is not None and envelope.header(record.headers, envelope.HEADER_TYPE) in ERASURES:
                self.on_erasure(record)
            if record.offset < part.low:
                part.position = record.offset + 1
                continue
            part.records.append(record)
            part.by_key.setdefault(record.key, deque()).append(record)
            part.size += size
            self._size += size
            part.position = record.offset + 1

    def _over_bound(self) -> None:
        self.over_bound += 1
        if time.monotonic() - self._warned_at > WARN_EVERY_S:
            self._warned_at = time.monotonic()
            log.warning(
                "read-through holds %d bytes of unprojected records (api_read_through_max_bytes %d): reads of "
                "threads and store items with records beyond wait for the projector",
                self._size,
                self.max_bytes,
            )

    async def _follow(self) -> None:
        """Read on every followed partition, dropping what the projection applied, until stopped."""
        while True:
            await asyncio.sleep(FOLLOW_INTERVAL_S)
            if not self.offsets_known:
                continue
            try:
                positions = {}
                for topic in self._topics:
                    for p in range(await self._log.partition_count(topic)):
                        tp = TopicPartition(topic, p)
                        part = self._trimmed(tp)
                        if not self._full:
                            positions[tp] = part.position
                if positions:
                    for tp, page in (await self._log.pages(positions, 5.0)).items():
                        self._read_on(tp, self._partitions[tp], page)
            except LogUnavailableError as exc:
                log.debug("read-through could not read the log: %s", exc)


def _size(record: LogRecord) -> int:
    return record.size + sum(len(k) + len(v) for k, v in record.headers) + RECORD_OVERHEAD_BYTES


def _merged(mine: deque[LogRecord] | None, every: deque[LogRecord] | None) -> list[LogRecord]:
    """A key's records and the keyless ones, in offset order."""
    if not every:
        return list(mine or ())
    if not mine:
        return list(every)
    return sorted((*mine, *every), key=lambda r: r.offset)


def _below(records: list[LogRecord], end: int) -> tuple[LogRecord, ...]:
    return tuple(r for r in records if r.offset < end)
