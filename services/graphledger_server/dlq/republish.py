"""Re-publishing a dead letter to the partition it came from, with the same key, once (`graphledger dlq replay`).

The row is locked, the record published and the row marked replayed in one transaction: two replays
of one dead letter, even concurrent ones, publish it once. The record is validated as the projector
would before anything is published, so a fix that is still wrong fails here, not in the projector.
A fixed payload keeps the event's type, id and time, and is sealed again when the dead letter was. The
event keeps its time (`gl-appended-ms`, which the dead letter's headers carry) rather than taking the
replay's, so a store item's TTL runs from when it was first written. Its `gl-intent` header is the
intent its payload carries (none: no header), as every reader checks. Once every replay is published (each
in its transaction, as above), the replay waits for what the projector decided at each checkpoint record's
new position (`decided.py`): the one-writer rule judges it there, against the thread as it is now.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Sequence
from typing import Any, assert_never

import asyncpg
import ormsgpack
from aiokafka import AIOKafkaProducer

from graphledger.erasure.sealing import seal as seal_envelope
from graphledger.errors import DeadLetterError
from graphledger.events import chunks, envelope
from graphledger.log.records import LogRecord
from graphledger.opening.records import DeadLetter, Decoded, TooNew, decode_value, key_name
from graphledger.opening.records import Erased as ErasedRecord
from graphledger.settings import Settings
from graphledger_server.dlq.decided import Published, Replayed, decide
from graphledger_server.dlq.sealed import Opened, open_sealed
from graphledger_server.keys.key_store import key_store_for
from graphledger_server.keys.lookup import DataKeyCache
from graphledger_server.log.clients import new_producer
from graphledger_server.projection.batch import TopicProjection
from graphledger_server.projection.checkpoint_plan import thread_of
from graphledger_server.projection.dead_letters import (
    HEADER_OFFSET,
    HEADER_PARTITION,
    HEADER_REASON,
    HEADER_TOPIC,
    decode_headers,
    fetch_dead_letter,
    mark_replayed,
)
from graphledger_server.projector.worker import projections_for

HEADER_REPLAY_OF = "gl-replay-of"
"""On a re-published record: `<topic>:<partition>:<offset>` of the dead letter it replays."""


async def replay(
    settings: Settings,
    ids: Sequence[int],
    *,
    payload: dict[str, Any] | None = None,
    event_type: str | None = None,
) -> list[tuple[int, Replayed | DeadLetterError]]:
    """Replay each dead letter once; per id, where it went and what the projector decided there
    (`decided.py`), or why it was not published."""
    published = await _publish(settings, ids, payload, event_type)
    decided = iter(await decide(settings, [p for _, p in published if isinstance(p, Published)]))
    return [(i, p if isinstance(p, DeadLetterError) else next(decided)) for i, p in published]


async def _publish(
    settings: Settings, ids: Sequence[int], payload: dict[str, Any] | None, event_type: str | None
) -> list[tuple[int, Published | DeadLetterError]]:
    projections = projections_for(settings)
    conn = await asyncpg.connect(settings.postgres_dsn)
    keys_pool = await asyncpg.create_pool(settings.postgres_dsn, min_size=0, max_size=1)
    keys = DataKeyCache(key_store_for(settings, keys_pool))
    producer = new_producer(settings)
    try:
        for projection in projections.values():
            await projection.prepare(conn)  # the store's vector dims, which validation checks
        await producer.start()
        results: list[tuple[int, Published | DeadLetterError]] = []
        for dead_letter_id in ids:
            try:
                outcome: Published | DeadLetterError = await _replay_one(
                    conn, producer, settings, projections, keys, dead_letter_id, payload, event_type
                )
            except DeadLetterError as exc:
                outcome = exc
            results.append((dead_letter_id, outcome))
        return results
    finally:
        await producer.stop()
        await keys_pool.close()
        await conn.close()


async def _replay_one(
    conn: asyncpg.Connection,
    producer: AIOKafkaProducer,
    settings: Settings,
    projections: dict[str, TopicProjection],
    keys: DataKeyCache,
    dead_letter_id: int,
    payload: dict[str, Any] | None,
    event_type: str | None,
) -> Published:
    schema = settings.postgres_schema
    async with conn.transaction():
        row = await fetch_dead_letter(conn, schema, dead_letter_id, lock=True)  # a concurrent replay waits here
        if row is None:
            raise DeadLetterError(f"no dead letter {dead_letter_id} in schema {schema}")
        if row["replayed_at"] is not None:
            raise DeadLetterError(
                f"dead letter {dead_letter_id} was replayed at {row['replayed_at'].isoformat()} to "
                f"{row['replayed_to']}; not publishing it twice"
            )
        topic, partition = row["topic"], row["partition"]
        if topic not in projections:
            raise DeadLetterError(f"dead letter {dead_letter_id} came from {topic}, which the projector does not read")
        dropped = {HEADER_REASON, HEADER_TOPIC, HEADER_PARTITION, HEADER_OFFSET, HEADER_REPLAY_OF}
        dropped.add(envelope.HEADER_CHUNK)
        headers = [(k, v) for k, v in decode_headers(row["record_headers"]) if k not in dropped]
        value = row["record_value"]
        # Checked as appended now; a dead letter recorded without its time (by an older projector) takes it.
        now_ms = int(time.time() * 1000)
        record = LogRecord(topic, partition, row["offset"], row["record_key"], value, tuple(headers), now_ms)
        if (name := key_name(record)) is not None:
            await keys.load([name])
        if payload is not None:
            opened = await open_sealed(row["record_value"], keys)
            value, headers = _with_payload(row, headers, payload, event_type, opened)
            record = LogRecord(topic, partition, row["offset"], row["record_key"], value, tuple(headers), now_ms)
        checked = decode_value(record, value, projections[topic].to_event, keys.get)
        match checked:
            case Decoded():
                thread_id = thread_of(checked.event) if topic == settings.checkpoint_topic else None
            case ErasedRecord():
                raise DeadLetterError(f"dead letter {dead_letter_id} is of an erased subject: nothing to replay")
            case DeadLetter() | TooNew():
                raise DeadLetterError(f"dead letter {dead_letter_id} would fail again: {checked.reason}")
            case _:
                assert_never(checked)
        headers.append((HEADER_REPLAY_OF, f"{topic}:{partition}:{row['offset']}".encode()))
        # A fresh chunk id: the projector may still hold chunks of the event's first publication.
        records = chunks.frame(value or b"", headers, settings.max_message_bytes, str(uuid.uuid4()))
        futures = [
            await producer.send(topic, r.value, key=row["record_key"], partition=partition, headers=r.headers)
            for r in records
        ]
        acked = await asyncio.wait_for(asyncio.gather(*futures), settings.produce_timeout_s)
        published = Published(dead_letter_id, topic, partition, acked[-1].offset, thread_id)
        await mark_replayed(conn, schema, dead_letter_id, published.replayed_to)
    return published


def _with_payload(
    row: Any, headers: list[tuple[str, bytes]], payload: dict[str, Any], event_type: str | None, opened: Opened | None
) -> tuple[bytes, list[tuple[str, bytes]]]:
    """The record value of `payload` in the dead letter's envelope (type, id, time), at today's version;
    sealed with the dead letter's subject's key when it was sealed (the log holds no content in the clear)."""
    original: dict[str, Any] = {}
    try:
        decoded = ormsgpack.unpackb(row["record_value"] or b"")
        original = decoded if isinstance(decoded, dict) else {}
    except (ormsgpack.MsgpackDecodeError, ValueError, TypeError):
        pass
    header_type = envelope.header(headers, envelope.HEADER_TYPE)
    kind = event_type or _text(original.get("type")) or (header_type.decode(errors="replace") if header_type else None)
    if not kind:
        raise DeadLetterError("the dead letter's event type is unreadable: give --event-type")
    event_id = _text(original.get("id")) or str(uuid.uuid4())
    ts = original.get("ts")
    produced_ms = ts if isinstance(ts, int) and not isinstance(ts, bool) else int(time.time() * 1000)
    # The intent and operation headers say what the payload says (readers check them), whatever the dead
    # letter's own headers said: a fixed payload may carry another intent, or none, or another strategy.
    intent = payload.get("intent")
    strategy = payload.get("strategy") if kind == "thread.prune" else None
    operation = None if strategy is None else strategy == "delete"
    intent_bytes = intent if isinstance(intent, bytes) else None
    env = envelope.Envelope(kind, event_id, produced_ms, payload, intent=intent_bytes, operation=operation)
    own_headers = (
        envelope.HEADER_TYPE,
        envelope.HEADER_VERSION,
        envelope.HEADER_SUBJECT,
        envelope.HEADER_KEY,
        envelope.HEADER_INTENT,
        envelope.HEADER_OPERATION,
    )
    kept = [(k, v) for k, v in headers if k not in own_headers]
    if opened is not None:
        env = seal_envelope(env, opened.subject, opened.key, opened.key_id)
    return envelope.encode(env), [*envelope.headers_for(env), *kept]


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
