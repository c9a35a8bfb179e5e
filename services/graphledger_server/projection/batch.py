"""One batch of Kafka records applied in one Postgres transaction, with its partitions' offsets.

In order, inside the transaction:
1. lock each partition's offset row and drop records below its `next_offset` (already applied);
2. resolve chunks (store them, or reassemble a completed event at its last chunk's position); when
   the stored chunks of the events completing in the batch exceed `reassembly_max_bytes`, the batch
   is cut before the first event over the budget (the first always fits) and the rest is `deferred`;
   a reassembled event that opened with a fresh key bound to no subject yet cuts its partition there:
   the key store is not asked inside the transaction, so the key is bound before the next batch
   (`opening/batch_opener.py`), which fetches the event again;
3. hold the records of parked subjects, and park the subject of a record no version of this projector
   can apply (`projection/parking.py`: an event from a newer graphledger, a copy barrier beyond the
   log); skip the records of erased subjects (their key is gone, or an erasure before them in the batch
   or in an earlier one applied), counting them; a record whose key the key store reports erased
   applies its subject's erasure there (`opening.records.erasure_at`);
4. apply the events, set-based, per topic projection, and record the subjects of sealed ones;
5. record dead letters and parked subjects with the records they hold, advance the offsets past
   them, `NOTIFY graphledger_applied`;
6. produce the dead letters to their topic (the sink waits for the broker's acknowledgement);
then commit. A failure anywhere rolls all of it back, so the caller retries the same records.

A release of a parked subject (`parked_release.py`) runs steps 2 to 6 on the records it holds, in one
transaction that takes them (with the offset row of their partition locked, as a batch of it would), so
they apply once, in log order, or park again at the record that still cannot apply.

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
from typing import Any, Protocol, assert_never

import asyncpg

from graphledger.erasure.sealing import SealedSubject
from graphledger.errors import SchemaSwitchedError
from graphledger.events import envelope
from graphledger.events.envelope import Envelope
from graphledger.events.erasure import NamespaceErase, TenantErase, ThreadErase
from graphledger.log.records import LogRecord
from graphledger.opening import chunks
from graphledger.opening.records import (
    Chunk,
    Classified,
    DeadLetter,
    Decoded,
    Erased,
    TooNew,
    erasure_at,
    header_type,
    unwrapped,
)
from graphledger_server.driver_errors import Verdict, verdict_of
from graphledger_server.keys.lookup import DataKeyCache
from graphledger_server.log import key_filter, parked
from graphledger_server.log.offsets import (
    OffsetStatements,
    TopicPartition,
    advance_offsets,
    lock_offsets,
    next_offsets,
    notify_applied,
)
from graphledger_server.log.parked import Cause, ParkedStatements, ParkedSubject, Position
from graphledger_server.opening import chunk_table as chunk_store
from graphledger_server.opening.batch_opener import BatchOpener, is_copy
from graphledger_server.opening.binding import unbound
from graphledger_server.opening.opener import RecordOpener
from graphledger_server.projection import erasure
from graphledger_server.projection.checkpoints import CheckpointProjection
from graphledger_server.projection.dead_letters import record_dead_letters
from graphledger_server.projection.parking import (
    Apply,
    Drop,
    Park,
    Parking,
    Pause,
    barrier_decision,
    dropped_reason,
)
from graphledger_server.projection.report import ApplyReport

log = logging.getLogger(__name__)

DeadLetterSink = Callable[[Sequence[DeadLetter]], Awaitable[None]]
"""Produces dead letters to the dead-letter topic and returns once the broker acknowledged them."""
LogEnds = Callable[[set[TopicPartition]], Awaitable[dict[TopicPartition, int]]]
"""Where the partitions' logs end now, from the broker (`log/ends.py`); a partition the topic does not have
ends at 0."""


class TopicProjection(Protocol):
    """The projection of one topic: how its envelopes become events and how a batch of them applies."""

    async def prepare(self, conn: asyncpg.Connection) -> None:
        """Read what classifying events needs from the schema (after `migrate`, before the first batch)."""
        ...

    def to_event(self, env: Envelope, appended_ms: int) -> Any:
        """The typed event of `env`, at its time (`envelope.append_time_ms`); raises `InvalidEventError`."""
        ...

    def requires(self, event: Any) -> tuple[int, int] | None:
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
    parked: list[ParkedSubject] = field(default_factory=list)
    """Subjects this batch parked (their partitions moved on)."""
    parked_records: int = 0
    """Records of parked subjects this batch set aside (their first records included)."""
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
    paused: dict[TopicPartition, int] = field(default_factory=dict)
    """Partitions held at an event whose requirement (`TopicProjection.requires`) no committed batch met
    yet: the offset to fetch again from, after a pause."""
    forks: int = 0
    """Checkpoint puts made without an intent whose parent was not their thread namespace's newest checkpoint."""
    branches: int = 0
    """Counted protected puts whose parent was not the newest: branches their writers asked for."""
    refusals: Counter[str] = field(default_factory=Counter)
    """Puts and writes the one-writer rule refused (`graphledger.ownership`), by cause."""
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
    deferred: dict[TopicPartition, int] = field(default_factory=dict)
    paused: dict[TopicPartition, int] = field(default_factory=dict)
    unbound: dict[TopicPartition, int] = field(default_factory=dict)
    """Partitions cut at a reassembled event that opened with a fresh key bound to no subject yet."""

    def cut(self, tp: TopicPartition) -> int | None:
        """Where the batch stops applying `tp` short of its records (None: it does not)."""
        found = (self.deferred.get(tp), self.paused.get(tp), self.unbound.get(tp))
        cuts = [offset for offset in found if offset is not None]
        return min(cuts) if cuts else None

    def fetch_again(self) -> dict[TopicPartition, int]:
        """Where each partition cut short of its records without holding it is fetched again from."""
        again = dict(self.deferred)
        for tp, offset in self.unbound.items():
            again[tp] = min(offset, again.get(tp, offset))
        return again


def _log_parked(subject: ParkedSubject) -> None:
    log.warning(
        "parked subject %s (%s): %s; its records wait for `graphledger parked release|drop`, its partition moves on",
        subject.name, subject.cause, subject.reason,
    )  # fmt: skip


def _dropped_or(
    outcome: Decoded | DeadLetter | TooNew | Erased, parking: Parking
) -> Decoded | DeadLetter | TooNew | Erased:
    """`outcome`, or a dead letter when it is an event of a version this projector does not read that an
    operator dropped (a barrier's drop is decided with the barrier: `parking.barrier_decision`)."""
    if isinstance(outcome, TooNew) and parking.verdict(outcome.record) is parked.Verdict.DROPPED:
        record = outcome.record
        reason = dropped_reason(outcome.reason)
        return DeadLetter(record, reason, header_type(record), outcome.value, outcome.chunk_event_id)
    return outcome


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


def _warn_of_gaps(classified: Sequence[Classified], stored: Mapping[TopicPartition, int]) -> None:
    """Warn when a batch starts a partition above its stored offset: the records between were never
    fetched, and nothing but this line says so (the topics are neither compacted nor transactional, so
    their offsets have no gaps)."""
    for tp, first in _first_offsets(classified).items():
        if first > stored[tp]:
            log.warning(
                "a batch starts %s:%d at offset %d, above its stored next offset %d: offsets %d..%d were not "
                "fetched", tp[0], tp[1], first, stored[tp], stored[tp], first - 1,
            )  # fmt: skip


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
        log_ends: LogEnds | None = None,
    ) -> None:
        self.schema = schema
        self.projections = dict(projections)
        opener = RecordOpener(
            keys or DataKeyCache(None), lambda topic: self.projections[topic].to_event, clear_refused=clear_refused
        )
        self.opening = BatchOpener(opener)
        """Opens the batch's records (`opening/batch_opener.py`), as the read API's read-through does."""
        self.reassembly_max_bytes = reassembly_max_bytes
        """Most bytes of stored chunks one batch loads to reassemble events; None: no bound."""
        self.group = consumer_group
        self.sink = dead_letter_sink
        self.log_ends = log_ends
        """Asked, after a batch's records were read, where its copy barriers' copies' partitions end (None:
        never asked, so no barrier is found beyond the log)."""
        self._ends: dict[TopicPartition, int] = {}
        """The greatest end each such partition's log was found at (a log only grows)."""
        self.offset_sql = OffsetStatements(schema)
        self.parked_sql = ParkedStatements(schema)
        self._chunks = chunk_store.ChunkStatements(schema)
        self._erasure = erasure.ErasureStatements(schema)
        self._record_keys = key_filter.render_record(schema)
        self._filtered = frozenset(t for t, p in self.projections.items() if isinstance(p, CheckpointProjection))
        """The topics whose record keys go into the key filter: the checkpoint topic."""

    @property
    def keys(self) -> DataKeyCache:
        """The data keys sealed events open with."""
        return self.opening.opener.keys

    @keys.setter
    def keys(self, keys: DataKeyCache) -> None:
        self.opening.opener.keys = keys

    async def classify(self, records: Sequence[LogRecord]) -> list[Classified]:
        """Open every record outside the transaction (`BatchOpener.open`), then learn where the batch's copy
        barriers' copies' partitions end."""
        classified = await self.opening.open(records)
        await self._learn_ends(classified)
        return classified

    async def _learn_ends(self, classified: Sequence[Classified]) -> None:
        """Ask the broker where the partitions of the batch's copy barriers' copies end: after the
        barriers were read, so a copy acknowledged before a barrier was published lies below it."""
        wanted = set()
        for c in classified:
            if isinstance(c, Decoded) and (required := self.projections[c.record.topic].requires(c.event)) is not None:
                wanted.add((c.record.topic, required[0]))
        if not wanted or self.log_ends is None:
            return
        for tp, end in (await self.log_ends(wanted)).items():
            self._ends[tp] = max(end, self._ends.get(tp, end))

    async def apply(
        self, conn: asyncpg.Connection, records: Sequence[LogRecord], classified: Sequence[Classified] | None = None
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
        self, conn: asyncpg.Connection, records: Sequence[LogRecord], classified: Sequence[Classified]
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
        records: Sequence[LogRecord],
        classified: Sequence[Classified],
        *,
        isolate: bool,
    ) -> BatchResult:
        result = BatchResult(isolated=isolate)
        async with conn.transaction():
            stored = await lock_offsets(conn, self.offset_sql, self.group, {(r.topic, r.partition) for r in records})
            _warn_of_gaps(classified, stored)
            fresh = _fresh(classified, stored)
            result.skipped = len(classified) - len(fresh)
            if result.skipped:
                log.info("skipped %d records applied before (stored offsets %s)", result.skipped, stored)
            parking = await self.parking_for(conn, fresh)
            resolved = await self.resolve(conn, fresh, stored, parking)
            dead = await self.apply_resolved(conn, resolved, parking, result)
            passed: list[LogRecord] = []
            for record in records:
                tp = (record.topic, record.partition)
                cut = resolved.cut(tp)
                if cut is not None and record.offset >= cut:
                    continue
                if record.offset >= stored[tp]:
                    result.next_offsets[tp] = max(result.next_offsets.get(tp, 0), record.offset + 1)
                    passed.append(record)
            await self._record_keys_of(conn, passed)
            await advance_offsets(conn, self.offset_sql, self.group, result.next_offsets)
            await notify_applied(conn, self.schema)
            if dead:
                await self.sink(dead)
            result.deferred = resolved.fetch_again()
            result.paused = resolved.paused
        return result

    async def _record_keys_of(self, conn: asyncpg.Connection, passed: Sequence[LogRecord]) -> None:
        """Add the keys of the checkpoint records the offsets move past to the key filter, whatever became of
        the records (applied, parked, dead-lettered, skipped as erased): the filter says only which keys
        the log holds."""
        for topic in self._filtered:
            keys = {(r.partition, r.key) for r in passed if r.topic == topic and r.key is not None}  # hashed once
            if keys:
                await key_filter.record(conn, self._record_keys, topic, keys)

    async def apply_resolved(
        self, conn: asyncpg.Connection, resolved: _Resolved, parking: Parking, result: BatchResult
    ) -> list[DeadLetter]:
        """Apply what `_resolve` sorted (events, dead letters, parked subjects and the records they hold)
        in the caller's transaction; fill `result`'s counts and return every dead letter."""
        dead = list(resolved.dead)
        # Before the events: an erasure among them finds its subject's name.
        if result.isolated:  # each subject with its event: Postgres may reject a name (too long to index)
            await self._record_subjects_apart(conn, [d.subject for d in dead if d.subject is not None])
            rejected, report = await self._apply_isolated(conn, resolved.events)
            dead.extend(rejected)
        else:
            subjects = [*(e.subject for e in resolved.events), *(d.subject for d in dead)]
            opened = (subject for subject in subjects if subject is not None)
            await erasure.record_subjects(conn, self._erasure, opened)
            report = await self._apply_events(conn, resolved.events)
        result.forks, result.branches, result.refusals = report.forks, report.branches, report.refusals
        await record_dead_letters(conn, self.schema, dead)
        await parked.park(conn, self.parked_sql, parking.new, parking.parked_records)
        await parked.set_verdicts(conn, self.parked_sql, parking.decided)
        result.parked = list(parking.new)
        result.parked_records = sum(1 for h in parking.parked_records if h.first_offset is not None)
        result.applied = len(resolved.events) - (len(dead) - len(resolved.dead))
        result.dead_letters = len(dead)
        result.applied_by_type = Counter(getattr(d.event, "TYPE", None) for d in resolved.events)
        result.applied_by_type.subtract(letter.event_type for letter in dead[len(resolved.dead) :])
        result.dead_letters_by_type = Counter(letter.event_type for letter in dead)
        result.erased_by_type = Counter(e.event_type for e in resolved.erased)
        return dead

    async def parking_for(
        self, conn: asyncpg.Connection, items: Sequence[Classified], *, releasing: bool = False
    ) -> Parking:
        """What the batch's records need to know of parking: the subjects of their partitions parked now,
        the verdicts on the records that may park, and which copies its barriers require are held."""
        tps = {(c.record.topic, c.record.partition) for c in items}
        keyed = await parked.keyed_of_partitions(conn, self.parked_sql, tps)
        candidates: set[Position] = set()
        required: set[Position] = set()
        for c in items:
            record = c.record
            if isinstance(c, TooNew | Chunk):
                candidates.add((record.topic, record.partition, record.offset))
            elif isinstance(c, Decoded) and (needs := self.projections[record.topic].requires(c.event)) is not None:
                candidates.add((record.topic, record.partition, record.offset))
                required.add((record.topic, *needs))
        verdicts = await parked.verdicts(conn, self.parked_sql, candidates)
        held = await parked.parked_positions(conn, self.parked_sql, required)
        return Parking(keyed, verdicts, frozenset(held), dict(self._ends), envelope.SCHEMA_VERSION, releasing)

    async def resolve(
        self,
        conn: asyncpg.Connection,
        items: Sequence[Classified],
        stored: Mapping[TopicPartition, int],
        parking: Parking,
    ) -> _Resolved:
        """Sort records into events, dead letters, parked and held records and partition holds, storing
        and reassembling chunks."""
        out = _Resolved()
        committed = await self._committed_for_requirements(conn, items, stored)
        # A parked subject's chunks are held as they came, not stored: its release reassembles them.
        indexed_chunks = [
            (i, c) for i, c in enumerate(items) if isinstance(c, Chunk) and parking.parked_at(c.record) is None
        ]
        completing: dict[int, chunks.ChunkKey] = {}
        stored_parts: dict[chunks.ChunkKey, dict[int, bytes]] = {}
        if indexed_chunks:
            keys = {chunks.key_of(c) for _, c in indexed_chunks}
            stored_chunks, sizes = await chunk_store.stored_indexes(conn, self._chunks, keys)
            completing = chunks.completions(indexed_chunks, stored_chunks)
            if not parking.releasing and (cut := self._reassembly_cut(completing, sizes)) is not None:
                out.deferred = _first_offsets(items[cut:])
                items = items[:cut]
                indexed_chunks = [(i, c) for i, c in indexed_chunks if i < cut]
                completing = {i: k for i, k in completing.items() if i < cut}
            with_stored = {k for k in completing.values() if k in stored_chunks}
            if with_stored:
                stored_parts = await chunk_store.stored_data(conn, self._chunks, with_stored)
        in_batch: dict[chunks.ChunkKey, dict[int, Chunk]] = {}
        finished: set[chunks.ChunkKey] = set()
        for position, item in enumerate(items):
            record = item.record
            tp = (record.topic, record.partition)
            if tp in out.paused or tp in out.unbound:
                continue
            holder = parking.parked_at(record)
            if holder is not None:
                parking.set_aside(record, holder)
                if not self._erases_its_subject(item):
                    continue
            elif record.key is None and parking.releasing and parking.parked_before(record):
                continue  # a release: kept for the subject's next release, which it parked again for
            match item:
                case Chunk():
                    key = chunks.key_of(item)
                    if key in finished:
                        continue  # a duplicate of a chunk of an event already applied
                    if position not in completing:
                        in_batch.setdefault(key, {}).setdefault(item.ref.index, item)
                        continue
                    earlier = {i: c.record.value or b"" for i, c in in_batch.get(key, {}).items()}
                    outcome = self.opening.opener.reassembled(item, {**stored_parts.get(key, {}), **earlier})
                    if (name := unbound(outcome, self.keys)) is not None:
                        # Its key is bound (or found another subject's) before the next batch, which
                        # reassembles it again from the chunks stored below.
                        self.opening.bind_later(name)
                        out.unbound[tp] = record.offset
                        continue
                    outcome = _dropped_or(outcome, parking)
                    if not isinstance(outcome, TooNew):  # a parked subject's release reassembles it again
                        finished.add(key)
                        in_batch.pop(key, None)
                    self._sort(out, outcome, committed, parking)
                case Decoded() | DeadLetter() | Erased() | TooNew():
                    self._sort(out, _dropped_or(item, parking), committed, parking)
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
            if is_copy(decoded):
                timed = decoded.event
                at = self.opening.source_erased_at(decoded)
                if at is not None and timed.ts_ms < at:
                    out.events[i] = replace(decoded, event=replace(timed, source_erased_later=True))

    def _sort(
        self,
        out: _Resolved,
        outcome: Decoded | DeadLetter | TooNew | Erased,
        committed: Mapping[TopicPartition, int],
        parking: Parking,
    ) -> None:
        """An event to admit, a dead letter, a skipped record of an erased subject, or a parked subject."""
        match outcome:
            case Decoded():
                self._admit(out, outcome, committed, parking)
            case DeadLetter():
                out.dead.append(outcome)
            case Erased():
                out.erased.append(outcome)
                self._erase_at(out, outcome)
            case TooNew():
                _log_parked(parking.park(outcome.record, Cause.NEWER_VERSION, outcome.reason, version=outcome.version))
            case _:
                assert_never(outcome)

    def _erases_its_subject(self, item: Classified) -> bool:
        """Whether a record of a parked subject applies at once as well as being held: it stands for the
        subject's erasure (an erasure the key store recorded, or a record whose key it destroyed)."""
        if isinstance(item, Erased):
            return True
        if not isinstance(item, Decoded):
            return False
        event = unwrapped(item.event)
        return isinstance(event, ThreadErase | NamespaceErase) and self.opening.unrecorded_erasure(event) is None

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

    def _admit(
        self, out: _Resolved, decoded: Decoded, committed: Mapping[TopicPartition, int], parking: Parking
    ) -> None:
        """Add an event to the batch, unless what it requires is not committed yet: then hold its partition,
        or park its subject when it never will be (`parking.barrier_decision`); or unless its subject was
        erased since it was decoded: then skip it."""
        record = decoded.record
        if decoded.subject is not None and self.keys.is_erased(decoded.subject):
            out.erased.append(Erased(record, decoded.subject.ref, getattr(decoded.event, "TYPE", None)))
            return
        event = unwrapped(decoded.event)
        if (forged := self.opening.unrecorded_erasure(event)) is not None:
            out.dead.append(DeadLetter(record, forged, event.TYPE, decoded.value, decoded.chunk_event_id))
            return
        if isinstance(event, ThreadErase | NamespaceErase):
            self.keys.erase(event.ref)  # the key store erased it before the event was published
        elif isinstance(event, TenantErase):
            self.keys.erase_tenant(event.tenant)
        required = self.projections[record.topic].requires(decoded.event)
        if required is not None:
            topic, (partition, offset) = record.topic, required
            decision = barrier_decision(
                required,
                committed.get((topic, partition), 0),
                parking.end(topic, partition),
                (topic, partition, offset) in parking.copies_parked,
                parking.verdict(record),
            )
            match decision:
                case Apply():
                    pass
                case Pause() if not parking.releasing:
                    log.info("holding %s:%d at offset %d until %s:%d@%d has applied", topic, record.partition,
                             record.offset, topic, partition, offset)  # fmt: skip
                    out.paused[(topic, record.partition)] = record.offset
                    return
                case Pause():  # a release cannot hold its partition: the subject waits for the copy instead
                    reason = f"{event.TYPE}: its copy at partition {partition} offset {offset} has not applied yet"
                    subject = parking.park(record, Cause.COPY_PARKED, reason, event_type=event.TYPE, waits_for=required)
                    _log_parked(subject)
                    return
                case Park(cause=cause, reason=reason, waits_for=waits_for):
                    _log_parked(parking.park(record, cause, reason, event_type=event.TYPE, waits_for=waits_for))
                    return
                case Drop(reason=reason):
                    value, chunk_id = decoded.value, decoded.chunk_event_id
                    out.dead.append(
                        DeadLetter(record, reason, event.TYPE, value, chunk_id, decoded.subject, decoded.key_id)
                    )
                    return
                case _:
                    assert_never(decision)
        out.events.append(decoded)
        if record.key is None and decoded.chunk_event_id is None:
            parking.keep_keyless(record)

    async def _committed_for_requirements(
        self, conn: asyncpg.Connection, items: Sequence[Classified], stored: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, int]:
        """The committed next offsets of the partitions the batch's events require (`requires`)."""
        wanted = set()
        for item in items:
            if isinstance(item, Decoded):
                required = self.projections[item.record.topic].requires(item.event)
                if required is not None:
                    wanted.add((item.record.topic, required[0]))
        committed = {tp: stored[tp] for tp in wanted if tp in stored}
        missing = wanted - committed.keys()
        if missing:
            committed.update(await next_offsets(conn, self.offset_sql, self.group, missing))
        return committed

    def _reassembly_cut(
        self, completing: Mapping[int, chunks.ChunkKey], sizes: Mapping[chunks.ChunkKey, int]
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
