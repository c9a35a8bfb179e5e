"""Dead letters as `graphledger dlq list` and `show` print them: JSON, payloads decoded where the bytes allow."""

from __future__ import annotations

from typing import Any

import asyncpg
import ormsgpack

from graphledger.errors import DeadLetterError
from graphledger.settings import Settings
from graphledger_server.dlq.editable import to_editable
from graphledger_server.dlq.sealed import Opened, describe_subject, open_sealed, sealed_envelope
from graphledger_server.keys.key_store import key_store_for
from graphledger_server.keys.lookup import DataKeyCache
from graphledger_server.projection.dead_letters import decode_headers, fetch_dead_letter, list_dead_letters


async def summaries(settings: Settings, *, include_replayed: bool = False, limit: int = 100) -> list[dict[str, Any]]:
    """The dead letters not replayed yet (or all), in the order they were recorded, each as `summary`."""
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        rows = await list_dead_letters(conn, settings.postgres_schema, include_replayed=include_replayed, limit=limit)
    finally:
        await conn.close()
    return [summary(r) for r in rows]


async def show(settings: Settings, dead_letter_id: int) -> dict[str, Any]:
    """One dead letter in full, as `describe`; a sealed one opened with its subject's key."""
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        row = await fetch_dead_letter(conn, settings.postgres_schema, dead_letter_id)
    finally:
        await conn.close()
    if row is None:
        raise DeadLetterError(f"no dead letter {dead_letter_id} in schema {settings.postgres_schema}")
    if sealed_envelope(row["record_value"]) is None:
        return describe(row)
    pool = await asyncpg.create_pool(settings.postgres_dsn, min_size=0, max_size=1)
    try:
        opened = await open_sealed(row["record_value"], DataKeyCache(key_store_for(settings, pool)))
    except DeadLetterError as exc:
        return describe(row, unopened=str(exc))
    finally:
        await pool.close()
    return describe(row, opened)


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


def describe(row: Any, opened: Opened | None = None, *, unopened: str | None = None) -> dict[str, Any]:
    """Everything about one dead letter; the envelope and payload decoded where the bytes allow, a sealed
    payload as `opened` (in the clear, as `dlq replay --payload-file` takes it) or, when it did not open,
    left out with the reason `unopened`."""
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
    if opened is not None:
        shown["sealed"] = describe_subject(opened)
        shown["payload"] = to_editable(opened.envelope.payload)
    elif unopened is not None:
        shown["payload"], shown["decode_error"] = None, unopened
    else:
        shown["payload"] = to_editable(raw.get("p"))
    return shown
