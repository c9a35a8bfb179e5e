"""Sealing each event in the clear with its subject's data key, and writing the events in merge order."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from dataclasses import dataclass

from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import murmur2
from aiokafka.structs import RecordMetadata

from graphledger.erasure.sealer import EventSealer
from graphledger.erasure.sealing import Erased, Misbound, seal, sealed_key_id, sealed_ref, unseal
from graphledger.erasure.subjects import LABEL_SEPARATOR, record_key, subject_of
from graphledger.errors import GraphledgerError, InvalidEventError, SubjectErasedError, UnknownEventVersionError
from graphledger.events import Event, checkpoint_event, store_event
from graphledger.events.checkpoint import ThreadCopy, ThreadCopyBarrier
from graphledger.events.chunks import frame
from graphledger.events.envelope import (
    HEADER_APPENDED,
    HEADER_TRACEPARENT,
    Envelope,
    decode,
    encode,
    header,
    headers_for,
)
from graphledger.opening.records import check_clear_headers
from graphledger.settings import DEFAULT_ERASURE_NAMESPACE_DEPTH, Settings
from graphledger.tenancy import THREAD_SEPARATOR
from graphledger_server.keys.lookup import DataKeyCache
from graphledger_server.log_copy.report import TopicReport
from graphledger_server.log_copy.source import Position, SourceEvent
from graphledger_server.log_copy.target import HEADER_COPY_OF, Copied


@dataclass(frozen=True, slots=True)
class Sealing:
    """What sealing an event in the clear takes: its subject's keys, and the tenants names can carry."""

    sealer: EventSealer
    keys: DataKeyCache
    """Data keys by reference, to open a sealed barrier and seal it again."""
    tenants: frozenset[str]


def partition_of(key: bytes, partitions: int) -> int:
    """The partition the producers' default partitioner gives `key` (murmur2, positive, modulo)."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def tenant_of(event: Event, tenants: frozenset[str]) -> str:
    """The tenant whose prefix the event's subject carries ("" for the unnamed tenant or no subject)."""
    subject = subject_of(event, "", DEFAULT_ERASURE_NAMESPACE_DEPTH)  # the first label: any depth
    if subject is None or not tenants:
        return ""
    separator = THREAD_SEPARATOR if subject.kind == "thread" else LABEL_SEPARATOR
    first, found, _ = subject.name.partition(separator)
    return first if found and first in tenants else ""


@dataclass(slots=True)
class Outgoing:
    """What one source event becomes: a key, a value and headers to write (a barrier: still to point)."""

    key: bytes | None
    envelope: Envelope
    value: bytes | None
    """The value to write as it is; None: encode `envelope`."""
    headers: list[tuple[str, bytes]]
    sealed: bool
    """Sealed here (it was in the clear)."""
    tenant: str = ""
    route: bytes | None = None
    """The key whose partition it goes to, when not its own (`Copier._route`)."""


class Copier:
    """Seals a window of merged events concurrently, then writes them in merge order. With `seal_clear`
    off (a repartition) events in the clear stay so, only their partition changes; `sealing` is then needed
    to open and seal again a sealed copy barrier (None: no key store, and such a barrier fails), and,
    with encryption on, to route events in the clear (`_route`)."""

    def __init__(
        self,
        report: TopicReport,
        producer: AIOKafkaProducer,
        sealing: Sealing | None,
        copied: Copied,
        settings: Settings,
        *,
        seal_clear: bool = True,
    ) -> None:
        self._source = report.source
        self._target = report.target
        self._partitions = report.partitions
        self._report = report
        self._producer = producer
        self._sealing = sealing
        self._seal_clear = seal_clear
        self._route_clear = not seal_clear and settings.encrypt_events
        """Route events in the clear by the keyed hash of their subject (`_route`)."""
        self._copied = copied
        self._max_message_bytes = settings.max_message_bytes
        self._to_event = checkpoint_event if report.source == settings.checkpoint_topic else store_event
        self._written_to: set[int] = set()
        """Target partitions this run wrote to: any later event found there already means a gap."""
        self._copies: dict[Position, Position | asyncio.Future[RecordMetadata]] = dict(copied.copies)
        """Where each `thread.copy` went: known, or its last record's acknowledgement still to come."""
        self._pending: list[asyncio.Future[RecordMetadata]] = []
        self._pending_copies: list[Position] = []

    async def classify(self, event: SourceEvent) -> SourceEvent:
        """Decode the event as the merge needs it: typed when in the clear, opened when a sealed barrier."""
        if event.problem is not None:
            return event
        try:
            envelope = event.envelope = decode(event.value)
            ref = sealed_ref(envelope)
            if ref is None:
                event.event = self._to_event(envelope)
            elif envelope.type == ThreadCopyBarrier.TYPE:
                if self._sealing is None:
                    raise GraphledgerError(
                        f"{self._source}:{event.partition}@{event.offset} is a sealed copy barrier, which the copy "
                        "rewrites: set GRAPHLEDGER_KEY_ENCRYPTION_KEYS and the key store's database"
                    )
                key_id = event.key_id = sealed_key_id(envelope)
                await self._sealing.keys.load([(ref, key_id)])
                key = self._sealing.keys.get(ref, key_id)
                if key is None or isinstance(key, Misbound):
                    raise GraphledgerError(
                        f"{self._source}:{event.partition}@{event.offset} is sealed for subject {ref}, which the key "
                        "store does not know: run encrypt-log with the key store the writers used"
                    )
                if not isinstance(key, Erased):
                    opened, event.opened = unseal(envelope, key)
                    event.event = self._to_event(opened)
            if event.event is not None:
                # What the copy writes in clear comes from the payload: a record whose headers say
                # otherwise, which the projector dead-letters, must not count in the copy.
                check_clear_headers(event.headers, event.event)
        except UnknownEventVersionError as exc:
            raise GraphledgerError(
                f"{self._source}:{event.partition}@{event.offset}: {exc}; run encrypt-log of that version"
            ) from exc
        except InvalidEventError as exc:
            event.problem = str(exc)
        return event

    async def copy(self, events: list[SourceEvent]) -> None:
        """Seal and write `events` in their order (skipping what earlier runs wrote), then wait for the
        broker's acknowledgement of all."""
        self._report.events += len(events)
        written_before = [self._written_before(e) for e in events]
        missing = [e for e, there in zip(events, written_before, strict=True) if there is None]
        prepared = iter(await asyncio.gather(*(self._prepare(e) for e in missing)))
        for event, there in zip(events, written_before, strict=True):
            if there is None:
                out = next(prepared)
                if out is not None:
                    await self._write(event, out)
                continue
            for q in there:
                self._refuse_gap(q, event)
            self._report.earlier += 1
        await self._settle()

    def _written_before(self, event: SourceEvent) -> set[int] | None:
        """The target partitions where an earlier run wrote the whole event (every one, if keyless), or
        None when it is to be written (or to be left out)."""
        if event.position in self._copied.torn:
            return None
        if event.key is None:
            there = self._copied.broadcasts.get(event.position, set())
            return there if len(there) == self._partitions else None
        q = self._copied.keyed_in(event.position)
        return None if q is None else {q}

    def _refuse_gap(self, q: int, event: SourceEvent) -> None:
        """Each target partition holds a prefix of what the merge sends it: nothing this run wrote there
        may come before an event an earlier run wrote there."""
        if q in self._written_to:
            raise GraphledgerError(
                f"{self._target}:{q} holds the copy of {self._source}:{event.partition}@{event.offset}, but not every "
                "event the copy writes there before it: it was not written by this command over this source; delete "
                "the target topics and run again"
            )

    async def _prepare(self, event: SourceEvent) -> Outgoing | None:
        if event.problem is not None:
            self._report.leave_out(event.position, event.problem)
            return None
        envelope = event.envelope
        assert envelope is not None
        if event.event is None or event.opened is not None or not self._seal_clear:
            # Sealed already, or left in the clear: copied as it is (a barrier: re-pointed when written).
            headers = [h for h in event.headers if h[0] != HEADER_COPY_OF]
            route = await self._route(event) if event.event is not None and event.opened is None else None
            return Outgoing(event.key, envelope, event.value, headers, sealed=False, route=route)
        assert self._sealing is not None, "sealing events in the clear needs the key store"
        tenant = tenant_of(event.event, self._sealing.tenants)
        if isinstance(event.event, ThreadCopyBarrier):
            return Outgoing(None, envelope, None, [], sealed=True, tenant=tenant)  # sealed once re-pointed
        # A protected write's intent goes in the copy's clear header as in the original's (a copied log
        # must refuse what the original refused: graphledger.ownership).
        envelope = dataclasses.replace(envelope, intent=getattr(event.event, "intent", None))
        try:
            key, sealed = await self._sealing.sealer.seal(event.event, tenant, envelope)
        except SubjectErasedError:
            self._report.erased += 1
            return None
        key_bytes = None if key is None else key.encode()
        headers = headers_for(sealed, _traceparent(event))
        return Outgoing(key_bytes, sealed, None, headers, sealed=sealed is not envelope, tenant=tenant)

    async def _route(self, event: SourceEvent) -> bytes | None:
        """Where a repartition puts an event in the clear, when encryption is on: at the partition of the
        keyed hash its subject's records are written under now. A thread written in the clear, then
        sealed after encryption was turned on, has records under two keys: by their own keys they would
        land on two partitions of the new topics, applied apart (a delete before the puts it follows)."""
        if not self._route_clear or event.key is None or event.event is None:
            return None
        if self._sealing is None:
            raise GraphledgerError(
                f"{self._source}:{event.partition}@{event.offset} is in the clear and encryption is on: the copy puts "
                "it where sealed writes of its subject go, by its keyed hash: set GRAPHLEDGER_KEY_ENCRYPTION_KEYS and "
                "the key store's database"
            )
        tenant = tenant_of(event.event, self._sealing.tenants)
        try:
            keys = await self._sealing.sealer.tenant_hashing(tenant)
        except SubjectErasedError:
            return None  # nothing of the tenant is readable any more: its own key will do
        hashed = record_key(keys.hash_key, event.event)
        return None if hashed is None else hashed.encode()

    async def _write(self, event: SourceEvent, out: Outgoing) -> None:
        if isinstance(event.event, ThreadCopyBarrier):
            pointed = await self._point(event, event.event, out)
            if pointed is None:
                return
            out = pointed
        broadcast = out.key is None
        route = out.route or out.key
        targets = list(range(self._partitions)) if route is None else [partition_of(route, self._partitions)]
        value = encode(out.envelope) if out.value is None else out.value
        headers = [
            *(h for h in out.headers if h[0] != HEADER_APPENDED),
            (HEADER_APPENDED, str(event.timestamp).encode()),  # the event keeps its time, not the copy's
            (HEADER_COPY_OF, f"{event.partition}:{event.offset}".encode()),
        ]
        chunk_id = str(uuid.uuid4()) if event.position in self._copied.torn else out.envelope.event_id
        there = self._copied.broadcasts.get(event.position, set()) if broadcast else set()  # some, of a keyless one
        for q in targets:
            if q in there:
                self._refuse_gap(q, event)
                continue
            self._written_to.add(q)
            records = frame(value, headers, self._max_message_bytes, chunk_id)
            for r in records:
                sent = await self._producer.send(self._target, r.value, key=out.key, headers=r.headers, partition=q)
                self._pending.append(sent)
            if out.envelope.type == ThreadCopy.TYPE:
                self._copies[event.position] = sent
                self._pending_copies.append(event.position)
            self._report.records += len(records)
        if broadcast:
            self._report.broadcasts += 1
        elif out.sealed:
            self._report.sealed += 1
        else:
            self._report.kept += 1

    async def _point(self, event: SourceEvent, barrier: ThreadCopyBarrier, out: Outgoing) -> Outgoing | None:
        """The barrier naming its copy's position in the target, sealed; None when it is left out."""
        position = await self._copy_position((barrier.source_partition, barrier.source_offset))
        if position is None:
            why = (
                f"copy barrier naming {barrier.source_partition}@{barrier.source_offset}, where no thread.copy was "
                "copied (none there, or its subject is erased)"
            )
            self._report.leave_out(event.position, why)
            return None
        pointed = dataclasses.replace(barrier, source_partition=position[0], source_offset=position[1])
        envelope = dataclasses.replace(out.envelope, payload=pointed.to_payload())
        if event.opened is not None:
            assert self._sealing is not None, "opened with the key store in classify"
            cipher = self._sealing.keys.get(event.opened.ref, event.key_id)
            assert cipher is not None and not isinstance(cipher, Erased | Misbound), "opened with it in classify"
            sealed = seal(envelope, event.opened, cipher, event.key_id)
            pointed_out = Outgoing(event.key, sealed, None, headers_for(sealed, _traceparent(event)), sealed=False)
        elif not self._seal_clear:  # a barrier in the clear stays so: only where it points changes
            pointed_out = Outgoing(
                event.key, envelope, None, headers_for(envelope, _traceparent(event)), sealed=False, route=out.route
            )
        else:
            assert self._sealing is not None
            try:
                key, sealed = await self._sealing.sealer.seal(pointed, out.tenant, envelope)
            except SubjectErasedError:
                self._report.erased += 1
                return None
            assert key is not None, "a barrier is keyed by its target thread"
            pointed_out = Outgoing(key.encode(), sealed, None, headers_for(sealed, _traceparent(event)), sealed=True)
        self._report.barriers += 1
        return pointed_out

    async def _copy_position(self, source: Position) -> Position | None:
        found = self._copies.get(source)
        if isinstance(found, asyncio.Future):
            metadata = await found
            found = self._copies[source] = (metadata.partition, metadata.offset)
        return found

    async def _settle(self) -> None:
        """Wait until the broker acknowledged every record written (a failure is raised here)."""
        pending, self._pending = self._pending, []
        await asyncio.gather(*pending)
        for source in self._pending_copies:
            await self._copy_position(source)
        self._pending_copies.clear()


def _traceparent(event: SourceEvent) -> str | None:
    raw = header(event.headers, HEADER_TRACEPARENT)
    return raw.decode(errors="replace") if raw else None
