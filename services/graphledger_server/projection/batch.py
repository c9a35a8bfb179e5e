"""One batch of Kafka records applied in one Postgres transaction, with its partitions' offsets.

In order, inside the transaction:
1. lock each partition's offset row and drop records below its `next_offset` (already applied); take
   the parked subjects the batch releases (`parked.py`: an operator asked, or a waiting copy barrier's
   copy has applied since), whose records run first, before the batch's own, and dead-letter the first
   record of each one an operator skipped;
2. resolve chunks (store them, or reassemble a completed event at its last chunk's position); when
   the stored chunks of the events completing in the batch exceed `reassembly_max_bytes`, the batch
   is cut before the first event over the budget (the first always fits) and the rest is `deferred`;
3. ask what the sorting needs beyond the records, on the batch's connection: bind the fresh keys of
   records that opened with them to their subjects, the erasures the key store recorded (an erasure
   event applies only then), where the copies of copy barriers stand (applied, parked, or beyond the
   end of their partition's log), and which records an operator skipped;
4. sort every record in log order: a record of a parked subject (same partition and record key) joins
   it; an event from a newer graphledger, or a copy barrier that cannot be met, parks its subject, and
   one whose copy has not applied yet parks it to wait; a refused event is a dead letter; the records of
   erased subjects are skipped (their key is gone, or an erasure before them applied), counting them;
5. apply the events, set-based, per topic projection, and record the subjects of sealed ones;
6. record dead letters and parked subjects and records; advance the offsets past every record of the
   batch (a parked one is kept in `graphledger_parked_records`), with each partition's `waits_from`;
   `NOTIFY graphledger_applied`;
7. produce the dead letters to their topic (the sink waits for the broker's acknowledgement);
then commit. A failure anywhere rolls all of it back, so the caller retries the same records. No record
stops a partition: what no projector version can apply waits beside it, on its own subject.

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
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, assert_never

import asyncpg

from graphledger.erasure.sealing import Erased as ErasedKey
from graphledger.erasure.sealing import Misbound
from graphledger.errors import SchemaSwitchedError
from graphledger.events.envelope import Envelope
from graphledger.events.erasure import NamespaceErase, TenantErase, ThreadErase
from graphledger.settings import DEFAULT_ERASURE_NAMESPACE_DEPTH
from graphledger_server.driver_errors import Verdict, verdict_of
from graphledger_server.keys.lookup import DataKeyCache
from graphledger_server.log.offsets import (
    OffsetStatements,
    TopicPartition,
    advance_offsets,
    lock_offsets,
    next_offsets,
    notify_applied,
    set_waits_from,
)
from graphledger_server.projection import chunks as chunk_store
from graphledger_server.projection import erasure, parked
from graphledger_server.projection.admission import refusal
from graphledger_server.projection.dead_letters import record_dead_letters
from graphledger_server.projection.parked import ParkedSubject, PartitionState, Position, Release
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
    key_name,
)
from graphledger_server.projection.report import ApplyReport

log = logging.getLogger(__name__)

DeadLetterSink = Callable[[Sequence[DeadLetter]], Awaitable[None]]
"""Produces dead letters to the dead-letter topic and returns once the broker acknowledged them."""
LogEnds = Callable[[Mapping[TopicPartition, int]], Awaitable[dict[TopicPartition, int]]]
"""The end offset (high watermark) of each partition asked about (each with an offset known to be in its
log), by a fetch sent now; a partition that does not exist is absent."""


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
    """Partitions cut short to bound reassembly memory: the offset to fetch again from."""
    forks: int = 0
    """Checkpoint puts whose parent was not their thread namespace's newest checkpoint."""
    erased_by_type: Counter[str | None] = field(default_factory=Counter)
    """Records of erased subjects, skipped, by event type."""
    parked: list[ParkedSubject] = field(default_factory=list)
    """Subjects this batch parked (each with the record that parked it)."""
    parked_records: int = 0
    """Records set aside on parked subjects (those that parked one included)."""
    released: int = 0
    """Parked subjects this batch ran again."""
    parked_state: dict[TopicPartition, PartitionState] = field(default_factory=dict)
    """Of the batch's partitions, those with parked subjects after it (absent: none)."""

    @property
    def erased(self) -> int:
        return self.erased_by_type.total()


@dataclass(slots=True)
class _Context:
    """What sorting a batch's records needs beyond them (step 3), read on the batch's connection."""

    committed: dict[TopicPartition, int] = field(default_factory=dict)
    bound: dict[tuple[str, str | None], Any] = field(default_factory=dict)
    erased_refs: set[str] = field(default_factory=set)
    erased_tenants: set[str] = field(default_factory=set)
    parked_positions: dict[Position, str] = field(default_factory=dict)
    """Copies of the batch's barriers that are parked, with the cause of the subject holding each."""
    log_ends: dict[TopicPartition, int] | None = None
    skipped: set[Position] = field(default_factory=set)


@dataclass(slots=True)
class _Resolved:
    events: list[Decoded] = field(default_factory=list)
    dead: list[DeadLetter] = field(default_factory=list)
    erased: list[Erased] = field(default_factory=list)
    deferred: dict[TopicPartition, int] = field(default_factory=dict)
    parked: dict[tuple[TopicPartition, bytes], ParkedSubject] = field(default_factory=dict)
    """Parked subjects by partition and subject key: those found parked, then those parked here."""
    new_parked: list[ParkedSubject] = field(default_factory=list)
    parked_records: list[tuple[ParkedSubject, SourceRecord]] = field(default_factory=list)


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


def _event_type(decoded: Decoded) -> str | None:
    return getattr(decoded.event, "TYPE", None)


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
        sealed_only: bool = False,
        namespace_depth: int = DEFAULT_ERASURE_NAMESPACE_DEPTH,
        log_ends: LogEnds | None = None,
    ) -> None:
        self.schema = schema
        self.keys = keys or DataKeyCache(None)
        """The data keys sealed events open with (none: no sealed event opens)."""
        self.reassembly_max_bytes = reassembly_max_bytes
        """Most bytes of stored chunks one batch loads to reassemble events; None: no bound."""
        self.sealed_only = sealed_only
        """Whether events naming a subject must be sealed (`GRAPHLEDGER_ENCRYPT_EVENTS`)."""
        self.namespace_depth = namespace_depth
        self.log_ends = log_ends
        """Where partitions' logs end (None: never beyond; a copy barrier then waits for its copy)."""
        self.group = consumer_group
        self.projections = dict(projections)
        self.sink = dead_letter_sink
        self._offsets = OffsetStatements(schema)
        self._chunks = chunk_store.ChunkStatements(schema)
        self._erasure = erasure.ErasureStatements(schema)
        self._parked = parked.ParkedStatements(schema)

    @property
    def parked_statements(self) -> parked.ParkedStatements:
        return self._parked

    async def classify(self, records: Sequence[SourceRecord]) -> list[Classified]:
        """Decode, open, validate and admit every record (outside the transaction), after fetching the
        data keys their `gl-subject` headers name."""
        await self.keys.load({name for r in records if (name := key_name(r)) is not None})
        return [self._admitted(classify(r, self.projections[r.topic].to_event, self.keys.get)) for r in records]

    async def releasable(self, conn: asyncpg.Connection, partitions: Collection[TopicPartition]) -> list[Release]:
        """The parked subjects of `partitions` to run again now, with their records (outside the
        transaction; `apply` takes them only if they are still parked)."""
        return await parked.releasable(conn, self._parked, self.group, partitions)

    async def classify_released(self, releases: Sequence[Release]) -> list[Classified]:
        """`classify` of the records of `releases`, in their order."""
        return await self.classify([r for release in releases for r in release.records])

    async def apply(
        self,
        conn: asyncpg.Connection,
        records: Sequence[SourceRecord],
        classified: Sequence[Classified] | None = None,
        released: Sequence[Release] = (),
        released_classified: Sequence[Classified] | None = None,
    ) -> BatchResult:
        """Apply `records` (per partition in offset order) in one transaction on `conn`, after the
        records of the parked subjects `released` (from `releasable`)."""
        if not records and not released:
            return BatchResult()
        if classified is None:
            classified = await self.classify(records)
        if released_classified is None:
            released_classified = await self.classify_released(released)
        attempts = 1
        while True:
            try:
                return await self._apply_or_isolate(conn, records, classified, released, released_classified)
            except SchemaSwitchedError as exc:
                if attempts == SCHEMA_SWITCH_RETRIES:
                    raise
                attempts += 1
                log.info("%s; re-running the batch of %d records in the new schema", exc, len(records))

    async def _apply_or_isolate(
        self,
        conn: asyncpg.Connection,
        records: Sequence[SourceRecord],
        classified: Sequence[Classified],
        released: Sequence[Release],
        released_classified: Sequence[Classified],
    ) -> BatchResult:
        try:
            return await self._apply(conn, records, classified, released, released_classified, isolate=False)
        except Exception as exc:
            if verdict_of(exc) is not Verdict.REJECT:
                raise
            log.warning("Postgres rejected data in a batch of %d records (%s); applying one by one", len(records), exc)
            return await self._apply(conn, records, classified, released, released_classified, isolate=True)

    async def _apply(
        self,
        conn: asyncpg.Connection,
        records: Sequence[SourceRecord],
        classified: Sequence[Classified],
        released: Sequence[Release],
        released_classified: Sequence[Classified],
        *,
        isolate: bool,
    ) -> BatchResult:
        result = BatchResult(isolated=isolate)
        async with conn.transaction():
            partitions = {(r.topic, r.partition) for r in records} | {rel.subject.tp for rel in released}
            stored = await lock_offsets(conn, self._offsets, self.group, partitions)
            fresh = _fresh(classified, stored)
            result.skipped = len(classified) - len(fresh)
            if result.skipped:
                log.info("skipped %d records applied before (stored offsets %s)", result.skipped, stored)
            rerun, skipped, result.released = await self._take_released(conn, released, released_classified)
            found = await parked.subjects(conn, self._parked, partitions)
            resolved = await self._resolve(conn, [*rerun, *fresh], stored, found, first_fresh=len(rerun))
            dead = [*skipped, *resolved.dead]
            # Before the events: an erasure among them finds its subject's name. Only admitted events name
            # their subject: a refused one's seal may claim any name, which an erasure of its key's
            # subject would then erase.
            opened = (d.subject for d in resolved.events if d.subject is not None)
            await erasure.record_subjects(conn, self._erasure, opened)
            if isolate:
                rejected, report = await self._apply_isolated(conn, resolved.events)
            else:
                rejected, report = [], await self._apply_events(conn, resolved.events)
            result.forks = report.forks
            dead.extend(rejected)
            await record_dead_letters(conn, self.schema, dead)
            await parked.remember_skips(conn, self._parked, [_position(letter.record) for letter in skipped])
            await parked.park(conn, self._parked, resolved.new_parked, resolved.parked_records)
            for record in records:
                tp = (record.topic, record.partition)
                cut = resolved.deferred.get(tp)
                if (cut is None or record.offset < cut) and record.offset >= stored[tp]:
                    result.next_offsets[tp] = max(result.next_offsets.get(tp, 0), record.offset + 1)
            await advance_offsets(conn, self._offsets, self.group, result.next_offsets)
            if found or released or resolved.new_parked:
                await self._record_parked_state(conn, partitions, result)
            await notify_applied(conn, self.schema)
            if dead:
                await self.sink(dead)
            result.deferred = resolved.deferred
            result.parked = resolved.new_parked
            result.parked_records = len(resolved.parked_records)
            result.applied = len(resolved.events) - len(rejected)
            result.dead_letters = len(dead)
            result.applied_by_type = Counter(_event_type(d) for d in resolved.events)
            result.applied_by_type.subtract(letter.event_type for letter in rejected)
            result.dead_letters_by_type = Counter(letter.event_type for letter in dead)
            result.erased_by_type = Counter(e.event_type for e in resolved.erased)
        return result

    async def _take_released(
        self, conn: asyncpg.Connection, released: Sequence[Release], released_classified: Sequence[Classified]
    ) -> tuple[list[Classified], list[DeadLetter], int]:
        """Take the `released` subjects still parked: their records to run again, the dead letter of the
        first record of each one an operator skipped, and how many were taken."""
        taken = await parked.take(conn, self._parked, [rel.subject for rel in released])
        rerun: list[Classified] = []
        skipped: list[DeadLetter] = []
        items = iter(released_classified)
        for release in released:
            subject = release.subject
            mine = [next(items) for _ in release.records]
            position = (subject.topic, subject.partition, subject.first_offset)
            if position not in taken:
                continue  # another batch took it meanwhile (a zombie worker, or a second release)
            action = taken[position]
            log.warning("running parked subject %s again (%s): %d records", subject.name,
                        action or "its copy applied", len(mine))  # fmt: skip
            if action == "skip" and mine and mine[0].record.offset == subject.first_offset:
                first = mine.pop(0).record
                reason = f"skipped by an operator (`graphledger parked skip`): {subject.reason}"
                skipped.append(DeadLetter(first, reason, subject.event_type, first.value))
            rerun.extend(mine)
        return rerun, skipped, len(taken)

    async def _record_parked_state(
        self, conn: asyncpg.Connection, partitions: Collection[TopicPartition], result: BatchResult
    ) -> None:
        """Read back what is parked on the batch's partitions, and set their `waits_from`."""
        found = await parked.state(conn, self._parked, partitions)
        await set_waits_from(conn, self._offsets, self.group, {tp: found.get(tp, (0, None))[1] for tp in partitions})
        result.parked_state = {
            tp: PartitionState(subjects, waits_from is not None) for tp, (subjects, waits_from) in found.items()
        }

    def _admitted(self, item: Classified) -> Classified:
        """The item, or a dead letter when its event may not affect what it names (`admission.py`)."""
        if not isinstance(item, Decoded):
            return item
        owner = self.keys.owner(item.subject.ref, item.key_id) if item.subject is not None else None
        why = refusal(
            item.event,
            item.subject,
            owner,
            sealed_only=self.sealed_only,
            namespace_depth=self.namespace_depth,
            chunked=item.chunk_event_id is not None,
        )
        if why is None:
            return item
        return DeadLetter(item.record, why, _event_type(item), item.value, item.chunk_event_id, item.subject)

    async def _resolve(
        self,
        conn: asyncpg.Connection,
        items: Sequence[Classified],
        stored: Mapping[TopicPartition, int],
        found: Sequence[ParkedSubject],
        *,
        first_fresh: int,
    ) -> _Resolved:
        """Sort records into events, dead letters, erased and parked records, storing and reassembling
        chunks; `items[:first_fresh]` are released records, which are never deferred."""
        out = _Resolved()
        out.parked = {(s.tp, s.subject_key): s for s in found if s.subject_key is not None}
        indexed_chunks = [(i, c) for i, c in enumerate(items) if isinstance(c, Chunk)]
        completing: dict[int, chunk_store.ChunkKey] = {}
        stored_parts: dict[chunk_store.ChunkKey, dict[int, bytes]] = {}
        if indexed_chunks:
            keys = {chunk_store.key_of(c) for _, c in indexed_chunks}
            stored_chunks, sizes = await chunk_store.stored_indexes(conn, self._chunks, keys)
            completing = chunk_store.completions(indexed_chunks, stored_chunks)
            if (cut := self._reassembly_cut(completing, sizes, first_fresh)) is not None:
                out.deferred = _first_offsets(items[cut:])
                items = items[:cut]
                indexed_chunks = [(i, c) for i, c in indexed_chunks if i < cut]
                completing = {i: k for i, k in completing.items() if i < cut}
            with_stored = {k for k in completing.values() if k in stored_chunks}
            if with_stored:
                stored_parts = await chunk_store.stored_data(conn, self._chunks, with_stored)
        # The outcome of each item: a chunk completing an event becomes the event, another is None.
        outcomes: list[Classified | None] = []
        seen: dict[chunk_store.ChunkKey, dict[int, bytes]] = {}
        for position, item in enumerate(items):
            if not isinstance(item, Chunk):
                outcomes.append(item)
                continue
            key = chunk_store.key_of(item)
            if position in completing:
                parts = {**stored_parts.get(key, {}), **seen.get(key, {})}
                outcomes.append(self._admitted(self._reassembled(item, key, parts)))
            else:
                outcomes.append(None)
            seen.setdefault(key, {}).setdefault(item.ref.index, item.record.value or b"")
        context = await self._context(conn, [o for o in outcomes if isinstance(o, Decoded)], stored)
        may_park = [o for o in outcomes if isinstance(o, TooNew) or (isinstance(o, Decoded) and self._holds(o))]
        context.skipped = await parked.skipped(conn, self._parked, [_position(o.record) for o in may_park])
        in_batch: dict[chunk_store.ChunkKey, dict[int, Chunk]] = {}
        finished: set[chunk_store.ChunkKey] = set()
        for item, outcome in zip(items, outcomes, strict=True):
            record = item.record
            subject_key = parked.subject_key(record)
            subject = None if subject_key is None else out.parked.get(((record.topic, record.partition), subject_key))
            if subject is not None:
                out.parked_records.append((subject, record))  # a later record of a parked subject waits with it
                continue
            match item:
                case Chunk():
                    chunk_key = chunk_store.key_of(item)
                    if chunk_key in finished:
                        continue  # a duplicate of a chunk of an event already applied
                    if outcome is None:
                        in_batch.setdefault(chunk_key, {}).setdefault(item.ref.index, item)
                        continue
                    if not self._sort(out, outcome, context):  # parked: its chunks stay stored for a rerun
                        finished.add(chunk_key)
                        in_batch.pop(chunk_key, None)
                case Decoded() | DeadLetter() | Erased() | TooNew():
                    assert outcome is not None
                    self._sort(out, outcome, context)
                case _:
                    assert_never(item)
        if indexed_chunks:
            await chunk_store.store(conn, self._chunks, [c for parts in in_batch.values() for c in parts.values()])
            await chunk_store.delete(conn, self._chunks, finished)
        return out

    async def _context(
        self, conn: asyncpg.Connection, decoded: Sequence[Decoded], stored: Mapping[TopicPartition, int]
    ) -> _Context:
        """Step 3: fresh keys bound, erasures the key store recorded, where copy barriers' copies stand."""
        context = _Context()
        binds = {
            (d.subject.ref, d.key_id)
            for d in decoded
            if d.subject is not None and d.key_id is not None and self.keys.unbound(d.subject.ref, d.key_id)
        }
        if binds:
            context.bound = dict(await self.keys.bind(conn, binds))
        refs, tenants, barriers = set(), set(), []
        for d in decoded:
            event = getattr(d.event, "event", d.event)
            if isinstance(event, ThreadErase | NamespaceErase):
                refs.add(event.ref)
            elif isinstance(event, TenantErase):
                tenants.add(event.tenant)
            elif (required := self._holds(d)) is not None:
                barriers.append((d.record.topic, *required))
        if refs or tenants:
            context.erased_refs, context.erased_tenants = await self.keys.recorded_erasures(conn, refs, tenants)
        if barriers:
            wanted = {(topic, partition) for topic, partition, _ in barriers}
            context.committed = {tp: stored[tp] for tp in wanted if tp in stored}
            if missing := wanted - context.committed.keys():
                context.committed.update(await next_offsets(conn, self._offsets, self.group, missing))
            met = [b for b in barriers if context.committed.get(b[:2], 0) > b[2]]
            context.parked_positions = await parked.parked_positions(conn, self._parked, met)
            unmet = {
                b[:2]: context.committed.get(b[:2], 0) for b in barriers if context.committed.get(b[:2], 0) <= b[2]
            }
            if unmet and self.log_ends is not None:
                context.log_ends = await self.log_ends(unmet)
        return context

    def _holds(self, decoded: Decoded) -> tuple[int, int] | None:
        return self.projections[decoded.record.topic].holds(decoded.event)

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
        return decode_value(record, value, to_event, self.keys.get, chunk_event_id=key[2])

    def _sort(self, out: _Resolved, outcome: Classified, context: _Context) -> bool:
        """File one outcome: an event to admit, a dead letter, a skipped record of an erased subject, or
        a parked subject; returns whether it parked."""
        match outcome:
            case Decoded():
                return self._admit(out, outcome, context)
            case DeadLetter():
                out.dead.append(outcome)
            case Erased():
                out.erased.append(outcome)
            case TooNew():
                return self._park(out, outcome.record, parked.NEWER_VERSION, outcome.reason, None, context)
            case Chunk():
                raise AssertionError("a chunk is filed by the event it completes")
            case _:
                assert_never(outcome)
        return False

    def _admit(self, out: _Resolved, decoded: Decoded, context: _Context) -> bool:
        """Add an event to the batch, unless: its fresh key turned out to be another subject's or its
        subject was erased since it was decoded (then skip it); it is an erasure the key store did not
        record (a dead letter); or what it requires is not applied yet (then park it to wait, or for an
        operator when it can never be). Returns whether it parked."""
        record = decoded.record
        event_type = _event_type(decoded)
        subject = decoded.subject
        if subject is not None and decoded.key_id is not None:
            key = context.bound.get((subject.ref, decoded.key_id))
            if isinstance(key, Misbound):
                reason = f"sealed with fresh key {decoded.key_id}, which is bound to another subject than {subject.ref}"
                out.dead.append(DeadLetter(record, reason, event_type, decoded.value, decoded.chunk_event_id, subject))
                return False
            if isinstance(key, ErasedKey):
                out.erased.append(Erased(record, subject.ref, event_type))
                return False
        if subject is not None and self.keys.is_erased(subject):
            out.erased.append(Erased(record, subject.ref, event_type))
            return False
        event = getattr(decoded.event, "event", decoded.event)  # the projections' timed wrappers
        if isinstance(event, ThreadErase | NamespaceErase | TenantErase):
            unrecorded = self._unrecorded_erasure(event, context)
            if unrecorded is not None:
                out.dead.append(DeadLetter(record, unrecorded, event_type, decoded.value))
                return False
            if isinstance(event, TenantErase):
                self.keys.erase_tenant(event.tenant)
            else:
                self.keys.erase(event.ref)
        required = self._holds(decoded)
        if required is not None:
            source = (record.topic, *required)
            where = f"{record.topic}:{required[0]}@{required[1]}"
            if context.committed.get((record.topic, required[0]), 0) <= required[1]:
                end = None if context.log_ends is None else context.log_ends.get((record.topic, required[0]), 0)
                if end is not None and required[1] >= end:
                    reason = f"its copy at {where} is beyond the end of that partition's log (offset {end})"
                    return self._park(out, record, parked.BEYOND_LOG, reason, event_type, context)
                reason = f"waits for its copy at {where} to apply"
                return self._park(out, record, parked.WAITING, reason, event_type, context, wait=required)
            # The copy applied, unless it is parked (before this batch, or by it): then this barrier waits
            # with it when its subject waits for a copy of its own, else for an operator.
            here = next((s for s, r in out.parked_records if _position(r) == source), None)
            copy_cause = here.cause if here is not None else context.parked_positions.get(source)
            if copy_cause == parked.WAITING:
                reason = f"waits for its copy at {where}, which waits for a copy of its own"
                return self._park(out, record, parked.WAITING, reason, event_type, context, wait=required)
            if copy_cause is not None:
                reason = f"its copy at {where} is parked: release that subject first"
                return self._park(out, record, parked.COPY_PARKED, reason, event_type, context)
        out.events.append(decoded)
        return False

    @staticmethod
    def _unrecorded_erasure(event: ThreadErase | NamespaceErase | TenantErase, context: _Context) -> str | None:
        """Why an erasure event may not apply: the key store recorded no such erasure (None: it did)."""
        if isinstance(event, TenantErase):
            if event.tenant in context.erased_tenants:
                return None
            return f"{event.TYPE}: the key store records no erasure of that tenant (an erasure erases the keys first)"
        if event.ref in context.erased_refs:
            return None
        return (
            f"{event.TYPE}: the key store records no erasure of subject {event.ref} (an erasure erases the key first)"
        )

    def _park(
        self,
        out: _Resolved,
        record: SourceRecord,
        cause: str,
        reason: str,
        event_type: str | None,
        context: _Context,
        wait: tuple[int, int] | None = None,
    ) -> bool:
        """Park the record's subject, or dead-letter the record if an operator skipped it before."""
        if _position(record) in context.skipped:
            reason = f"skipped by an operator (`graphledger parked skip`): {reason}"
            out.dead.append(DeadLetter(record, reason, event_type, record.value))
            return False
        subject = parked.new_subject(record, cause, reason, event_type, wait)
        out.new_parked.append(subject)
        out.parked_records.append((subject, record))
        if subject.subject_key is not None:
            out.parked[(subject.tp, subject.subject_key)] = subject
        logged = log.info if cause == parked.WAITING else log.error
        logged("parked subject %s (%s): %s; the partition's other subjects go on", subject.name, cause, reason)
        return True

    def _reassembly_cut(
        self, completing: Mapping[int, chunk_store.ChunkKey], sizes: Mapping[chunk_store.ChunkKey, int], first: int
    ) -> int | None:
        """The position of the first completing event at or after `first` whose stored chunks overrun
        the budget, if any."""
        if self.reassembly_max_bytes is None:
            return None
        loaded = 0
        for position in sorted(completing):
            loaded += sizes.get(completing[position], 0)
            if loaded > self.reassembly_max_bytes and position > min(completing) and position >= first:
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

    async def _apply_isolated(
        self, conn: asyncpg.Connection, events: Sequence[Decoded]
    ) -> tuple[list[DeadLetter], ApplyReport]:
        """Apply each event in its own savepoint; the ones Postgres rejects become dead letters."""
        dead = []
        report = ApplyReport()
        for d in events:
            r = d.record
            try:
                async with conn.transaction():
                    report += await self.projections[r.topic].apply(conn, [(r.topic, r.partition, r.offset, d.event)])
            except Exception as exc:
                if verdict_of(exc) is not Verdict.REJECT:
                    raise
                # The class only: Postgres's message can quote the event's values.
                log.error(
                    "Postgres rejected the event at %s:%d@%d (%s)", r.topic, r.partition, r.offset, type(exc).__name__
                )
                dead.append(
                    DeadLetter(r, f"Postgres rejected the event: {exc}", _event_type(d), d.value, d.chunk_event_id)
                )
        return dead, report


def _position(record: SourceRecord) -> Position:
    return (record.topic, record.partition, record.offset)
