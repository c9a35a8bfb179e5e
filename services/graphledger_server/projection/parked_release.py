"""The release of a parked subject (`graphledger parked release|drop`): the records it holds applied in log
order, in one transaction that takes them with their partition's offset row locked, as a batch of that
partition would, so they apply once, or park again at the record that still cannot apply.

A release runs steps 2 to 6 of a batch (`batch.py`) on the records the subject holds. The keyless records
kept since the subject parked apply to it in their place (`runs.delete` only to the threads its records
name). A chunked event that opens with a fresh key bound to no subject yet stops the release: the key is
bound, and the release runs again, `RELEASE_ROUNDS` times at most.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import assert_never

import asyncpg

from graphledger.errors import ParkedSubjectError
from graphledger.events.checkpoint import RunsDelete
from graphledger.opening.checkpoint_events import TimedCheckpointEvent
from graphledger.opening.records import Chunk, Classified, DeadLetter, Decoded, Erased, TooNew, header_type
from graphledger_server.driver_errors import Verdict, verdict_of
from graphledger_server.log import parked
from graphledger_server.log.offsets import lock_offsets, notify_applied
from graphledger_server.log.parked import Cause, ParkedSubject, Position, subject_name
from graphledger_server.projection.batch import BatchApplier, BatchResult
from graphledger_server.projection.parking import dropped_reason, source_record, threads_named

log = logging.getLogger(__name__)


class _FreshKeysToBind(Exception):
    """A released chunked event opened with a fresh key bound to no subject yet: bind it, then release again."""


RELEASE_ROUNDS = 3
"""Releases of one subject in a row that may each meet a fresh key to bind first."""


@dataclass(frozen=True, slots=True)
class Released:
    """What a release did: the subject it took, how many records it held, and the transaction's result
    (a subject parked again is among `result.parked`)."""

    subject: ParkedSubject
    records: int
    result: BatchResult


def _dropped(item: Decoded | DeadLetter | TooNew | Erased) -> DeadLetter:
    """The first record of a subject an operator drops, as its dead letter."""
    if isinstance(item, DeadLetter):
        return replace(item, reason=dropped_reason(item.reason))
    reason = dropped_reason(item.reason if isinstance(item, TooNew) else "the record that parked its subject")
    event_type = header_type(item.record)
    match item:
        case Decoded():
            return DeadLetter(
                item.record, reason, event_type, item.value, item.chunk_event_id, item.subject, item.key_id
            )
        case TooNew():
            return DeadLetter(item.record, reason, event_type, item.value, item.chunk_event_id)
        case Erased():
            return DeadLetter(item.record, reason, event_type, item.record.value)
        case _:
            assert_never(item)


def _within(item: Classified, threads: tuple[str, ...]) -> Classified:
    """A keyless `runs.delete` kept for a released subject changes only the threads its records name
    (it applied to the partition's other threads where it stands)."""
    if (
        isinstance(item, Decoded)
        and item.record.key is None
        and isinstance(item.event, TimedCheckpointEvent)
        and isinstance(item.event.event, RunsDelete)
    ):
        return replace(item, event=replace(item.event, within_threads=threads))
    return item


async def release_parked(
    applier: BatchApplier, conn: asyncpg.Connection, position: Position, *, drop: bool = False
) -> Released:
    """Apply the records the subject parked at `position` (its first record's) holds, in log order, in one
    transaction that takes them: they apply once, or the subject parks again at the first record that
    still cannot apply, holding it and the rest. The keyless records kept since its first apply to it
    in their place (`runs.delete` only to the threads its records name). `drop`: the first record is
    dead-lettered instead, and that verdict recorded, so no later reader (a rebuild) parks it again.
    Raises `ParkedSubjectError` when no subject is parked there."""
    for attempt in range(1, RELEASE_ROUNDS + 1):
        await applier.opening.bind_pending()
        try:
            return await _release_or_isolate(applier, conn, position, drop)
        except _FreshKeysToBind:
            if attempt == RELEASE_ROUNDS:
                raise ParkedSubjectError(
                    f"{subject_name(*position)}: its records opened with fresh keys bound to no subject yet "
                    f"{RELEASE_ROUNDS} times in a row; release it again"
                ) from None
    raise AssertionError("unreachable")


async def _release_or_isolate(
    applier: BatchApplier, conn: asyncpg.Connection, position: Position, drop: bool
) -> Released:
    try:
        return await _release(applier, conn, position, drop, isolate=False)
    except Exception as exc:
        if verdict_of(exc) is not Verdict.REJECT:
            raise
        log.warning("Postgres rejected data released from %s (%s); applying one by one", subject_name(*position),
                    type(exc).__name__)  # fmt: skip
        return await _release(applier, conn, position, drop, isolate=True)


async def _release(
    applier: BatchApplier, conn: asyncpg.Connection, position: Position, drop: bool, *, isolate: bool
) -> Released:
    topic, partition, _ = position
    result = BatchResult(isolated=isolate)
    async with conn.transaction():
        # The partition's offset row, as a batch of it locks it: no batch holds a record for the subject
        # while it is taken, and two releases of it take it once.
        stored = await lock_offsets(conn, applier.offset_sql, applier.group, {(topic, partition)})
        taken = await parked.take(conn, applier.parked_sql, position)
        if taken is None:
            raise ParkedSubjectError(
                f"no subject is parked at {subject_name(*position)}: released or dropped already, or never parked"
            )
        subject, held = taken
        records = [source_record(h) for h in held]
        classified = await applier.classify(records)
        first_record = classified[0] if classified else None
        if drop and first_record is not None and not isinstance(first_record, Chunk):
            classified[0] = _dropped(first_record)  # a chunked one is dropped at its verdict, reassembled
        threads = threads_named(c.event for c in classified if isinstance(c, Decoded) and c.record.key is not None)
        parking = await applier.parking_for(conn, classified, releasing=True)
        if drop:
            parking.verdicts = {**parking.verdicts, position: parked.Verdict.DROPPED}
            parking.decided[position] = parked.Verdict.DROPPED
        elif subject.cause is Cause.BEYOND_LOG:  # decided afresh, from where the log ends now
            await parked.forget_verdict(conn, applier.parked_sql, position, parked.Verdict.BEYOND_LOG)
            parking.verdicts = {p: v for p, v in parking.verdicts.items() if p != position}
        resolved = await applier.resolve(conn, [_within(c, threads) for c in classified], stored, parking)
        if resolved.unbound:
            raise _FreshKeysToBind()
        dead = await applier.apply_resolved(conn, resolved, parking, result)
        await parked.drop_unneeded_keyless(conn, applier.parked_sql, (topic, partition))
        await notify_applied(conn, applier.schema)
        if dead:
            await applier.sink(dead)
    again = "; parked again at " + ", ".join(s.name for s in result.parked) if result.parked else ""
    log.warning("released subject %s (%s): %d records, %d applied, %d dead letters%s", subject.name,
                subject.cause, len(records), result.applied, result.dead_letters, again)  # fmt: skip
    return Released(subject, len(records), result)
