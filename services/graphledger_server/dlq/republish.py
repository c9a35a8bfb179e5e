"""`graphledger dlq list|show|replay`: inspect dead letters and re-publish them after a fix.

Dead letters are read from `graphledger_dead_letters` (the projector keeps the whole record there; the
dead-letter topic may expire). `replay` publishes the original record, or a fixed payload, to the
partition it came from with the same key, and marks the row replayed in the same transaction that
locks it: two replays of one dead letter, even concurrent ones, publish it once. The record is
validated as the projector would before anything is published, so a fix that is still wrong fails
here, not in the projector.

Payloads are shown and read as JSON in which each msgpack bytes value is `{"$text": "..."}` when it is
UTF-8 (JSON text, ids) and `{"$hex": "..."}` otherwise, so `show --payload > fix.json`, an edit, and
`replay --payload-file fix.json` round-trip exactly.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from graphledger.errors import DeadLetterError, GraphledgerError
from graphledger.settings import Settings

if TYPE_CHECKING:
    import asyncpg
    from aiokafka import AIOKafkaProducer

    from graphledger_server.keys.lookup import DataKeyCache
    from graphledger_server.projection.batch import TopicProjection

HEADER_REPLAY_OF = "gl-replay-of"
"""On a re-published record: `<topic>:<partition>:<offset>` of the dead letter it replays."""
REASON_COLUMN_CHARS = 90

COLUMNS = """id, topic, partition, "offset", event_type, reason, recorded_at, replayed_at, replayed_to,
record_key, record_value, record_headers"""
LIST_SQL = f"""SELECT {COLUMNS} FROM {{schema}}.graphledger_dead_letters
WHERE $1::bool OR replayed_at IS NULL ORDER BY id LIMIT $2::int"""
ONE_SQL = f"SELECT {COLUMNS} FROM {{schema}}.graphledger_dead_letters WHERE id = $1::bigint"
LOCK_SQL = ONE_SQL + " FOR UPDATE"
MARK_SQL = """UPDATE {schema}.graphledger_dead_letters SET replayed_at = now(), replayed_to = $2::text
WHERE id = $1::bigint"""


def register(commands: Any) -> None:
    """Register `dlq` and its subcommands on the `graphledger` parser."""
    dlq = commands.add_parser(
        "dlq",
        help="inspect dead-lettered events and re-publish them after a fix",
        description="Dead letters are events the projector could not apply (undecodable, invalid, or "
        "rejected by Postgres). List them, show one, and replay it to its source partition, as it was or "
        "with a fixed payload. Reads GRAPHLEDGER_POSTGRES_DSN/_SCHEMA and the Kafka settings.",
    )
    sub = dlq.add_subparsers(dest="dlq_command", required=True, metavar="COMMAND")
    listing = sub.add_parser("list", help="dead letters not replayed yet (reason, source position, type, time)")
    listing.add_argument("--all", action="store_true", help="include the ones already replayed")
    listing.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
    listing.add_argument("--json", action="store_true", help="one JSON document instead of a table")
    listing.set_defaults(run=_run_list)
    show = sub.add_parser("show", help="one dead letter in full, its payload decoded where possible")
    show.add_argument("id", type=int)
    show.add_argument(
        "--payload", action="store_true", help="print only the payload, in the form --payload-file reads back"
    )
    show.set_defaults(run=_run_show)
    replay = sub.add_parser("replay", help="re-publish dead letters to their source partition, once each")
    replay.add_argument("ids", type=int, nargs="+", metavar="ID")
    replay.add_argument(
        "--payload-file",
        type=Path,
        help="publish this payload (JSON, as `show --payload` prints it) instead of the original, keeping the "
        "event's type, id and time; one ID only",
    )
    replay.add_argument(
        "--event-type", help="the event type of --payload-file, when the dead letter's own cannot be read"
    )
    replay.set_defaults(run=_run_replay)


# -- commands ----------------------------------------------------------------------------------------


def _run_list(args: argparse.Namespace, settings: Settings) -> int:
    rows = asyncio.run(_with_conn(settings, lambda conn: list_dead_letters(conn, settings, args.all, args.limit)))
    if args.json:
        print(json.dumps([summary(r) for r in rows], indent=2))
        return 0
    if not rows:
        print("dlq: no dead letters" + ("" if args.all else " waiting for a replay"))
        return 0
    print(f"{'ID':>6}  {'RECORDED (UTC)':<19}  {'SOURCE':<34}  {'TYPE':<17}  REASON")
    for r in rows:
        s = summary(r)
        reason = s["reason"]
        if len(reason) > REASON_COLUMN_CHARS:
            reason = reason[: REASON_COLUMN_CHARS - 1] + "…"
        if s["replayed_at"]:
            reason = f"[replayed to {s['replayed_to']}] {reason}"
        print(f"{s['id']:>6}  {s['recorded_at'][:19]:<19}  {s['source']:<34}  {s['event_type'] or '?':<17}  {reason}")
    return 0


def _run_show(args: argparse.Namespace, settings: Settings) -> int:
    row = asyncio.run(_with_conn(settings, lambda conn: fetch_dead_letter(conn, settings, args.id)))
    shown = describe(row)
    if args.payload:
        if shown.get("payload") is None:
            raise DeadLetterError(f"dead letter {args.id} has no decodable payload: {shown.get('decode_error')}")
        print(json.dumps(shown["payload"], indent=2, ensure_ascii=False))
    else:
        print(json.dumps(shown, indent=2, ensure_ascii=False))
    return 0


def _run_replay(args: argparse.Namespace, settings: Settings) -> int:
    if args.payload_file is not None and len(args.ids) != 1:
        print("graphledger dlq replay: --payload-file replaces one dead letter's payload: give one ID", file=sys.stderr)
        return 2
    payload = None
    if args.payload_file is not None:
        try:
            payload = from_editable(json.loads(args.payload_file.read_text(encoding="utf-8")))
        except (OSError, ValueError) as exc:
            raise DeadLetterError(f"cannot read --payload-file {args.payload_file}: {exc}") from None
        if not isinstance(payload, dict):
            raise DeadLetterError(f"--payload-file {args.payload_file} holds a {type(payload).__name__}, not a map")
    results = asyncio.run(replay(settings, args.ids, payload=payload, event_type=args.event_type))
    failed = 0
    for dead_letter_id, outcome in results:
        if isinstance(outcome, DeadLetterError):
            failed += 1
            print(f"graphledger dlq replay: {outcome}", file=sys.stderr)
        else:
            print(f"dlq: replayed {dead_letter_id} to {outcome}")
    return 1 if failed else 0


# -- queries -----------------------------------------------------------------------------------------


async def _with_conn(settings: Settings, work: Any) -> Any:
    import asyncpg

    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        return await work(conn)
    finally:
        await conn.close()


def _sql(sql: str, settings: Settings) -> str:
    from graphledger_server.sql import render

    return render(sql, settings.postgres_schema)


async def list_dead_letters(
    conn: asyncpg.Connection, settings: Settings, include_replayed: bool = False, limit: int = 100
) -> list[Any]:
    return list(await conn.fetch(_sql(LIST_SQL, settings), include_replayed, limit))


async def fetch_dead_letter(conn: asyncpg.Connection, settings: Settings, dead_letter_id: int) -> Any:
    row = await conn.fetchrow(_sql(ONE_SQL, settings), dead_letter_id)
    if row is None:
        raise DeadLetterError(f"no dead letter {dead_letter_id} in schema {settings.postgres_schema}")
    return row


def summary(row: Any) -> dict[str, Any]:
    return {
        "id": row["id"],
        "source": f"{row['topic']}:{row['partition']}@{row['offset']}",
        "topic": row["topic"],
        "partition": row["partition"],
        "offset": row["offset"],
        "event_type": row["event_type"],
        "reason": row["reason"],
        "recorded_at": row["recorded_at"].isoformat(),
        "replayed_at": row["replayed_at"].isoformat() if row["replayed_at"] else None,
        "replayed_to": row["replayed_to"],
    }


def describe(row: Any) -> dict[str, Any]:
    """Everything about one dead letter; the envelope and payload decoded where the bytes allow."""
    import ormsgpack

    from graphledger_server.projection.dead_letters import decode_headers

    shown = summary(row)
    shown["key"] = to_editable(row["record_key"])
    shown["headers"] = {k: to_editable(v) for k, v in decode_headers(row["record_headers"])}
    value = row["record_value"]
    if value is None:
        shown["value"], shown["decode_error"] = None, "the record has no value"
        return shown
    try:
        raw = ormsgpack.unpackb(value)
    except (ormsgpack.MsgpackDecodeError, ValueError, TypeError) as exc:
        shown["value_hex"], shown["decode_error"] = value.hex(), f"not msgpack: {exc}"
        return shown
    if not isinstance(raw, dict):
        shown["value"], shown["decode_error"] = to_editable(raw), f"the envelope is a {type(raw).__name__}, not a map"
        return shown
    shown["envelope"] = {k: to_editable(v) for k, v in raw.items() if k != "p"}
    shown["payload"] = to_editable(raw.get("p"))
    return shown


# -- the editable JSON form of msgpack values ----------------------------------------------------------


def to_editable(value: Any) -> Any:
    """A msgpack value as JSON: bytes as `{"$text": ...}` (UTF-8) or `{"$hex": ...}`."""
    if isinstance(value, bytes):
        try:
            return {"$text": value.decode("utf-8")}
        except UnicodeDecodeError:
            return {"$hex": value.hex()}
    if isinstance(value, dict):
        return {str(k): to_editable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_editable(v) for v in value]
    return value


def from_editable(value: Any) -> Any:
    """The inverse of `to_editable`."""
    if isinstance(value, dict):
        if len(value) == 1 and "$text" in value and isinstance(value["$text"], str):
            return value["$text"].encode("utf-8")
        if len(value) == 1 and "$hex" in value and isinstance(value["$hex"], str):
            return bytes.fromhex(value["$hex"])
        return {k: from_editable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_editable(v) for v in value]
    return value


# -- replay ------------------------------------------------------------------------------------------


async def replay(
    settings: Settings,
    ids: Sequence[int],
    *,
    payload: dict[str, Any] | None = None,
    event_type: str | None = None,
) -> list[tuple[int, str | DeadLetterError]]:
    """Replay each dead letter once; per id, where it went or why it was refused."""
    import asyncpg

    from graphledger_server.keys.lookup import DataKeyCache
    from graphledger_server.keys.store import key_store_for
    from graphledger_server.log.clients import new_producer
    from graphledger_server.projector.worker import projections_for

    projections = projections_for(settings)
    conn = await asyncpg.connect(settings.postgres_dsn)
    keys_pool = await asyncpg.create_pool(settings.postgres_dsn, min_size=0, max_size=1)
    keys = DataKeyCache(key_store_for(settings, keys_pool))
    producer = new_producer(settings)
    try:
        for projection in projections.values():
            await projection.prepare(conn)  # the store's vector dims, which validation checks
        await producer.start()
        results: list[tuple[int, str | DeadLetterError]] = []
        for dead_letter_id in ids:
            try:
                outcome: str | DeadLetterError = await _replay_one(
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
) -> str:
    from graphledger.events import chunks, envelope
    from graphledger_server.projection.dead_letters import (
        HEADER_OFFSET,
        HEADER_PARTITION,
        HEADER_REASON,
        HEADER_TOPIC,
        decode_headers,
    )
    from graphledger_server.projection.records import Decoded, Erased, SourceRecord, decode_value, subject_ref

    async with conn.transaction():
        row = await conn.fetchrow(_sql(LOCK_SQL, settings), dead_letter_id)  # a concurrent replay waits here
        if row is None:
            raise DeadLetterError(f"no dead letter {dead_letter_id} in schema {settings.postgres_schema}")
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
        record = SourceRecord(topic, partition, row["offset"], row["record_key"], value, tuple(headers))
        if (ref := subject_ref(record)) is not None:
            await keys.load([ref])
        if payload is not None:
            value, headers = _with_payload(row, headers, payload, event_type, keys)
            record = SourceRecord(topic, partition, row["offset"], row["record_key"], value, tuple(headers))
        checked = decode_value(record, value, projections[topic].to_event, keys.get)
        if isinstance(checked, Erased):
            raise DeadLetterError(f"dead letter {dead_letter_id} is of an erased subject: nothing to replay")
        if not isinstance(checked, Decoded):
            raise DeadLetterError(f"dead letter {dead_letter_id} would fail again: {checked.reason}")
        headers.append((HEADER_REPLAY_OF, f"{topic}:{partition}:{row['offset']}".encode()))
        # A fresh chunk id: the projector may still hold chunks of the event's first publication.
        records = chunks.frame(value or b"", headers, settings.max_message_bytes, str(uuid.uuid4()))
        futures = [
            await producer.send(topic, r.value, key=row["record_key"], partition=partition, headers=r.headers)
            for r in records
        ]
        acked = await asyncio.wait_for(asyncio.gather(*futures), settings.produce_timeout_s)
        replayed_to = f"{topic}:{partition}@{acked[-1].offset}"
        await conn.execute(_sql(MARK_SQL, settings), dead_letter_id, replayed_to)
    return replayed_to


def _with_payload(
    row: Any, headers: list[tuple[str, bytes]], payload: dict[str, Any], event_type: str | None, keys: DataKeyCache
) -> tuple[bytes, list[tuple[str, bytes]]]:
    """The record value of `payload` in the dead letter's envelope (type, id, time), at today's version;
    sealed with the dead letter's subject's key when it was sealed (the log holds no content in the clear)."""
    import time

    import ormsgpack

    from graphledger.events import envelope
    from graphledger.sealing import Erased, sealed_ref, unseal
    from graphledger.sealing import seal as seal_envelope

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
    env = envelope.Envelope(kind, event_id, produced_ms, payload)
    kept = [
        (k, v) for k, v in headers if k not in (envelope.HEADER_TYPE, envelope.HEADER_VERSION, envelope.HEADER_SUBJECT)
    ]
    try:
        original_env = envelope.decode(row["record_value"])
        ref = sealed_ref(original_env)
    except GraphledgerError:
        ref = None
    if ref is not None:
        key = keys.get(ref)
        if key is None or isinstance(key, Erased):
            raise DeadLetterError(f"the dead letter's subject {ref} has no key (erased, or another key store)")
        try:
            _, subject = unseal(original_env, key)
        except GraphledgerError as exc:
            raise DeadLetterError(f"the dead letter's sealed payload does not open: {exc}") from None
        env = seal_envelope(env, subject, key)
    return envelope.encode(env), [*envelope.headers_for(env), *kept]


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
