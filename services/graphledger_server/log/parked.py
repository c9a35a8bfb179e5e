"""Parked subjects, the records they hold, and record verdicts: every statement on those three tables.

This module owns `graphledger_parked_subjects`, `graphledger_held_records` and
`graphledger_record_verdicts` (migration 0011 says what each holds). The projector's batch transaction
parks subjects and holds their records here, beside the offsets it advances past them; a release takes a
subject with its records in the transaction that applies them (`projection/batch.py`); the read API reads
which record keys are parked with the applied offsets (`log/applied.py`); the replay carries the live
schema's verdicts into its rebuild; `graphledger parked` lists them. None of them writes SQL of its own.

A subject's name on the command line and in errors is `topic:partition@offset`, the position of the
record that parked it.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

import asyncpg
import ormsgpack

from graphledger.errors import ParkedSubjectError
from graphledger_server.sql import check_schema, render

TopicPartition = tuple[str, int]
Position = tuple[str, int, int]


class Cause(StrEnum):
    """Why a subject is parked."""

    NEWER_VERSION = "newer_version"
    """A record of an envelope version this projector does not read: a newer graphledger wrote it, or a
    producer forged it. A projector that reads the version releases it; an operator drops a forged one."""
    BEYOND_LOG = "beyond_log"
    """A copy barrier naming a copy beyond the end of its partition's log when the barrier was read: no
    acknowledged copy is there, so it would hold its partition for ever. An operator drops it."""
    COPY_PARKED = "copy_parked"
    """A copy barrier whose copy's record is held by a parked subject: the copy has staged nothing yet. The
    projector releases it once the copy has applied."""


class Verdict(StrEnum):
    """What was decided about one record, for every later reader of the log (a rebuild, a reset)."""

    BEYOND_LOG = "beyond_log"
    DROPPED = "dropped"


@dataclass(frozen=True, slots=True)
class ParkedSubject:
    """One parked subject: where its first record is, whose records it holds, and why it is parked."""

    topic: str
    partition: int
    first_offset: int
    record_key: bytes | None
    """The key of its records; None: a keyless record, parked alone."""
    cause: Cause
    reason: str
    event_type: str | None = None
    subject_ref: str | None = None
    """The first record's `gl-subject` header (a sealed event's subject reference)."""
    event_version: int | None = None
    parked_by_version: int = 0
    """The `SCHEMA_VERSION` of the projector that parked it."""
    waits_for: tuple[int, int] | None = None
    """`copy_parked`: the copy record's (partition, offset) on the same topic."""
    parked_at_ms: int | None = None
    """The first record's time in the log (ms since the epoch)."""

    @property
    def tp(self) -> TopicPartition:
        return (self.topic, self.partition)

    @property
    def name(self) -> str:
        return subject_name(self.topic, self.partition, self.first_offset)


def subject_name(topic: str, partition: int, offset: int) -> str:
    return f"{topic}:{partition}@{offset}"


_NAME = re.compile(r"^(?P<topic>[^:@\s]+):(?P<partition>\d{1,9})@(?P<offset>\d{1,19})$")


def parse_subject_name(text: str) -> Position:
    """`topic:partition@offset` as a position; `ParkedSubjectError` naming the text otherwise."""
    found = _NAME.match(text)
    if found is None:
        raise ParkedSubjectError(f"{text[:200]!r} is not a parked subject's name (topic:partition@offset)")
    return found["topic"], int(found["partition"]), int(found["offset"])


_SUBJECT_COLUMNS = """topic, partition, first_offset, record_key, cause, reason, event_type, subject_ref,
event_version, parked_by_version, waits_for_partition, waits_for_offset, parked_at"""

# $1/$2 -> unnest(topic, partition): the keyed parked subjects of those partitions (a batch's).
KEYED_OF_PARTITIONS_SQL = """
SELECT p.topic, p.partition, p.record_key, p.first_offset FROM {schema}.graphledger_parked_subjects p
JOIN unnest($1::text[], $2::int[]) AS u(topic, partition) ON p.topic = u.topic AND p.partition = u.partition
WHERE p.record_key IS NOT NULL
"""
# Every keyed parked subject (the read API's view, read after the applied offsets).
KEYED_SQL = """
SELECT topic, partition, record_key, first_offset, cause FROM {schema}.graphledger_parked_subjects
WHERE record_key IS NOT NULL
"""
# Every parked subject (the projector's periodic look: the gauge, and what it may release).
SUBJECTS_SQL = f"SELECT {_SUBJECT_COLUMNS} FROM {{schema}}.graphledger_parked_subjects"
# $1..$10 -> unnest(...) of new subjects, $11 -> their times (ms since the epoch, null: none).
INSERT_SUBJECTS_SQL = """
INSERT INTO {schema}.graphledger_parked_subjects
    (topic, partition, first_offset, record_key, cause, reason, event_type, subject_ref, event_version,
     parked_by_version, waits_for_partition, waits_for_offset, parked_at)
SELECT u.topic, u.partition, u.first_offset, u.record_key, u.cause, u.reason, u.event_type, u.subject_ref,
       u.event_version, u.parked_by_version, u.waits_for_partition, u.waits_for_offset,
       'epoch'::timestamptz + u.parked_at_ms * interval '1 millisecond'
FROM unnest($1::text[], $2::int[], $3::bigint[], $4::bytea[], $5::text[], $6::text[], $7::text[], $8::text[],
            $9::int[], $10::int[], $11::int[], $12::bigint[], $13::bigint[])
    AS u(topic, partition, first_offset, record_key, cause, reason, event_type, subject_ref, event_version,
         parked_by_version, waits_for_partition, waits_for_offset, parked_at_ms)
ON CONFLICT DO NOTHING
"""
# $1..$8 -> unnest(topic, partition, offset, first_offset (null: keyless, kept for every subject), key,
# value, headers, timestamp). A record held already (a batch run again after an offsets reset) stays.
INSERT_HELD_SQL = """
INSERT INTO {schema}.graphledger_held_records
    (topic, partition, "offset", first_offset, record_key, record_value, record_headers, record_timestamp)
SELECT * FROM unnest($1::text[], $2::int[], $3::bigint[], $4::bigint[], $5::bytea[], $6::bytea[], $7::bytea[],
                     $8::bigint[])
ON CONFLICT (topic, partition, "offset") DO NOTHING
"""
# $1..$3 -> unnest(topic, partition, offset): which of those positions a parked subject holds.
HELD_POSITIONS_SQL = """
SELECT h.topic, h.partition, h."offset" FROM {schema}.graphledger_held_records h
JOIN unnest($1::text[], $2::int[], $3::bigint[]) AS u(topic, partition, off)
  ON h.topic = u.topic AND h.partition = u.partition AND h."offset" = u.off
WHERE h.first_offset IS NOT NULL
"""
# $1 topic, $2 partition, $3 first offset: take the subject (locked by the delete until the transaction
# ends, so two releases of one subject release it once).
TAKE_SUBJECT_SQL = f"""
DELETE FROM {{schema}}.graphledger_parked_subjects
WHERE topic = $1::text AND partition = $2::int AND first_offset = $3::bigint
RETURNING {_SUBJECT_COLUMNS}
"""
# $1 topic, $2 partition, $3 first offset: take the subject's records, and read the keyless ones kept
# since its first (they stay for the partition's other parked subjects), in log order.
TAKE_HELD_SQL = """
WITH own AS (
    DELETE FROM {schema}.graphledger_held_records
    WHERE topic = $1::text AND partition = $2::int AND first_offset = $3::bigint
    RETURNING "offset", first_offset, record_key, record_value, record_headers, record_timestamp
)
SELECT * FROM own
UNION ALL
SELECT "offset", first_offset, record_key, record_value, record_headers, record_timestamp
FROM {schema}.graphledger_held_records
WHERE topic = $1::text AND partition = $2::int AND first_offset IS NULL AND "offset" > $3::bigint
ORDER BY "offset"
"""
# $1 topic, $2 partition: drop the keyless records no keyed subject of the partition still needs (those
# below its oldest one's first record; every one when none is left).
DROP_UNNEEDED_KEYLESS_SQL = """
DELETE FROM {schema}.graphledger_held_records h
WHERE h.topic = $1::text AND h.partition = $2::int AND h.first_offset IS NULL
  AND h."offset" < coalesce(
        (SELECT min(p.first_offset) FROM {schema}.graphledger_parked_subjects p
         WHERE p.topic = $1::text AND p.partition = $2::int AND p.record_key IS NOT NULL),
        9223372036854775807)
"""
# $1..$3 -> unnest(topic, partition, offset): the verdicts on those positions.
VERDICTS_SQL = """
SELECT v.topic, v.partition, v."offset", v.verdict FROM {schema}.graphledger_record_verdicts v
JOIN unnest($1::text[], $2::int[], $3::bigint[]) AS u(topic, partition, off)
  ON v.topic = u.topic AND v.partition = u.partition AND v."offset" = u.off
"""
# $1..$4 -> unnest(topic, partition, offset, verdict): a later verdict replaces an earlier one (a dropped
# barrier was beyond the log first).
SET_VERDICTS_SQL = """
INSERT INTO {schema}.graphledger_record_verdicts (topic, partition, "offset", verdict)
SELECT * FROM unnest($1::text[], $2::int[], $3::bigint[], $4::text[])
ON CONFLICT (topic, partition, "offset") DO UPDATE SET verdict = EXCLUDED.verdict, decided_at = now()
"""
# $1 topic, $2 partition, $3 offset, $4 verdict: forget that verdict (a release decides afresh).
FORGET_VERDICT_SQL = """
DELETE FROM {schema}.graphledger_record_verdicts
WHERE topic = $1::text AND partition = $2::int AND "offset" = $3::bigint AND verdict = $4::text
"""
# Schema to schema (a rebuild): the live schema's verdicts ({source}) into this one's.
CARRY_VERDICTS_SQL = """
INSERT INTO {schema}.graphledger_record_verdicts (topic, partition, "offset", verdict, decided_at)
SELECT topic, partition, "offset", verdict, decided_at FROM {source}.graphledger_record_verdicts
ON CONFLICT (topic, partition, "offset") DO UPDATE SET verdict = EXCLUDED.verdict, decided_at = EXCLUDED.decided_at
"""
VERDICTS_TABLE_SQL = "SELECT to_regclass($1::text) IS NOT NULL"
# $1 limit: the parked subjects, oldest first, with how many records each holds.
LIST_SQL = f"""
SELECT {_SUBJECT_COLUMNS},
       (SELECT count(*) FROM {{schema}}.graphledger_held_records h
        WHERE h.topic = p.topic AND h.partition = p.partition AND h.first_offset = p.first_offset) AS records
FROM {{schema}}.graphledger_parked_subjects p
ORDER BY p.parked_at NULLS LAST, p.topic, p.partition, p.first_offset
LIMIT $1::int
"""


class ParkedStatements:
    """The statements on one schema's parking tables, rendered once."""

    def __init__(self, schema: str) -> None:
        self.schema = schema
        self.keyed_of_partitions = render(KEYED_OF_PARTITIONS_SQL, schema)
        self.keyed = render(KEYED_SQL, schema)
        self.subjects = render(SUBJECTS_SQL, schema)
        self.insert_subjects = render(INSERT_SUBJECTS_SQL, schema)
        self.insert_parked = render(INSERT_HELD_SQL, schema)
        self.parked_positions = render(HELD_POSITIONS_SQL, schema)
        self.take_subject = render(TAKE_SUBJECT_SQL, schema)
        self.take_parked = render(TAKE_HELD_SQL, schema)
        self.drop_unneeded_keyless = render(DROP_UNNEEDED_KEYLESS_SQL, schema)
        self.verdicts = render(VERDICTS_SQL, schema)
        self.set_verdicts = render(SET_VERDICTS_SQL, schema)
        self.forget_verdict = render(FORGET_VERDICT_SQL, schema)
        self.list = render(LIST_SQL, schema)


Header = tuple[str, bytes]


@dataclass(frozen=True, slots=True)
class ParkedRecord:
    """A record as a parked subject holds it (`first_offset`: the subject's; None: a keyless record kept
    for every keyed subject of its partition)."""

    topic: str
    partition: int
    offset: int
    first_offset: int | None
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...]
    timestamp: int


def _partitions(tps: Iterable[TopicPartition]) -> tuple[list[str], list[int]]:
    wanted = sorted(set(tps))
    return [t for t, _ in wanted], [p for _, p in wanted]


def _positions(positions: Iterable[Position]) -> tuple[list[str], list[int], list[int]]:
    wanted = sorted(set(positions))
    return [t for t, _, _ in wanted], [p for _, p, _ in wanted], [o for _, _, o in wanted]


def _ms(at: datetime | None) -> int | None:
    return None if at is None else int(at.timestamp() * 1000)


def _subject(row: Mapping[str, Any]) -> ParkedSubject:
    waits = None if row["waits_for_partition"] is None else (row["waits_for_partition"], row["waits_for_offset"])
    return ParkedSubject(
        row["topic"], row["partition"], row["first_offset"], row["record_key"], Cause(row["cause"]), row["reason"],
        row["event_type"], row["subject_ref"], row["event_version"], row["parked_by_version"], waits,
        _ms(row["parked_at"]),
    )  # fmt: skip


def encode_headers(headers: Sequence[tuple[str, bytes]]) -> bytes:
    """A held record's headers as its row keeps them: every one, `gl-chunk` too (it is applied from them)."""
    return ormsgpack.packb([[k, v] for k, v in headers])


def _held(topic: str, partition: int, row: Mapping[str, Any]) -> ParkedRecord:
    headers = tuple((k, v) for k, v in ormsgpack.unpackb(row["record_headers"]))
    return ParkedRecord(
        topic, partition, row["offset"], row["first_offset"], row["record_key"], row["record_value"], headers,
        row["record_timestamp"],
    )  # fmt: skip


async def keyed_of_partitions(
    conn: asyncpg.Connection, sql: ParkedStatements, tps: Collection[TopicPartition]
) -> dict[tuple[TopicPartition, bytes], int]:
    """`(partition, record key) -> first offset` of the keyed parked subjects of `tps`."""
    if not tps:
        return {}
    rows = await conn.fetch(sql.keyed_of_partitions, *_partitions(tps))
    return {((r["topic"], r["partition"]), r["record_key"]): r["first_offset"] for r in rows}


async def keyed(conn: asyncpg.Connection, sql: ParkedStatements) -> dict[tuple[TopicPartition, bytes], str]:
    """`(partition, record key) -> subject name and cause` of every keyed parked subject, for reads."""
    return keyed_of_rows(await conn.fetch(sql.keyed))


def keyed_of_rows(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[TopicPartition, bytes], str]:
    """`keyed`'s answer from rows of `KEYED_SQL`'s columns (a caller that reads them within its own statement)."""
    return {
        ((r["topic"], r["partition"]), r["record_key"]): (
            f"{subject_name(r['topic'], r['partition'], r['first_offset'])} ({r['cause']})"
        )
        for r in rows
    }


async def subjects(conn: asyncpg.Connection, sql: ParkedStatements) -> list[ParkedSubject]:
    return [_subject(r) for r in await conn.fetch(sql.subjects)]


async def park(
    conn: asyncpg.Connection, sql: ParkedStatements, new: Sequence[ParkedSubject], held: Sequence[ParkedRecord]
) -> None:
    """Record new parked subjects, and the records they hold or keep (in the caller's transaction)."""
    if new:
        await conn.execute(
            sql.insert_subjects,
            [s.topic for s in new],
            [s.partition for s in new],
            [s.first_offset for s in new],
            [s.record_key for s in new],
            [str(s.cause) for s in new],
            [s.reason for s in new],
            [s.event_type for s in new],
            [s.subject_ref for s in new],
            [s.event_version for s in new],
            [s.parked_by_version for s in new],
            [None if s.waits_for is None else s.waits_for[0] for s in new],
            [None if s.waits_for is None else s.waits_for[1] for s in new],
            [s.parked_at_ms for s in new],
        )
    if held:
        await conn.execute(
            sql.insert_parked,
            [h.topic for h in held],
            [h.partition for h in held],
            [h.offset for h in held],
            [h.first_offset for h in held],
            [h.key for h in held],
            [h.value for h in held],
            [encode_headers(h.headers) for h in held],
            [h.timestamp for h in held],
        )


async def parked_positions(
    conn: asyncpg.Connection, sql: ParkedStatements, positions: Collection[Position]
) -> set[Position]:
    """Which of `positions` hold a record a parked subject holds."""
    if not positions:
        return set()
    rows = await conn.fetch(sql.parked_positions, *_positions(positions))
    return {(r["topic"], r["partition"], r["offset"]) for r in rows}


async def take(
    conn: asyncpg.Connection, sql: ParkedStatements, position: Position
) -> tuple[ParkedSubject, list[ParkedRecord]] | None:
    """Delete the subject parked at `position` and its records, in the caller's transaction: the subject and
    its records, with the keyless records kept since its first, in log order (None: none is parked there)."""
    row = await conn.fetchrow(sql.take_subject, *position)
    if row is None:
        return None
    topic, partition, first = position
    rows = await conn.fetch(sql.take_parked, topic, partition, first)
    return _subject(row), [_held(topic, partition, r) for r in rows]


async def drop_unneeded_keyless(conn: asyncpg.Connection, sql: ParkedStatements, tp: TopicPartition) -> None:
    await conn.execute(sql.drop_unneeded_keyless, *tp)


async def verdicts(
    conn: asyncpg.Connection, sql: ParkedStatements, positions: Collection[Position]
) -> dict[Position, Verdict]:
    """The verdicts on those of `positions` that have one."""
    if not positions:
        return {}
    rows = await conn.fetch(sql.verdicts, *_positions(positions))
    return {(r["topic"], r["partition"], r["offset"]): Verdict(r["verdict"]) for r in rows}


async def set_verdicts(conn: asyncpg.Connection, sql: ParkedStatements, decided: Mapping[Position, Verdict]) -> None:
    if decided:
        items = sorted(decided.items())
        await conn.execute(
            sql.set_verdicts,
            [t for (t, _, _), _ in items],
            [p for (_, p, _), _ in items],
            [o for (_, _, o), _ in items],
            [str(v) for _, v in items],
        )


async def forget_verdict(conn: asyncpg.Connection, sql: ParkedStatements, position: Position, verdict: Verdict) -> None:
    await conn.execute(sql.forget_verdict, *position, str(verdict))


async def carry_verdicts(conn: asyncpg.Connection, source: str, target: str) -> None:
    """Copy `source`'s verdicts into `target` (a rebuild of `source`), so the rebuild decides as it did."""
    if not await conn.fetchval(VERDICTS_TABLE_SQL, f"{check_schema(source)}.graphledger_record_verdicts"):
        return  # a live schema not migrated this far decided nothing
    await conn.execute(render(CARRY_VERDICTS_SQL, target).replace("{source}", check_schema(source)))


async def list_parked(conn: asyncpg.Connection, schema: str, limit: int = 100) -> list[dict[str, Any]]:
    """The parked subjects, oldest first, for the command line."""
    out = []
    for r in await conn.fetch(render(LIST_SQL, schema), limit):
        s = _subject(r)
        out.append(
            {
                "subject": s.name,
                "cause": str(s.cause),
                "reason": s.reason,
                "event_type": s.event_type,
                "subject_ref": s.subject_ref,
                "record_key": None if s.record_key is None else s.record_key.decode(errors="replace"),
                "records": r["records"],
                "parked_at": None if r["parked_at"] is None else r["parked_at"].astimezone(UTC).isoformat(),
            }
        )
    return out
