"""A projector batch opened: its records opened (`opener.py`), and what the projector asks the key store of
them beside their keys, outside any transaction. Shared by the live projector, a replay and a release.

- Which erasure events the key store recorded. An eraser records the erasure (and destroys the keys)
  before it publishes the event, so a genuine one is always recorded by the time the projector reads
  it; one that is not was forged by a producer, and is dead-lettered (`unrecorded_erasure`).
- When the sources of the batch's copies were erased (`source_erased_at`): a copy appended before its
  source's erasure copied what the source held, even if the projector, reaching the source's records
  after its key was destroyed, holds none of it.
- Fresh keys that chunked events, reassembled inside a transaction, opened with: the key store is not
  asked inside the transaction, so they are bound before the next batch opens (`bind_later`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeGuard

from graphledger.events.checkpoint import ThreadCopy
from graphledger.events.erasure import NamespaceErase, TenantErase, ThreadErase
from graphledger.log.records import LogRecord
from graphledger.opening.checkpoint_events import TimedCheckpointEvent
from graphledger.opening.records import Classified, Decoded, unwrapped
from graphledger_server.keys.lookup import DataKeyCache
from graphledger_server.opening.opener import RecordOpener


def is_copy(item: Classified) -> TypeGuard[Decoded]:
    """Whether `item` is a `thread.copy` (keyed by its source)."""
    return (
        isinstance(item, Decoded)
        and isinstance(item.event, TimedCheckpointEvent)
        and isinstance(item.event.event, ThreadCopy)
        and bool(item.record.key)
    )


def thread_ref(record: LogRecord) -> str:
    """A thread event's subject reference: its record key."""
    return (record.key or b"").decode(errors="replace")


class BatchOpener:
    """Opens the projector's batches with one `RecordOpener`, remembering what the key store answered."""

    def __init__(self, opener: RecordOpener) -> None:
        self.opener = opener
        self._source_erasures: dict[str, int] = {}
        """When each erased source of a copy met in `open` was erased (ms); once erased, always."""
        self._recorded_erasures: tuple[set[str], set[str]] | None = (set(), set())
        """The subject references and tenants of erasure events met in `open` that the key store recorded
        as erased (once erased, always); None: no key store to ask, every erasure applies."""
        self._to_bind: set[tuple[str, str]] = set()
        """Fresh keys reassembled events opened with inside a batch's transaction: bound by the next `open`."""

    @property
    def keys(self) -> DataKeyCache:
        return self.opener.keys

    async def open(self, records: Sequence[LogRecord]) -> list[Classified]:
        """Every record opened (`RecordOpener.open`), after binding the fresh keys events reassembled in an
        earlier transaction opened with; then what the batch's copies and erasures need of the key store."""
        await self.bind_pending()
        classified = await self.opener.open(records)
        copies = {thread_ref(c.record) for c in classified if is_copy(c)}
        self._source_erasures.update(await self.keys.thread_erasure_times(copies - self._source_erasures.keys()))
        await self._ask_about_erasures(classified)
        return classified

    def bind_later(self, name: tuple[str, str]) -> None:
        """A fresh key an event reassembled inside a transaction opened with: bound before the next batch."""
        self._to_bind.add(name)

    async def bind_pending(self) -> None:
        """Bind the fresh keys reassembled events opened with inside an earlier transaction."""
        if self._to_bind:
            binding = set(self._to_bind)  # a replay lane's batch may add to it meanwhile
            await self.keys.bind(binding)
            self._to_bind -= binding

    def source_erased_at(self, item: Decoded) -> int | None:
        """When the source of the copy `item` was erased (ms), as the key store answered; None: it was not."""
        return self._source_erasures.get(thread_ref(item.record))

    def unrecorded_erasure(self, event: Any) -> str | None:
        """Why an erasure event may not apply (None: it may, or it is no erasure): the key store does not
        record it."""
        if self._recorded_erasures is None:
            return None
        refs, tenants = self._recorded_erasures
        if isinstance(event, TenantErase) and event.tenant not in tenants:
            return f"{event.TYPE}: the key store records no erasure of that tenant (erasers erase its keys first)"
        if isinstance(event, ThreadErase | NamespaceErase) and event.ref not in refs:
            return (
                f"{event.TYPE}: the key store records no erasure of subject {event.ref} (erasers erase its key first)"
            )
        return None

    async def _ask_about_erasures(self, classified: Sequence[Classified]) -> None:
        """Learn which erasure events of the batch the key store recorded."""
        if self._recorded_erasures is None:
            return
        refs, tenants = self._recorded_erasures
        events = [unwrapped(c.event) for c in classified if isinstance(c, Decoded)]
        asked_refs = {e.ref for e in events if isinstance(e, ThreadErase | NamespaceErase)} - refs
        asked_tenants = {e.tenant for e in events if isinstance(e, TenantErase)} - tenants
        if not asked_refs and not asked_tenants:
            return
        recorded = await self.keys.recorded_erasures(asked_refs, asked_tenants)
        if recorded is None:
            self._recorded_erasures = None
            return
        refs.update(recorded[0])
        tenants.update(recorded[1])
