"""What the projector decided at a re-published dead letter's new position (`graphledger dlq replay`).

A checkpoint event re-published is decided where it lands, not where it was dead-lettered: the one-writer
rule (docs/architecture.md, "One writer per thread") judges a protected put or writes against the thread as
the log holds it at the new position, so a put its writer took as counted may now be refused. The replay
waits, up to `consistency_timeout_s` for all its records together, until the projector's offsets
(`graphledger_offsets` of its consumer group, through `AppliedOffsets`, the one way a process waits for
them) pass each record's last offset, then reads what was recorded there: a refusal, a dead letter, a
record a parked subject holds, or nothing (applied). The projector writes each of these in the
transaction that moves its offset past the record, so once the offset is past, what is recorded is final.
A store event has no rule to pass and is not waited for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import asyncpg

from graphledger.settings import Settings
from graphledger.wire import Token
from graphledger_server.log import parked
from graphledger_server.log.applied import AppliedOffsets
from graphledger_server.log.parked import ParkedStatements
from graphledger_server.projection import dead_letters, forks

Position = tuple[str, int, int]


@dataclass(frozen=True, slots=True)
class Applied:
    """The projector applied it: a put or writes the rule let count, or an event the rule does not judge."""


@dataclass(frozen=True, slots=True)
class RefusedByRule:
    """The one-writer rule refused it at its new position (`graphledger_refusals`)."""

    reason: str


@dataclass(frozen=True, slots=True)
class DeadLetteredAgain:
    """The projector dead-lettered it again at its new position (Postgres refused it, say)."""

    dead_letter_id: int
    reason: str


@dataclass(frozen=True, slots=True)
class Parked:
    """A parked subject holds it (`graphledger parked list`): applied once the subject is released."""


@dataclass(frozen=True, slots=True)
class NotApplied:
    """The projector had not applied it when the wait ended (behind, or not running)."""

    timeout_s: float


@dataclass(frozen=True, slots=True)
class NotAwaited:
    """A store event: the one-writer rule does not judge it, so the replay does not wait for the projector."""


Decision = Applied | RefusedByRule | DeadLetteredAgain | Parked | NotApplied | NotAwaited


@dataclass(frozen=True, slots=True)
class Published:
    """A dead letter re-published: where its last record landed, and the thread its event is of."""

    dead_letter_id: int
    topic: str
    partition: int
    offset: int
    """Its last record's offset (a chunked event's last chunk): the position the projector decides it at."""
    thread_id: str | None
    """The thread of a checkpoint event (None: a store event, or one of no single thread)."""

    @property
    def position(self) -> Position:
        return self.topic, self.partition, self.offset

    @property
    def replayed_to(self) -> str:
        """`topic:partition@offset`, as `graphledger_dead_letters.replayed_to` records it."""
        return f"{self.topic}:{self.partition}@{self.offset}"


@dataclass(frozen=True, slots=True)
class Replayed:
    """A dead letter re-published, and what the projector decided at its new position."""

    published: Published
    decision: Decision


async def decide(settings: Settings, published: Sequence[Published]) -> list[Replayed]:
    """Each of `published` with its decision, waiting for those of the checkpoint topic (one deadline for all)."""
    awaited = [p for p in published if p.topic == settings.checkpoint_topic]
    if not awaited:
        return [Replayed(p, NotAwaited()) for p in published]
    timeout_s = settings.consistency_timeout_s
    token: Token = {}
    for p in awaited:
        token[p.topic, p.partition] = max(token.get((p.topic, p.partition), -1), p.offset)
    offsets = AppliedOffsets(settings.postgres_dsn, settings.postgres_schema, settings.projector_group_id)
    await offsets.start()
    try:
        await offsets.wait(token, timeout_s)
        applied = {p.position for p in awaited if offsets.applied(p.topic, p.partition) > p.offset}
    finally:
        await offsets.stop()
    schema = settings.postgres_schema
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        refused = await forks.refusals_at(conn, schema, applied)
        dead = await dead_letters.dead_letters_at(conn, schema, applied)
        held = await parked.parked_positions(conn, ParkedStatements(schema), applied)
    finally:
        await conn.close()

    def decision(p: Published) -> Decision:
        if p.topic != settings.checkpoint_topic:
            return NotAwaited()
        if p.position not in applied:
            return NotApplied(timeout_s)
        if (reason := refused.get(p.position)) is not None:
            return RefusedByRule(reason)
        if (letter := dead.get(p.position)) is not None:
            return DeadLetteredAgain(*letter)
        if p.position in held:
            return Parked()
        return Applied()

    return [Replayed(p, decision(p)) for p in published]
