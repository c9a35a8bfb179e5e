"""One batch of Kafka records applied in one Postgres transaction, with its partitions' offsets.

In order, inside the transaction:
1. lock each partition's offset row and drop records below its `next_offset` (already applied);
2. resolve chunks (store them, or reassemble a completed event at its last chunk's position); when
   the stored chunks of the events completing in the batch exceed `reassembly_max_bytes`, the batch
   is cut before the first event over the budget (the first always fits) and the rest is `deferred`;
   a reassembled event that opened with a fresh key bound to no subject yet cuts its partition there:
   the key store is not asked inside the transaction, so the key is bound before the next batch
   (`projection/binding.py`), which fetches the event again;
3. stop a partition at an event from a newer graphledger (nothing of it or after it is applied);
   skip the records of erased subjects (their key is gone, or an erasure before them in the batch
   or in an earlier one applied), counting them; a record whose key the key store reports erased
   applies its subject's erasure there (`records.erasure_at`);
4. apply the events, set-based, per topic projection, and record the subjects of sealed ones;
5. record dead letters, advance the offsets, `NOTIFY graphledger_applied`;
6. produce the dead letters to their topic (the sink waits for the broker's acknowledgement);
then commit. A failure anywhere rolls all of it back, so the caller retries the same records.

If a replay switched the schema while the batch waited for its offset rows (`SchemaSwitchedError`),
the transaction is rolled back and the batch re-run, so it lands in the schema now carrying the name.

If Postgres rejects the batch's data (`driver_errors.verdict_of` says `REJECT`: a value it cannot
store), an event is bad in a way validation did not catch. The batch is then re-run with each
event in its own savepoint, and the events Postgres rejects become dead letters: bad input never stops
a partition.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeGuard, assert_never

import asyncpg

from graphledger.erasure.sealing import SealedSubject
from graphledger.errors import SchemaSwitchedError
from graphledger.events.checkpoint import ThreadCopy
from graphledger.events.envelope import Envelope
from graphledger.events.erasure import NamespaceErase, TenantErase, ThreadErase
from graphledger_server.driver_errors import Verdict, verdict_of
from graphledger_server.keys.lookup import DataKeyCache
from graphledger_server.log.offsets import (
    OffsetStatements,
    TopicPartition,
    advance_offsets,
    lock_offsets,
    next_offsets,
    notify_applied,
)
from graphledger_server.projection import chunks as chunk_store
from graphledger_server.projection import erasure
from graphledger_server.projection.admission import admitted
from graphledger_server.projection.binding import bind_opened, unbound
from graphledger_server.projection.checkpoints import TimedCheckpointEvent
from graphledger_server.projection.dead_letters import record_dead_letters
from graphledger_server.projection.records import (
    Chunk,
    Classified,
    DeadLetter,
    Decoded,
    Erased,
    SourceRecord,
    TooNew,
    classify,
    decode_value,
    erasure_at,
    key_name,
    unwrapped,
)
from graphledger_server.projection.report import ApplyReport

log = logging.getLogger(__name__)

DeadLetterSink = Callable[[Sequence[DeadLetter]], Awaitable[None]]
"""Produces dead letters to the dead-letter topic and returns once the broker acknowledged them."""


class TopicProjection(Protocol):
    """The projection of one topic: how its envelopes become events and how a batch of them applies."""

    async def prepare(self, conn: asyncpg.Connection) -> None:
        """Read what classifying events needs from the schema (after `migrate`, before the first batch)."""
        ...

    def to_event(self, env: Envelope, appended_ms: int) -> Any:
        """The typed event of `env`, at its time (`envelope.append_time_ms`); raises `InvalidEventError`."""
        ...

    def holds(self, event: Any) -> tuple[int, int] | None:
        """`(partition, offset)` of this topic the projection must have applied before `event` applies
        (committed by an earlier batch), or None."""
        ...

    async def apply(
        self, conn: asyncpg.Connection, items: Sequence[tuple[str, int, int, Any]]
    ) -> ApplyReport | None: ...


@dataclass(slots=True)
class BatchResult:
    """What a committed batch did."""

    next_offsets: dict[TopicPartition, int] = field(default_factory=dict)
    """The offsets written for the partitions this batch advanced."""
    stopped: dict[TopicPartition, TooNew] = field(default_factory=dict)
    """Partitions stopped at an event from a newer graphledger; pause them."""
    applied: int = 0
    dead_letters: int = 0
    skipped: int = 0
    """Records below their partition's stored offset: applied before (replay after a crash, or a zombie)."""
    isolated: bool = False
    applied_by_type: Counter[str | None] = field(default_factory=Counter)
    """`applied` by event type (the projector's metrics count events by type)."""
    dead_letters_by_type: Counter[str | None] = field(default_factory=Counter)
    """`dead_letters` by event type, None where the record did not say."""
    deferred: dict[TopicPartition, int] = field(default_factory=dict)
    """Partitions cut short to bound reassembly memory, or at a chunked event whose fresh key the next
    batch binds first: the offset to fetch again from."""
    held: dict[TopicPartition, int] = field(default_factory=dict)
    """Partitions held at an event whose requirement (`TopicProjection.holds`) no committed batch met
    yet: the offset to fetch again from, after a pause."""
    forks: int = 0
    """Checkpoint puts whose parent was not their thread namespace's newest checkpoint."""
    erased_by_type: Counter[str | None] = field(default_factory=Counter)
    """Records of erased subjects, skipped, by event type."""

    @property
    def erased(self) -> int:
        return self.erased_by_type.total()


@dataclass(slots=True)
class _Resolved:
    events: list[Decoded] = field(default_factory=list)
    dead: list[DeadLetter] = field(default_factory=list)
    erased: list[Erased] = field(default_factory=list)
    erasures: set[str] = field(default_factory=set)
    """Subjects whose erasure a record of theirs applies in this batch (`_erase_at`)."""
    stopped: dict[TopicPartition, TooNew] = field(default_factory=dict)
    deferred: dict[TopicPartition, int] = field(default_factory=dict)
    held: dict[TopicPartition, int] = field(default_factory=dict)
    unbound: dict[TopicPartition, int] = field(default_factory=dict)
    """Partitions cut at a reassembled event that opened with a fresh key bound to no subject yet."""

    def cut(self, tp: TopicPartition) -> int | None:
        """Where the batch stops applying `tp` short of its records (None: it does not)."""
        found = (self.deferred.get(tp), self.held.get(tp), self.unbound.get(tp))
        cuts = [offset for offset in found if offset is not None]
        return min(cuts) if cuts else None

    def fetch_again(self) -> dict[TopicPartition, int]:
        """Where each partition cut short of its records without holding it is fetched again from."""
        again = dict(self.deferred)
        for tp, offset in self.unbound.items():
            again[tp] = min(offset, again.get(tp, offset))
        return again


def _is_copy(item: Classified) -> TypeGuard[Decoded]:
    return (
        isinstance(item, Decoded)
        and isinstance(item.event, TimedCheckpointEvent)
        and isinstance(item.event.event, ThreadCopy)
        and bool(item.record.key)
    )


def _ref_of(record: SourceRecord) -> str:
    """A thread event's subject reference: its record key."""
    return (record.key or b"").decode(errors="replace")


SCHEMA_SWITCH_RETRIES = 3
"""A replay switches a schema once; more switches in a row than this is something else going wrong."""


def _fresh(classified: Sequence[Classified], stored: Mapping[TopicPartition, int]) -> list[Classified]:
    """The records not applied yet: at or above their partition's stored offset, each offset once.

    A batch can hold a partition's records twice when a rebalance sought it back mid-fetch; applying
    them twice in one batch would re-run operations (prune, copy) out of order, so only the first
    occurrence of an offset, in log order, stays.
    """
    high = dict(stored)
    fresh = []
    for c in classified:
        tp = (c.record.topic, c.record.partition)
        if c.record.offset >= high[tp]:
            high[tp] = c.record.offset + 1
            fresh.append(c)
    return fresh


def _first_offsets(items: Sequence[Classified]) -> dict[TopicPartition, int]:
    first: dict[TopicPartition, int] = {}
    for c in items:
        tp = (c.record.topic, c.record.partition)
        first[tp] = min(first.get(tp, c.record.offset), c.record.offset)
    return first


class BatchApplier:
    """Applies batches of records for a set of topic projections into one schema."""

    def __init__(
        self,
        schema: str,
        consumer_group: str,
        projections: Mapping[str, TopicProjection],
        dead_letter_sink: DeadLetterSink,
        *,
        reassembly_max_bytes: int | None = None,
        keys: DataKeyCache | None = None,
        clear_refused: bool = False,
    ) -> None:
        self.schema = schema
        self.keys = keys or DataKeyCache(None)
        """The data keys sealed events open with (none: no sealed event opens)."""
        self.clear_refused = clear_refused
        """Encryption is on and the log has no clear era: events of a thread or namespace in the clear are
        dead-lettered (`admission.in_the_clear`)."""
        self.reassembly_max_bytes = reassembly_max_bytes
        """Most bytes of stored chunks one batch loads to reassemble events; None: no bound."""
        self.group = consumer_group
        self.projections = dict(projections)
        self.sink = dead_letter_sink
        self._offsets = OffsetStatements(schema)
        self._chunks = chunk_store.ChunkStatements(schema)
        self._erasure = erasure.ErasureStatements(schema)
        self._source_erasures: dict[str, int] = {}
        """When each erased source of a copy met in `classify` was erased (ms); once erased, always."""
        self._recorded_erasures: tuple[set[str], set[str]] | None = (set(), set())
        """The subject references and tenants of erasure events met in `classify` that the key store
        recorded as erased (once erased, always); None: no key store to ask, every erasure applies."""
        self._to_bind: set[tuple[str, str]] = set()
        """Fresh keys reassembled events opened with inside a batch's transaction: bound by the next `classify`."""

    async def classify(self, records: Sequence[SourceRecord]) -> list[Classified]:
        """Decode, open and validate every record (outside the transaction), after fetching the data
        keys their `gl-subject` and `gl-key` headers name; then bind the fresh keys records opened with
        to their subjects (`projection/binding.py`)."""
        if self._to_bind:
            binding = set(self._to_bind)  # a replay lane's batch may add to it meanwhile
            await self.keys.bind(binding)
            self._to_bind -= binding
        await self.keys.load({name for r in records if (name := key_name(r)) is not None})

        def classified_again(i: int) -> Classified:
            record = records[i]
            found = classify(record, self.projections[record.topic].to_event, self.keys.get)
            return admitted(found, self.keys.owner, clear_refused=self.clear_refused)

        classified = await bind_opened([classified_again(i) for i in range(len(records))], self.keys, classified_again)
        copies = {_ref_of(c.record) for c in classified if _is_copy(c)}
        self._source_erasures.update(await self.keys.thread_erasure_times(copies - self._source_erasures.keys()))
        await self._ask_about_erasures(classified)
        return classified

    async def _ask_about_erasures(self, classified: Sequence[Classified]) -> None:
        """Learn which erasure events of the batch the key store recorded. An eraser records the erasure
        (and destroys the keys) before it publishes the event, so a genuine one is always recorded by the
        time the projector reads it; one that is not was forged by a producer."""
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

    def _unrecorded_erasure(self, event: Any) -> str | None:
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

    async def apply(
        self, conn: asyncpg.Connection, records: Sequence[SourceRecord], classified: Sequence[Classified] | None = None
    ) -> BatchResult:
        """Apply `records` (per partition in offset order) in one transaction on `conn`."""
        if not records:
            return BatchResult()
        if classified is None:
            classified = await self.classify(records)
        attempts = 1
        while True:
            try:
                return await self._apply_or_isolate(conn, records, classified)
            except SchemaSwitchedError as exc:
                if attempts == SCHEMA_SWITCH_RETRIES:
                    raise
                attempts += 1
                log.info("%s; re-running the batch of %d records in the new schema", exc, len(records))

    async def _apply_or_isolate(
        self, conn: asyncpg.Connection, records: Sequence[SourceRecord], classified: Sequence[Classified]
    ) -> BatchResult:
        try:
            return await self._apply(conn, records, classified, isolate=False)
        except Exception as exc:
            if verdict_of(exc) is not Verdict.REJECT:
                raise
            log.warning("Postgres rejected data in a batch of %d records (%s); applying one by one", len(records), exc)
            return await self._apply(conn, records, classified, isolate=True)

    async def _apply(
        self,
        conn: asyncpg.Connection,
        records: Sequence[SourceRecord],
        classified: Sequence[Classified],
        *,
        isolate: bool,
    ) -> BatchResult:
        result = BatchResult(isolated=isolate)
        async with conn.transaction():
            stored = await lock_offsets(conn, self._offsets, self.group, {(r.topic, r.partition) for r in records})
            fresh = _fresh(classified, stored)
            result.skipped = len(classified) - len(fresh)
            if result.skipped:
                log.info("skipped %d records applied before (stored offsets %s)", result.skipped, stored)
            resolved = await self._resolve(conn, fresh, stored)
            dead = list(resolved.dead)
            # Before the events: an erasure among them finds its subject's name.
            if isolate:  # each subject with its event: Postgres may reject a name (too long to index)
                await self._record_subjects_apart(conn, [d.subject for d in dead if d.subject is not None])
                rejected, report = await self._apply_isolated(conn, resolved.events)
                dead.extend(rejected)
            else:
                subjects = [*(e.subject for e in resolved.events), *(d.subject for d in dead)]
                opened = (subject for subject in subjects if subject is not None)
                await erasure.record_subjects(conn, self._erasure, opened)
                report = await self._apply_events(conn, resolved.events)
            result.forks = report.forks
            await record_dead_letters(conn, self.schema, dead)
            for record in records:
                tp = (record.topic, record.partition)
                cut = resolved.cut(tp)
                if cut is not None and record.offset >= cut:
                    continue
                if tp not in resolved.stopped and record.offset >= stored[tp]:
                    result.next_offsets[tp] = max(result.next_offsets.get(tp, 0), record.offset + 1)
            for tp, too_new in resolved.stopped.items():
                if too_new.record.offset > stored[tp]:
                    result.next_offsets[tp] = too_new.record.offset
            await advance_offsets(conn, self._offsets, self.group, result.next_offsets)
            await notify_applied(conn, self.schema)
            if dead:
                await self.sink(dead)
            result.stopped = resolved.stopped
            result.deferred = resolved.fetch_again()
            result.held = resolved.held
            result.applied = len(resolved.events) - (len(dead) - len(resolved.dead))
            result.dead_letters = len(dead)
            result.applied_by_type = Counter(getattr(d.event, "TYPE", None) for d in resolved.events)
            result.applied_by_type.subtract(letter.event_type for letter in dead[len(resolved.dead) :])
            result.dead_letters_by_type = Counter(letter.event_type for letter in dead)
            result.erased_by_type = Counter(e.event_type for e in resolved.erased)
        return result

    async def _resolve(
        self, conn: asyncpg.Connection, items: Sequence[Classified], stored: Mapping[TopicPartition, int]
    ) -> _Resolved:
        """Sort records into events, dead letters, stops and holds, storing and reassembling chunks."""
        out = _Resolved()
        committed = await self._committed_for_holds(conn, items, stored)
        indexed_chunks = [(i, c) for i, c in enumerate(items) if isinstance(c, Chunk)]
        completing: dict[int, chunk_store.ChunkKey] = {}
        stored_parts: dict[chunk_store.ChunkKey, dict[int, bytes]] = {}
        if indexed_chunks:
            keys = {chunk_store.key_of(c) for _, c in indexed_chunks}
            stored_chunks, sizes = await chunk_store.stored_indexes(conn, self._chunks, keys)
            completing = chunk_store.completions(indexed_chunks, stored_chunks)
            if (cut := self._reassembly_cut(completing, sizes)) is not None:
                out.deferred = _first_offsets(items[cut:])
                items = items[:cut]
                indexed_chunks = [(i, c) for i, c in indexed_chunks if i < cut]
                completing = {i: k for i, k in completing.items() if i < cut}
            with_stored = {k for k in completing.values() if k in stored_chunks}
            if with_stored:
                stored_parts = await chunk_store.stored_data(conn, self._chunks, with_stored)
        in_batch: dict[chunk_store.ChunkKey, dict[int, Chunk]] = {}
        finished: set[chunk_store.ChunkKey] = set()
        for position, item in enumerate(items):
            record = item.record
            tp = (record.topic, record.partition)
            if tp in out.stopped or tp in out.held or tp in out.unbound:
                continue
            match item:
                case Chunk():
                    key = chunk_store.key_of(item)
                    if key in finished:
                        continue  # a duplicate of a chunk of an event already applied
                    if position not in completing:
                        in_batch.setdefault(key, {}).setdefault(item.ref.index, item)
                        continue
                    earlier = {i: c.record.value or b"" for i, c in in_batch.get(key, {}).items()}
                    outcome = self._reassembled(item, key, {**stored_parts.get(key, {}), **earlier})
                    if (name := unbound(outcome, self.keys)) is not None:
                        # Its key is bound (or found another subject's) before the next batch, which
                        # reassembles it again from the chunks stored below.
                        self._to_bind.add(name)
                        out.unbound[tp] = record.offset
                        continue
                    if not isinstance(outcome, TooNew):  # a stopped partition reassembles it again later
                        finished.add(key)
                        in_batch.pop(key, None)
                    self._sort(out, outcome, committed)
                case Decoded() | DeadLetter() | Erased() | TooNew():
                    self._sort(out, item, committed)
                case _:
                    assert_never(item)
        if indexed_chunks:
            await chunk_store.store(conn, self._chunks, [c for parts in in_batch.values() for c in parts.values()])
            await chunk_store.delete(conn, self._chunks, finished)
        self._mark_copies_of_sources_erased_later(out)
        return out

    def _mark_copies_of_sources_erased_later(self, out: _Resolved) -> None:
        """Mark each `thread.copy` whose source the key store showed erased after the copy was appended
        (`TimedCheckpointEvent.source_erased_later`, from `classify`): the source's records before it may
        have been skipped as erased, yet the copy copied them, and an erasure of the source erases the copy."""
        for i, decoded in enumerate(out.events):
            if _is_copy(decoded):
                timed = decoded.event
                at = self._source_erasures.get(_ref_of(decoded.record))
                if at is not None and timed.ts_ms < at:
                    out.events[i] = replace(decoded, event=replace(timed, source_erased_later=True))

    def _reassembled(
        self, last: Chunk, key: chunk_store.ChunkKey, parts: dict[int, bytes]
    ) -> Decoded | DeadLetter | TooNew | Erased:
        """The event whose `last` chunk completes it, with the `parts` stored and earlier in the batch."""
        record = last.record
        parts.setdefault(last.ref.index, record.value or b"")
        value = chunk_store.assemble(parts, last.ref.count)
        if value is None:
            return DeadLetter(
                record, f"chunks of event {key[2]} do not cover 0..{last.ref.count - 1}", None, None, key[2]
            )
        to_event = self.projections[record.topic].to_event
        found = decode_value(record, value, to_event, self.keys.get, chunk_event_id=key[2])
        return admitted(found, self.keys.owner, clear_refused=self.clear_refused)

    def _sort(
        self, out: _Resolved, outcome: Decoded | DeadLetter | TooNew | Erased, committed: Mapping[TopicPartition, int]
    ) -> None:
        """An event to admit, a dead letter, a skipped record of an erased subject, or a partition's stop."""
        match outcome:
            case Decoded():
                self._admit(out, outcome, committed)
            case DeadLetter():
                out.dead.append(outcome)
            case Erased():
                out.erased.append(outcome)
                self._erase_at(out, outcome)
            case TooNew():
                self._stop(out, outcome)
            case _:
                assert_never(outcome)

    def _erase_at(self, out: _Resolved, erased: Erased) -> None:
        """Apply the erasure a record of an erased subject stands for at that record (`erasure_at`),
        once per subject in a batch."""
        if erased.ref in out.erasures:
            return
        event = erasure_at(erased, self.projections[erased.record.topic].to_event)
        if event is not None:
            out.erasures.add(erased.ref)
            self.keys.erase(erased.ref)  # a record after it that opens with a key held from before is skipped
            out.events.append(Decoded(erased.record, event))

    def _admit(self, out: _Resolved, decoded: Decoded, committed: Mapping[TopicPartition, int]) -> None:
        """Add an event to the batch, unless what it requires is not committed yet: then hold its partition;
        or unless its subject was erased since it was decoded: then skip it."""
        record = decoded.record
        if decoded.subject is not None and self.keys.is_erased(decoded.subject):
            out.erased.append(Erased(record, decoded.subject.ref, getattr(decoded.event, "TYPE", None)))
            return
        event = unwrapped(decoded.event)
        if (forged := self._unrecorded_erasure(event)) is not None:
            out.dead.append(DeadLetter(record, forged, event.TYPE, decoded.value, decoded.chunk_event_id))
            return
        if isinstance(event, ThreadErase | NamespaceErase):
            self.keys.erase(event.ref)  # the key store erased it before the event was published
        elif isinstance(event, TenantErase):
            self.keys.erase_tenant(event.tenant)
        required = self.projections[record.topic].holds(decoded.event)
        if required is not None and committed.get((record.topic, required[0]), 0) <= required[1]:
            log.info("holding %s:%d at offset %d until %s:%d@%d has applied", record.topic, record.partition,
                     record.offset, record.topic, *required)  # fmt: skip
            out.held[(record.topic, record.partition)] = record.offset
            return
        out.events.append(decoded)

    async def _committed_for_holds(
        self, conn: asyncpg.Connection, items: Sequence[Classified], stored: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, int]:
        """The committed next offsets of the partitions the batch's events require (`holds`)."""
        wanted = set()
        for item in items:
            if isinstance(item, Decoded):
                required = self.projections[item.record.topic].holds(item.event)
                if required is not None:
                    wanted.add((item.record.topic, required[0]))
        committed = {tp: stored[tp] for tp in wanted if tp in stored}
        missing = wanted - committed.keys()
        if missing:
            committed.update(await next_offsets(conn, self._offsets, self.group, missing))
        return committed

    def _reassembly_cut(
        self, completing: Mapping[int, chunk_store.ChunkKey], sizes: Mapping[chunk_store.ChunkKey, int]
    ) -> int | None:
        """The position of the first completing event whose stored chunks overrun the budget, if any."""
        if self.reassembly_max_bytes is None:
            return None
        loaded = 0
        for position in sorted(completing):
            loaded += sizes.get(completing[position], 0)
            if loaded > self.reassembly_max_bytes and position > min(completing):
                log.info("deferring the batch from position %d: reassembly would load %d bytes", position, loaded)
                return position
        return None

    @staticmethod
    def _stop(out: _Resolved, too_new: TooNew) -> None:
        r = too_new.record
        log.error(
            "stopping partition %s:%d at offset %d: %s; events after it wait for an upgraded projector",
            r.topic, r.partition, r.offset, too_new.reason,
        )  # fmt: skip
        out.stopped[(r.topic, r.partition)] = too_new

    async def _apply_events(self, conn: asyncpg.Connection, events: Sequence[Decoded]) -> ApplyReport:
        by_topic: dict[str, list[tuple[str, int, int, Any]]] = {}
        for d in events:
            r = d.record
            by_topic.setdefault(r.topic, []).append((r.topic, r.partition, r.offset, d.event))
        report = ApplyReport()
        for topic, items in by_topic.items():
            report += await self.projections[topic].apply(conn, items)
        return report

    async def _record_subjects_apart(self, conn: asyncpg.Connection, subjects: Sequence[SealedSubject]) -> None:
        """Record each subject in its own savepoint, leaving out those Postgres rejects (dead letters'
        subjects: their names only help an erasure find their rows, and they have none)."""
        for subject in subjects:
            try:
                async with conn.transaction():
                    await erasure.record_subjects(conn, self._erasure, [subject])
            except Exception as exc:
                if verdict_of(exc) is not Verdict.REJECT:
                    raise
                log.warning("Postgres rejected the name of subject %s (%s)", subject.ref, type(exc).__name__)

    async def _apply_isolated(
        self, conn: asyncpg.Connection, events: Sequence[Decoded]
    ) -> tuple[list[DeadLetter], ApplyReport]:
        """Apply each event, with its sealed subject's name, in its own savepoint; the ones Postgres rejects
        become dead letters."""
        dead = []
        report = ApplyReport()
        for d in events:
            r = d.record
            try:
                async with conn.transaction():
                    await erasure.record_subjects(conn, self._erasure, [d.subject] if d.subject is not None else [])
                    report += await self.projections[r.topic].apply(conn, [(r.topic, r.partition, r.offset, d.event)])
            except Exception as exc:
                if verdict_of(exc) is not Verdict.REJECT:
                    raise
                # The class only: Postgres's message can quote the event's values.
                log.error(
                    "Postgres rejected the event at %s:%d@%d (%s)", r.topic, r.partition, r.offset, type(exc).__name__
                )
                event_type = getattr(d.event, "TYPE", None)
                dead.append(DeadLetter(r, f"Postgres rejected the event: {exc}", event_type, d.value, d.chunk_event_id))
        return dead, report
