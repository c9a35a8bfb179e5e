"""Dead letters: the record for the dead-letter topic, and the `graphledger_dead_letters` row.

The dead-letter record carries the original key, value and headers plus why and where it came from;
the row keeps the same (a chunked event reassembled), so `graphledger dlq` can inspect and republish
it from Postgres alone. Both are copies of the event: their headers carry its time in `gl-appended-ms`,
so a republished event keeps it. Both are written before the batch commits, and the row's key
(topic, partition, offset) makes a retried batch add no second row. Every statement on the table is here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import asyncpg
import ormsgpack

from graphledger.events import envelope
from graphledger.events.chunks import frame
from graphledger.log.layout import PartitionCheckedProducer
from graphledger.opening.records import DeadLetter, subject_ref, with_append_time
from graphledger.settings import Settings
from graphledger_server.sql import render

log = logging.getLogger(__name__)

HEADER_REASON = "gl-dlq-reason"
HEADER_TOPIC = "gl-dlq-topic"
HEADER_PARTITION = "gl-dlq-partition"
HEADER_OFFSET = "gl-dlq-offset"

MAX_REASON_CHARS = 2000
SEALED_REASON = "the reason is in graphledger_dead_letters"

# $1..$9 -> unnest(topic, partition, offset, event_type, reason, record_key, record_value, record_headers,
# subject_ref).
INSERT_DEAD_LETTERS_SQL = """
INSERT INTO {schema}.graphledger_dead_letters
    (topic, partition, "offset", event_type, reason, record_key, record_value, record_headers, subject_ref)
SELECT * FROM unnest($1::text[], $2::int[], $3::bigint[], $4::text[], $5::text[], $6::bytea[], $7::bytea[],
                     $8::bytea[], $9::text[])
ON CONFLICT (topic, partition, "offset") DO NOTHING
"""

DEAD_LETTER_COLUMNS = """id, topic, partition, "offset", event_type, reason, recorded_at, replayed_at, replayed_to,
record_key, record_value, record_headers"""
# $1 also those replayed already, $2 limit.
LIST_DEAD_LETTERS_SQL = f"""SELECT {DEAD_LETTER_COLUMNS} FROM {{schema}}.graphledger_dead_letters
WHERE $1::bool OR replayed_at IS NULL ORDER BY id LIMIT $2::int"""
# $1 id.
DEAD_LETTER_SQL = f"SELECT {DEAD_LETTER_COLUMNS} FROM {{schema}}.graphledger_dead_letters WHERE id = $1::bigint"
# $1 id: the row locked until the transaction ends, so two replays of one dead letter publish it once.
LOCK_DEAD_LETTER_SQL = DEAD_LETTER_SQL + " FOR UPDATE"
# $1 id, $2 where it went.
MARK_REPLAYED_SQL = """UPDATE {schema}.graphledger_dead_letters SET replayed_at = now(), replayed_to = $2::text
WHERE id = $1::bigint"""

# $1..$3 -> unnest(topic, partition, offset): the dead letters recorded at those positions.
DEAD_LETTERS_AT_SQL = """
SELECT d.id, d.topic, d.partition, d."offset", d.reason FROM {schema}.graphledger_dead_letters d
JOIN unnest($1::text[], $2::int[], $3::bigint[]) AS u(topic, partition, off)
  ON d.topic = u.topic AND d.partition = u.partition AND d."offset" = u.off
"""

OUTSTANDING_SQL = """
SELECT topic, count(*) AS n FROM {schema}.graphledger_dead_letters WHERE replayed_at IS NULL GROUP BY topic
"""


@dataclass(frozen=True, slots=True)
class OutgoingRecord:
    """One record to produce to the dead-letter topic."""

    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]


def reason_text(reason: str) -> str:
    """The reason as Postgres text can hold it: no NUL (it quotes arbitrary input), bounded length."""
    reason = reason.replace("\x00", "\\x00")
    return reason if len(reason) <= MAX_REASON_CHARS else reason[: MAX_REASON_CHARS - 1] + "…"


def public_reason(letter: DeadLetter) -> str:
    """The reason as the dead-letter topic and the services' logs may hold it. A sealed event's reason
    stays in Postgres, where an erasure can drop it: it may quote the event's content, which neither
    the log nor a log file may hold in the clear."""
    ref = subject_ref(letter.record)
    reason = letter.reason if ref is None else f"a sealed event of subject {ref} was refused ({SEALED_REASON})"
    return reason_text(reason)


def outgoing_records(letter: DeadLetter, max_message_bytes: int) -> list[OutgoingRecord]:
    """The dead-letter topic records of one dead letter, each carrying the `gl-dlq-*` headers and its
    `public_reason`.

    A record that came alone goes out as it came. A reassembled chunked event is framed again (in
    chunks when larger than `max_message_bytes`, with `gl-chunk` headers of its own event id).
    """
    record = letter.record
    dlq = [
        (HEADER_REASON, public_reason(letter).encode()),
        (HEADER_TOPIC, record.topic.encode()),
        (HEADER_PARTITION, str(record.partition).encode()),
        (HEADER_OFFSET, str(record.offset).encode()),
    ]
    headers = with_append_time(record)
    if letter.chunk_event_id is None:
        # A record with neither key nor value (a producer's null record, or the stand-in for an unreadable
        # batch) goes out with an empty value: Kafka producers refuse to send neither.
        value = b"" if record.key is None and letter.value is None else letter.value
        return [OutgoingRecord(record.key, value, [*headers, *dlq])]
    original = [(k, v) for k, v in headers if k != envelope.HEADER_CHUNK]
    framed = frame(letter.value or b"", original, max_message_bytes, letter.chunk_event_id)
    return [OutgoingRecord(record.key, r.value, [*r.headers, *dlq]) for r in framed]


async def produce_dead_letters(
    producer: PartitionCheckedProducer, settings: Settings, letters: Sequence[DeadLetter]
) -> None:
    """Produce `letters` to the dead-letter topic, each logged with its `public_reason`, and wait for every
    acknowledgement (a batch's sink: inside its transaction, before it commits)."""
    futures = []
    for letter in letters:
        r = letter.record
        log.error("dead letter %s:%d@%d (%s): %s", r.topic, r.partition, r.offset, letter.event_type,
                  public_reason(letter))  # fmt: skip
        for out in outgoing_records(letter, settings.max_message_bytes):
            futures.append(await producer.send(settings.dead_letter_topic, out.value, key=out.key, headers=out.headers))
    await asyncio.wait_for(asyncio.gather(*futures), settings.produce_timeout_s)


async def record_dead_letters(conn: asyncpg.Connection, schema: str, letters: Sequence[DeadLetter]) -> None:
    if letters:
        await conn.execute(
            render(INSERT_DEAD_LETTERS_SQL, schema),
            [d.record.topic for d in letters],
            [d.record.partition for d in letters],
            [d.record.offset for d in letters],
            [d.event_type for d in letters],
            [reason_text(d.reason) for d in letters],
            [d.record.key for d in letters],
            [d.value for d in letters],
            [encode_headers(with_append_time(d.record)) for d in letters],
            [subject_ref(d.record) for d in letters],
        )


def encode_headers(headers: Sequence[tuple[str, bytes]]) -> bytes:
    """A record's headers as the row keeps them; `gl-chunk` is dropped (the row holds the whole event)."""
    return ormsgpack.packb([[k, v] for k, v in headers if k != envelope.HEADER_CHUNK])


def decode_headers(raw: bytes | None) -> list[tuple[str, bytes]]:
    return [(k, v) for k, v in ormsgpack.unpackb(raw)] if raw else []


async def outstanding(conn: asyncpg.Connection, schema: str, topics: Sequence[str]) -> dict[str, int]:
    """Dead letters not replayed yet, per source topic (0 for each of `topics` without any)."""
    counts = dict.fromkeys(topics, 0)
    for row in await conn.fetch(render(OUTSTANDING_SQL, schema)):
        counts[row["topic"]] = row["n"]
    return counts


async def list_dead_letters(
    conn: asyncpg.Connection, schema: str, *, include_replayed: bool = False, limit: int = 100
) -> list[asyncpg.Record]:
    """Dead letters in the order they were recorded: those not replayed yet, or all."""
    return list(await conn.fetch(render(LIST_DEAD_LETTERS_SQL, schema), include_replayed, limit))


async def fetch_dead_letter(
    conn: asyncpg.Connection, schema: str, dead_letter_id: int, *, lock: bool = False
) -> asyncpg.Record | None:
    """One dead letter (None: no such id); `lock`: its row locked until the transaction ends."""
    return await conn.fetchrow(render(LOCK_DEAD_LETTER_SQL if lock else DEAD_LETTER_SQL, schema), dead_letter_id)


async def dead_letters_at(
    conn: asyncpg.Connection, schema: str, positions: Collection[tuple[str, int, int]]
) -> dict[tuple[str, int, int], tuple[int, str]]:
    """The id and reason of the dead letter recorded at each of `positions` that has one."""
    if not positions:
        return {}
    topics, partitions, offsets = (list(column) for column in zip(*positions, strict=True))
    rows = await conn.fetch(render(DEAD_LETTERS_AT_SQL, schema), topics, partitions, offsets)
    return {(r["topic"], r["partition"], r["offset"]): (r["id"], r["reason"]) for r in rows}


async def mark_replayed(conn: asyncpg.Connection, schema: str, dead_letter_id: int, replayed_to: str) -> None:
    await conn.execute(render(MARK_REPLAYED_SQL, schema), dead_letter_id, replayed_to)
