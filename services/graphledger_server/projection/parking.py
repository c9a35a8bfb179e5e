"""Which records of a batch park their subject instead of stopping their partition (invariant 7). Pure.

A record no version of this projector can apply parks its *subject*: the records of its partition with
its record key (a thread's, or a store item's; a keyless record parks alone). Parking records the subject
and holds that record and the subject's later ones (`log/parked.py`) in the batch transaction that
advances the partition's offset past them, so every other subject of the partition moves on and a killed
worker neither loses nor repeats them. A record parks its subject when it is:
- of an envelope version this projector does not read (`Cause.NEWER_VERSION`);
- a copy barrier whose copy's position lies beyond the end of its partition's log as the broker reported
  it after the barrier was read (`Cause.BEYOND_LOG`): a writer publishes a barrier only once its copy is
  acknowledged, so no copy can ever be there. A barrier merely ahead of what the projection has applied
  (its copy within the log, not applied yet) holds its partition as before, until the copy applies;
- a copy barrier whose copy's record a parked subject holds (`Cause.COPY_PARKED`): the copy staged
  nothing yet, and applying the barrier would land nothing.

A record of a parked subject that stands for the subject's erasure (an erasure event, or a record whose
key the key store destroyed) applies at once as well: an erasure ends the subject whatever it holds, and
its rows must not wait for an operator. A keyless record (`runs.delete`, an erasure of a namespace or a
tenant) applies to the partition where it stands and is kept too while keyed subjects of the partition are
parked, so a release applies it to the released subject after the subject's records before it
(`within_threads`).

Verdicts (`log/parked.Verdict`) decide before anything else: a record an operator dropped is
dead-lettered, a barrier once found beyond the log parks again even if the log has grown past its copy's
position since. A rebuild carries them over from the live schema and so decides as the live projector did.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, assert_never

from graphledger.errors import InvalidEventError
from graphledger.events import envelope
from graphledger.events.checkpoint import ThreadCopy, ThreadEvent
from graphledger.log.records import LogRecord
from graphledger.opening.records import header_type, subject_ref, unwrapped
from graphledger_server.log.parked import Cause, ParkedRecord, ParkedSubject, Position, TopicPartition, Verdict
from graphledger_server.projection.dead_letters import reason_text


@dataclass(frozen=True, slots=True)
class Apply:
    """The barrier's copy has applied: apply it."""


@dataclass(frozen=True, slots=True)
class Pause:
    """The barrier's copy lies within the log but has not applied yet: hold its partition here."""


@dataclass(frozen=True, slots=True)
class Park:
    """No copy will meet the barrier as things stand: park its target."""

    cause: Cause
    reason: str
    waits_for: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class Drop:
    """An operator dropped the record: dead-letter it."""

    reason: str


BarrierDecision = Apply | Pause | Park | Drop


def barrier_decision(
    required: tuple[int, int],
    committed: int,
    end: int | None,
    copy_parked: bool,
    verdict: Verdict | None,
) -> BarrierDecision:
    """What a copy barrier requiring the copy record at `required` (partition, offset) does.

    `committed`: the projection's next offset on the copy's partition; `end`: where that partition's log
    ended when the broker was asked after the barrier was read (None: not known, so never beyond);
    `copy_parked`: a parked subject holds the copy's record; `verdict`: what was decided about the barrier."""
    partition, offset = required
    match verdict:
        case Verdict.DROPPED:
            return Drop(dropped_reason(f"thread.copy.barrier naming a copy at partition {partition} offset {offset}"))
        case Verdict.BEYOND_LOG:
            return Park(Cause.BEYOND_LOG, _beyond(partition, offset))
        case None:
            pass
        case _:
            assert_never(verdict)
    if copy_parked:
        reason = (
            f"thread.copy.barrier: its copy's record at partition {partition} offset {offset} is held by a parked "
            "subject"
        )
        return Park(Cause.COPY_PARKED, reason, required)
    if committed > offset:
        return Apply()
    if end is not None and offset >= end:
        return Park(Cause.BEYOND_LOG, _beyond(partition, offset))
    return Pause()


def _beyond(partition: int, offset: int) -> str:
    """The reason of a barrier beyond its log: the same whether found now or carried as a verdict, so a
    rebuild parks it with the same row."""
    return (
        f"thread.copy.barrier names a copy at partition {partition} offset {offset}, beyond the end of that "
        "partition's log when the barrier was read: no acknowledged copy is there"
    )


def dropped_reason(reason: str) -> str:
    """The dead-letter reason of a record an operator dropped (`graphledger parked drop`)."""
    return f"dropped by an operator (`graphledger parked drop`): {reason}"


def record_time_ms(record: LogRecord) -> int | None:
    """The record's time in the log (`envelope.append_time_ms`), None when it carries none."""
    try:
        return envelope.append_time_ms(record.timestamp, record.headers)
    except InvalidEventError:
        return None


def parked_record(record: LogRecord, first_offset: int | None) -> ParkedRecord:
    return ParkedRecord(
        record.topic, record.partition, record.offset, first_offset, record.key, record.value, record.headers,
        record.timestamp,
    )  # fmt: skip


def source_record(held: ParkedRecord) -> LogRecord:
    return LogRecord(held.topic, held.partition, held.offset, held.key, held.value, held.headers, held.timestamp)


@dataclass(slots=True)
class Parking:
    """What one batch (or release) knows of its partitions' parked subjects, and what it parks and holds.

    Filled before the batch resolves its records (`BatchApplier`), then consulted record by record in log
    order, so a subject parked at a record holds every later record of its key in the same batch."""

    keyed: dict[tuple[TopicPartition, bytes], int] = field(default_factory=dict)
    """`(partition, record key) -> first offset` of the keyed subjects parked now."""
    verdicts: Mapping[Position, Verdict] = field(default_factory=dict)
    copies_parked: frozenset[Position] = frozenset()
    """Positions of copy records the batch's barriers require that parked subjects hold."""
    ends: Mapping[TopicPartition, int] = field(default_factory=dict)
    """Where partitions' logs ended, learned after the batch's records were read."""
    schema_version: int = 0
    releasing: bool = False
    """A release's records, not a batch's: they are below their partition's offset, so nothing is cut or
    held at a partition's place, and the keyless ones among them are kept already."""
    new: list[ParkedSubject] = field(default_factory=list)
    parked_records: list[ParkedRecord] = field(default_factory=list)
    decided: dict[Position, Verdict] = field(default_factory=dict)
    """Verdicts this batch reached, recorded with it."""

    def parked_at(self, record: LogRecord) -> int | None:
        """The first offset of the parked subject `record` belongs to (None: its subject is not parked)."""
        if record.key is None:
            return None
        return self.keyed.get(((record.topic, record.partition), record.key))

    def set_aside(self, record: LogRecord, first_offset: int) -> None:
        self.parked_records.append(parked_record(record, first_offset))

    def keep_keyless(self, record: LogRecord) -> None:
        """Keep a keyless record that applies now, for the keyed subjects of its partition parked before it."""
        tp = (record.topic, record.partition)
        if not self.releasing and any(
            key_tp == tp and first < record.offset for (key_tp, _), first in self.keyed.items()
        ):
            self.parked_records.append(parked_record(record, None))

    def parked_before(self, record: LogRecord) -> bool:
        """Whether this batch parked a keyed subject of `record`'s partition at an earlier record (in a
        release: the released subject parked again, so the keyless records after that wait for it)."""
        return any(
            s.record_key is not None
            and (s.topic, s.partition) == (record.topic, record.partition)
            and s.first_offset < record.offset
            for s in self.new
        )

    def verdict(self, record: LogRecord) -> Verdict | None:
        return self.verdicts.get((record.topic, record.partition, record.offset))

    def end(self, topic: str, partition: int) -> int | None:
        return self.ends.get((topic, partition))

    def park(
        self,
        record: LogRecord,
        cause: Cause,
        reason: str,
        *,
        event_type: str | None = None,
        version: int | None = None,
        waits_for: tuple[int, int] | None = None,
    ) -> ParkedSubject:
        """Park `record`'s subject at it; its later records in the batch are held by it."""
        subject = ParkedSubject(
            record.topic, record.partition, record.offset, record.key, cause, reason_text(reason),
            event_type or header_type(record), subject_ref(record), version, self.schema_version, waits_for,
            record_time_ms(record),
        )  # fmt: skip
        self.new.append(subject)
        if record.key is not None:
            self.keyed[((record.topic, record.partition), record.key)] = record.offset
        self.parked_records.append(parked_record(record, record.offset))
        if cause is Cause.BEYOND_LOG:
            self.decided[(record.topic, record.partition, record.offset)] = Verdict.BEYOND_LOG
        return subject


def releasable(subject: ParkedSubject, schema_version: int, copy_applied: bool) -> bool:
    """Whether a projector of `schema_version` releases `subject` without an operator: an event of a
    version it reads that a projector of an older one parked (not one no upcaster reaches), or a barrier
    whose copy has applied since (`copy_applied`: its partition passed it and no parked subject holds it)."""
    match subject.cause:
        case Cause.NEWER_VERSION:
            version = subject.event_version
            return version is not None and subject.parked_by_version < version <= schema_version
        case Cause.COPY_PARKED:
            return copy_applied
        case Cause.BEYOND_LOG:
            return False
        case _:
            assert_never(subject.cause)


def threads_named(events: Iterable[Any]) -> tuple[str, ...]:
    """The threads a released subject's events name: what a `runs.delete` kept for it may change."""
    named: dict[str, None] = {}
    for event in map(unwrapped, events):
        if isinstance(event, ThreadEvent):
            named[event.key] = None
        if isinstance(event, ThreadCopy):
            named[event.target_thread_id] = None
    return tuple(named)
