"""Parked subjects: what the projector sets aside instead of stopping a partition (invariant 7).

A record no projector version can apply parks its *subject*, the records of its partition with the
same record key (a keyless record is a subject of its own): that record and every later one of the
subject go to `graphledger_parked_records` in the batch that meets them, the partition's offset moves
past them, and every other subject moves on. Causes:

- `newer_version`: an event from a newer graphledger (or a version no release wrote): an upgraded
  projector applies it once an operator releases it;
- `beyond_log`: a copy barrier naming a copy past the end of its partition's log, which no writer can
  have acknowledged;
- `copy_parked`: a copy barrier whose copy is parked itself, for an operator (one whose copy is parked to
  wait waits too);
- `waiting`: a copy barrier whose copy is in the log but not applied yet (or parked to wait itself). Not
  an operator's matter: the projector releases it once the copy's partition has passed the copy and the
  copy is not parked, and until then the partition's `waits_from` (in `graphledger_offsets`) keeps reads
  from counting it as applied beyond the barrier.

`graphledger parked list|release|skip` lists them and asks for a release (run them again: an upgraded
projector applies them, or they park again) or a skip (the first record is dead-lettered, the rest run
again). The projector that owns the partition carries the request out in a batch transaction, so
exactly-once holds: a released record is applied and deleted from here in one transaction. Skips are
remembered (`graphledger_parked_skips`), and a replay carries them over, so a rebuild decides as the
live projection did. Every statement on these tables is here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from graphledger_server.projection.dead_letters import decode_headers, encode_headers, reason_text
from graphledger_server.projection.records import SourceRecord, subject_ref
from graphledger_server.sql import check_schema, render

TopicPartition = tuple[str, int]
Position = tuple[str, int, int]

NEWER_VERSION = "newer_version"
BEYOND_LOG = "beyond_log"
COPY_PARKED = "copy_parked"
WAITING = "waiting"
OPERATOR_CAUSES = (NEWER_VERSION, BEYOND_LOG, COPY_PARKED)
"""The causes an operator resolves (alerted on); `waiting` resolves itself."""
ACTIONS = ("release", "skip")

_SUBJECT_COLUMNS = """p.topic, p.partition, p.first_offset, p.subject_key, p.cause, p.reason, p.event_type,
p.subject_ref, p.wait_partition, p.wait_offset, p.action, p.parked_at"""

# $1/$2 -> unnest(topic, partition): every parked subject of the partitions.
SUBJECTS_SQL = f"""
SELECT {_SUBJECT_COLUMNS} FROM {{schema}}.graphledger_parked p
JOIN unnest($1::text[], $2::int[]) AS u(topic, partition) ON p.topic = u.topic AND p.partition = u.partition
"""
# $1/$2 -> unnest(topic, partition), $3 group: the subjects to run again now (an operator asked, or a
# waiting barrier's copy has applied: its partition passed it, and it is not parked itself), oldest first.
RELEASABLE_SQL = f"""
SELECT {_SUBJECT_COLUMNS} FROM {{schema}}.graphledger_parked p
JOIN unnest($1::text[], $2::int[]) AS u(topic, partition) ON p.topic = u.topic AND p.partition = u.partition
WHERE p.action IS NOT NULL
   OR (p.cause = '{WAITING}' AND EXISTS (
        SELECT 1 FROM {{schema}}.graphledger_offsets o
        WHERE o.consumer_group = $3::text AND o.topic = p.topic AND o.partition = p.wait_partition
          AND o.next_offset > p.wait_offset)
       AND NOT EXISTS (
        SELECT 1 FROM {{schema}}.graphledger_parked_records r
        WHERE r.topic = p.topic AND r.partition = p.wait_partition AND r."offset" = p.wait_offset))
ORDER BY p.topic, p.partition, p.first_offset
"""
# $1..$3 -> unnest(topic, partition, first_offset): the records of those subjects, in log order.
RECORDS_SQL = """
SELECT r.topic, r.partition, r."offset", r.first_offset, r.record_key, r.record_value, r.record_headers,
       r.record_timestamp
FROM {schema}.graphledger_parked_records r
JOIN unnest($1::text[], $2::int[], $3::bigint[]) AS u(topic, partition, first_offset)
  ON r.topic = u.topic AND r.partition = u.partition AND r.first_offset = u.first_offset
ORDER BY r.topic, r.partition, r."offset"
"""
# $1..$3 -> unnest(topic, partition, first_offset): take those subjects (the ones still parked), with
# their records, to run them again in this transaction.
TAKE_SQL = """
WITH taken AS (
    DELETE FROM {schema}.graphledger_parked p
    USING unnest($1::text[], $2::int[], $3::bigint[]) AS u(topic, partition, first_offset)
    WHERE p.topic = u.topic AND p.partition = u.partition AND p.first_offset = u.first_offset
    RETURNING p.topic, p.partition, p.first_offset, p.action
), records AS (
    DELETE FROM {schema}.graphledger_parked_records r USING taken t
    WHERE r.topic = t.topic AND r.partition = t.partition AND r.first_offset = t.first_offset
)
SELECT topic, partition, first_offset, action FROM taken
"""
# $1..$10 -> unnest(topic, partition, first_offset, subject_key, cause, reason, event_type, subject_ref,
# wait_partition, wait_offset).
INSERT_SUBJECTS_SQL = """
INSERT INTO {schema}.graphledger_parked
    (topic, partition, first_offset, subject_key, cause, reason, event_type, subject_ref, wait_partition, wait_offset)
SELECT * FROM unnest($1::text[], $2::int[], $3::bigint[], $4::bytea[], $5::text[], $6::text[], $7::text[],
                     $8::text[], $9::int[], $10::bigint[])
"""
# $1..$8 -> unnest(topic, partition, offset, first_offset, key, value, headers, timestamp).
INSERT_RECORDS_SQL = """
INSERT INTO {schema}.graphledger_parked_records
    (topic, partition, "offset", first_offset, record_key, record_value, record_headers, record_timestamp)
SELECT * FROM unnest($1::text[], $2::int[], $3::bigint[], $4::bigint[], $5::bytea[], $6::bytea[], $7::bytea[],
                     $8::bigint[])
ON CONFLICT (topic, partition, "offset") DO NOTHING
"""
# $1..$3 -> unnest(topic, partition, offset): those positions whose record is parked, with the cause of
# the subject holding it.
PARKED_POSITIONS_SQL = """
SELECT r.topic, r.partition, r."offset", p.cause FROM {schema}.graphledger_parked_records r
JOIN unnest($1::text[], $2::int[], $3::bigint[]) AS u(topic, partition, off)
  ON r.topic = u.topic AND r.partition = u.partition AND r."offset" = u.off
JOIN {schema}.graphledger_parked p
  ON p.topic = r.topic AND p.partition = r.partition AND p.first_offset = r.first_offset
"""
# $1..$3 -> unnest(topic, partition, offset): those positions an operator skipped.
SKIPPED_SQL = """
SELECT s.topic, s.partition, s."offset" FROM {schema}.graphledger_parked_skips s
JOIN unnest($1::text[], $2::int[], $3::bigint[]) AS u(topic, partition, off)
  ON s.topic = u.topic AND s.partition = u.partition AND s."offset" = u.off
"""
# $1..$3 -> unnest(topic, partition, offset).
INSERT_SKIPS_SQL = """
INSERT INTO {schema}.graphledger_parked_skips (topic, partition, "offset")
SELECT * FROM unnest($1::text[], $2::int[], $3::bigint[])
ON CONFLICT DO NOTHING
"""
# $1/$2 -> unnest(topic, partition): per partition, how many subjects are parked and the first record of
# a waiting one.
STATE_SQL = f"""
SELECT p.topic, p.partition, count(*) AS subjects,
       min(p.first_offset) FILTER (WHERE p.cause = '{WAITING}') AS waits_from
FROM {{schema}}.graphledger_parked p
JOIN unnest($1::text[], $2::int[]) AS u(topic, partition) ON p.topic = u.topic AND p.partition = u.partition
GROUP BY p.topic, p.partition
"""
# For the gauge: subjects awaiting an operator, per topic and cause.
COUNTS_SQL = f"""
SELECT topic, cause, count(*) AS n FROM {{schema}}.graphledger_parked
WHERE cause <> '{WAITING}' GROUP BY topic, cause
"""
# $1 limit.
LIST_SQL = f"""
SELECT {_SUBJECT_COLUMNS},
       (SELECT count(*) FROM {{schema}}.graphledger_parked_records r
        WHERE r.topic = p.topic AND r.partition = p.partition AND r.first_offset = p.first_offset) AS records
FROM {{schema}}.graphledger_parked p ORDER BY p.parked_at, p.topic, p.partition, p.first_offset LIMIT $1::int
"""
# $1 topic, $2 partition, $3 first offset, $4 action.
REQUEST_SQL = """
UPDATE {schema}.graphledger_parked SET action = $4::text
WHERE topic = $1::text AND partition = $2::int AND first_offset = $3::bigint
RETURNING cause
"""
# Schema to schema (a replay): the skips of $1's table into this one's.
COPY_SKIPS_SQL = """
INSERT INTO {schema}.graphledger_parked_skips (topic, partition, "offset", skipped_at)
SELECT topic, partition, "offset", skipped_at FROM {source}.graphledger_parked_skips
ON CONFLICT DO NOTHING
"""
SKIPS_TABLE_SQL = "SELECT to_regclass($1::text)"
# Parked subjects whose first record was skipped (after a copy of skips): carry the skip out.
MARK_SKIPPED_SQL = """
UPDATE {schema}.graphledger_parked p SET action = 'skip'
FROM {schema}.graphledger_parked_skips s
WHERE p.topic = s.topic AND p.partition = s.partition AND p.first_offset = s."offset" AND p.action IS NULL
"""


@dataclass(frozen=True, slots=True)
class ParkedSubject:
    """One parked subject: where its first record is, why it parked, and what an operator asked."""

    topic: str
    partition: int
    first_offset: int
    subject_key: bytes | None
    cause: str
    reason: str
    event_type: str | None = None
    subject_ref: str | None = None
    wait: tuple[int, int] | None = None
    """A waiting barrier's copy: (partition, offset) on the same topic."""
    action: str | None = None

    @property
    def tp(self) -> TopicPartition:
        return (self.topic, self.partition)

    @property
    def name(self) -> str:
        """How the command line names it: `topic:partition@first_offset`."""
        return f"{self.topic}:{self.partition}@{self.first_offset}"


@dataclass(slots=True)
class Release:
    """A parked subject to run again, with its records in log order (read before the batch)."""

    subject: ParkedSubject
    records: list[SourceRecord]


@dataclass(frozen=True, slots=True)
class PartitionState:
    """After a batch: how many subjects of a partition are parked, and whether one waits (the projector
    checks waiting ones often, the rest when an operator may have acted)."""

    subjects: int
    waiting: bool


def subject_key(record: SourceRecord) -> bytes | None:
    """The record's subject within its partition: a digest of its record key (None: keyless, alone)."""
    return None if record.key is None else hashlib.sha256(record.key).digest()


def new_subject(
    record: SourceRecord, cause: str, reason: str, event_type: str | None, wait: tuple[int, int] | None = None
) -> ParkedSubject:
    return ParkedSubject(
        record.topic, record.partition, record.offset, subject_key(record), cause, reason_text(reason), event_type,
        subject_ref(record), wait,
    )  # fmt: skip


class ParkedStatements:
    def __init__(self, schema: str) -> None:
        self.schema = schema
        self.subjects = render(SUBJECTS_SQL, schema)
        self.releasable = render(RELEASABLE_SQL, schema)
        self.records = render(RECORDS_SQL, schema)
        self.take = render(TAKE_SQL, schema)
        self.insert_subjects = render(INSERT_SUBJECTS_SQL, schema)
        self.insert_records = render(INSERT_RECORDS_SQL, schema)
        self.parked_positions = render(PARKED_POSITIONS_SQL, schema)
        self.skipped = render(SKIPPED_SQL, schema)
        self.insert_skips = render(INSERT_SKIPS_SQL, schema)
        self.state = render(STATE_SQL, schema)
        self.counts = render(COUNTS_SQL, schema)
        self.list = render(LIST_SQL, schema)
        self.request = render(REQUEST_SQL, schema)
        self.mark_skipped = render(MARK_SKIPPED_SQL, schema)


def _partitions(tps: Iterable[TopicPartition]) -> tuple[list[str], list[int]]:
    wanted = sorted(set(tps))
    return [t for t, _ in wanted], [p for _, p in wanted]


def _positions(positions: Iterable[Position]) -> tuple[list[str], list[int], list[int]]:
    wanted = sorted(set(positions))
    return [t for t, _, _ in wanted], [p for _, p, _ in wanted], [o for _, _, o in wanted]


def _subject(row: Mapping[str, Any]) -> ParkedSubject:
    wait = None if row["wait_partition"] is None else (row["wait_partition"], row["wait_offset"])
    return ParkedSubject(
        row["topic"], row["partition"], row["first_offset"], row["subject_key"], row["cause"], row["reason"],
        row["event_type"], row["subject_ref"], wait, row["action"],
    )  # fmt: skip


async def subjects(
    conn: asyncpg.Connection, sql: ParkedStatements, tps: Collection[TopicPartition]
) -> list[ParkedSubject]:
    """Every parked subject of the partitions."""
    if not tps:
        return []
    return [_subject(r) for r in await conn.fetch(sql.subjects, *_partitions(tps))]


async def releasable(
    conn: asyncpg.Connection, sql: ParkedStatements, group: str, tps: Collection[TopicPartition]
) -> list[Release]:
    """The subjects of the partitions to run again now, with their records (a plain read: the batch that
    runs them takes them only if they are still parked)."""
    if not tps:
        return []
    found = [_subject(r) for r in await conn.fetch(sql.releasable, *_partitions(tps), group)]
    if not found:
        return []
    rows = await conn.fetch(
        sql.records, [s.topic for s in found], [s.partition for s in found], [s.first_offset for s in found]
    )
    by_subject: dict[tuple[str, int, int], list[SourceRecord]] = {}
    for r in rows:
        record = SourceRecord(
            r["topic"], r["partition"], r["offset"], r["record_key"], r["record_value"],
            tuple(decode_headers(r["record_headers"])), r["record_timestamp"],
        )  # fmt: skip
        by_subject.setdefault((r["topic"], r["partition"], r["first_offset"]), []).append(record)
    return [Release(s, by_subject.get((s.topic, s.partition, s.first_offset), [])) for s in found]


async def take(
    conn: asyncpg.Connection, sql: ParkedStatements, wanted: Sequence[ParkedSubject]
) -> dict[tuple[str, int, int], str | None]:
    """Delete the subjects (and their records) still parked, in the caller's transaction: what was
    taken, with the action asked for it (a subject another batch took meanwhile is absent)."""
    if not wanted:
        return {}
    rows = await conn.fetch(
        sql.take, [s.topic for s in wanted], [s.partition for s in wanted], [s.first_offset for s in wanted]
    )
    return {(r["topic"], r["partition"], r["first_offset"]): r["action"] for r in rows}


async def park(
    conn: asyncpg.Connection,
    sql: ParkedStatements,
    new: Sequence[ParkedSubject],
    records: Sequence[tuple[ParkedSubject, SourceRecord]],
) -> None:
    """Record new parked subjects and the records joining parked subjects."""
    if new:
        await conn.execute(
            sql.insert_subjects,
            [s.topic for s in new],
            [s.partition for s in new],
            [s.first_offset for s in new],
            [s.subject_key for s in new],
            [s.cause for s in new],
            [s.reason for s in new],
            [s.event_type for s in new],
            [s.subject_ref for s in new],
            [s.wait[0] if s.wait else None for s in new],
            [s.wait[1] if s.wait else None for s in new],
        )
    if records:
        await conn.execute(
            sql.insert_records,
            [r.topic for _, r in records],
            [r.partition for _, r in records],
            [r.offset for _, r in records],
            [s.first_offset for s, _ in records],
            [r.key for _, r in records],
            [r.value for _, r in records],
            [encode_headers(r.headers) for _, r in records],
            [r.timestamp for _, r in records],
        )


async def parked_positions(
    conn: asyncpg.Connection, sql: ParkedStatements, positions: Collection[Position]
) -> dict[Position, str]:
    """Which of the positions hold a parked record, each with the cause of the subject holding it."""
    if not positions:
        return {}
    return {
        (r["topic"], r["partition"], r["offset"]): r["cause"]
        for r in await conn.fetch(sql.parked_positions, *_positions(positions))
    }


async def skipped(conn: asyncpg.Connection, sql: ParkedStatements, positions: Collection[Position]) -> set[Position]:
    """Which of the positions an operator skipped (dead-lettered instead of parked again)."""
    if not positions:
        return set()
    return {(r["topic"], r["partition"], r["offset"]) for r in await conn.fetch(sql.skipped, *_positions(positions))}


async def remember_skips(conn: asyncpg.Connection, sql: ParkedStatements, positions: Collection[Position]) -> None:
    if positions:
        await conn.execute(sql.insert_skips, *_positions(positions))


async def state(
    conn: asyncpg.Connection, sql: ParkedStatements, tps: Collection[TopicPartition]
) -> dict[TopicPartition, tuple[int, int | None]]:
    """Per partition with parked subjects: how many, and the first record of a waiting one (or None)."""
    if not tps:
        return {}
    return {
        (r["topic"], r["partition"]): (r["subjects"], r["waits_from"])
        for r in await conn.fetch(sql.state, *_partitions(tps))
    }


async def counts(conn: asyncpg.Connection, sql: ParkedStatements) -> dict[tuple[str, str], int]:
    """Subjects awaiting an operator per (topic, cause)."""
    return {(r["topic"], r["cause"]): r["n"] for r in await conn.fetch(sql.counts)}


async def list_parked(conn: asyncpg.Connection, schema: str, limit: int = 100) -> list[dict[str, Any]]:
    """The parked subjects, oldest first, for the command line (`parked_at` in ISO 8601)."""
    rows = await conn.fetch(render(LIST_SQL, schema), limit)
    out = []
    for r in rows:
        s = _subject(r)
        out.append(
            {
                "subject": s.name,
                "topic": s.topic,
                "partition": s.partition,
                "first_offset": s.first_offset,
                "keyless": s.subject_key is None,
                "cause": s.cause,
                "reason": s.reason,
                "event_type": s.event_type,
                "subject_ref": s.subject_ref,
                "records": r["records"],
                "action": s.action,
                "parked_at": r["parked_at"].isoformat(),
            }
        )
    return out


async def request(
    conn: asyncpg.Connection, schema: str, topic: str, partition: int, first_offset: int, action: str
) -> str | None:
    """Ask the owning projector to `release` or `skip` a parked subject; its cause, None if none is parked there."""
    if action not in ACTIONS:
        raise ValueError(f"action {action!r} is not one of {ACTIONS}")
    return await conn.fetchval(render(REQUEST_SQL, schema), topic, partition, first_offset, action)


async def carry_skips(conn: asyncpg.Connection, source: str, target: str) -> None:
    """Copy `source`'s skips into `target` (a replay's rebuild), and have `target`'s projector carry out
    those that apply to subjects it parked."""
    if await conn.fetchval(SKIPS_TABLE_SQL, f"{check_schema(source)}.graphledger_parked_skips") is None:
        return  # a live schema not migrated this far skipped nothing
    await conn.execute(render(COPY_SKIPS_SQL, target).replace("{source}", check_schema(source)))
    await conn.execute(render(MARK_SKIPPED_SQL, target))
