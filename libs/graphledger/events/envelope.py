"""The one envelope every graphledger event travels in, and its Kafka headers.

The record value is an ormsgpack map `{"v": version, "type": ..., "id": uuid, "ts": ms, "p": payload}`.
Headers repeat type and version (and carry W3C `traceparent`) so a consumer can route or refuse an
event without decoding it.

An event's time is not its `ts` (the writer's clock) but its record's: the broker's time at the event's
first append to a log (`append_time_ms`), which a copy carries in `gl-appended-ms`.

Version policy: `SCHEMA_VERSION` is the version this code writes. A record with a lower version is
upcast (`UPCASTERS`) before validation; a record with a higher version was written by a newer
graphledger (or claims to be) and raises `UnknownEventVersionError`, which a worker must not dead-letter
(a newer worker understands it): it parks the record's subject, and only that subject's later records
wait for an upgraded projector or an operator. docs/events.md describes each event and how to add a
version.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import ormsgpack

from graphledger.errors import InvalidEventError, UnknownEventVersionError
from graphledger.quick_init import quick_init

SCHEMA_VERSION = 4
"""4: a put or writes may carry its writer's intent (`graphledger.ownership`), which a projector reading at
most version 3 would not heed, so it parks them instead; 3: a `thread.copy` lands at its barrier, on the
target's partition; 2: a payload may be sealed with its subject's data key (`graphledger.erasure.sealing`);
1: in the clear."""
INTENT_VERSION = 4
"""The first version whose puts and writes may carry an intent; events without one are written as 3."""
PLAIN_VERSION = 3
"""The version of every event that carries no intent: what a projector of version 3 still applies."""
STAGED_COPIES_VERSION = 3
"""The first version whose `thread.copy` lands at its barrier: one written before lands at its record."""

MAX_EPOCH_MS = 253_402_300_799_999
"""9999-12-31T23:59:59.999Z: later event times are a broken clock (and beyond what timestamptz holds)."""

HEADER_TYPE = "gl-type"
HEADER_VERSION = "gl-version"
HEADER_CHUNK = "gl-chunk"
HEADER_SUBJECT = "gl-subject"
"""On a sealed event's records: its subject's reference, so keys are fetched before anything is decoded."""
HEADER_KEY = "gl-key"
"""On an event sealed with a fresh key a writer bound to its subject (`erasure/fresh_keys.py`): the key's id."""
SEALED_PAYLOAD = "sealed"
"""The one key of a sealed payload (`graphledger.erasure.sealing`)."""
HEADER_INTENT = "gl-intent"
"""On a protected put's or writes' records: its writer's intent (`graphledger.ownership`), in clear."""
HEADER_OPERATION = "gl-operation"
"""On a prune's records: `1` when it is a thread operation of the one-writer rule (strategy `delete`), `0`
when not (`keep_latest`), in clear, so a writer deciding from headers need not take every prune for one."""
HEADER_TRACEPARENT = "traceparent"
HEADER_APPENDED = "gl-appended-ms"
"""On a copy's records (`encrypt-log`, `import`, `dlq replay`): the time, in ms since the epoch, of the
event's first append to a log, which the copy keeps instead of taking its own append time."""

Headers = Sequence[tuple[str, bytes]]


def _unsealed_v1(event_type: str, payload: dict[str, Any]) -> dict[str, Any]:
    """A version 1 payload is a version 2 payload in the clear."""
    return payload


def _copies_at_record_v2(event_type: str, payload: dict[str, Any]) -> dict[str, Any]:
    """A version 2 `thread.copy` lands at its record: said in the payload when it is in the clear (so a
    copy of the event keeps it); a sealed one is told by `Envelope.written_version` once opened."""
    if event_type == "thread.copy" and SEALED_PAYLOAD not in payload:
        return {**payload, "at_record": True}
    return payload


def _without_intent_v3(event_type: str, payload: dict[str, Any]) -> dict[str, Any]:
    """A version 3 payload is a version 4 payload without an intent."""
    return payload


# version -> function turning a payload of that version into one of version + 1.
UPCASTERS: dict[int, Callable[[str, dict[str, Any]], dict[str, Any]]] = {
    1: _unsealed_v1,
    2: _copies_at_record_v2,
    3: _without_intent_v3,
}


@quick_init
@dataclass(frozen=True, slots=True)
class Envelope:
    """One decoded event: its type, identity, producer time and raw payload map."""

    type: str
    event_id: str
    produced_ms: int
    """The writer's clock, kept for the record: no projection reads it (`append_time_ms`)."""
    payload: dict[str, Any]
    version: int = SCHEMA_VERSION
    """The version it is read as (`SCHEMA_VERSION` once decoded: upcast from the one it was written in)."""
    appended_ms: int | None = None
    """Set on a copy of an event: its first append's time, which `headers_for` writes in `gl-appended-ms`.
    Not part of the value; None on a decoded envelope (the record's headers carry it)."""
    written_version: int = SCHEMA_VERSION
    """The version its producer wrote (`version` is the one it was upcast to): what an event meant then."""
    intent: bytes | None = None
    """A protected put's or writes' intent (`graphledger.ownership.Intent.header`), which `headers_for`
    writes in `gl-intent`, in clear even when the payload is sealed. Not part of the value: the payload
    carries it too; None on a decoded envelope (the record's headers carry it)."""
    operation: bool | None = None
    """A prune's: whether it is a thread operation of the one-writer rule, which `headers_for` writes in
    `gl-operation`, in clear. Not part of the value (the payload's strategy says it); None on other events
    and on a decoded envelope."""


def with_payload(envelope: Envelope, payload: dict[str, Any]) -> Envelope:
    """`envelope` with another payload (sealed or opened): `dataclasses.replace`'s result, built directly,
    which every sealed record's opening pays for (replace walks the fields each call: 3-5 us)."""
    e = envelope
    return Envelope(
        e.type, e.event_id, e.produced_ms, payload, e.version, e.appended_ms, e.written_version, e.intent, e.operation
    )


def new_envelope(
    event_type: str, payload: dict[str, Any], intent: bytes | None = None, operation: bool | None = None
) -> Envelope:
    """A new event's envelope, of the lowest version that says what it carries: an intent needs
    `INTENT_VERSION`, so a projector of version 3 still applies every event without one."""
    version = INTENT_VERSION if intent is not None else PLAIN_VERSION
    now = int(time.time() * 1000)
    return Envelope(event_type, new_event_id(), now, payload, version, None, version, intent, operation)


def new_event_id() -> str:
    """A random UUID (version 4) from the OS, not from `uuid.uuid4`: an application that patches
    `uuid4` (LangGraph's own tests do) gets the same ids with graphledger as without it."""
    return str(uuid.UUID(bytes=os.urandom(16), version=4))


def encode(envelope: Envelope) -> bytes:
    return ormsgpack.packb(
        {
            "v": envelope.version,
            "type": envelope.type,
            "id": envelope.event_id,
            "ts": envelope.produced_ms,
            "p": envelope.payload,
        }
    )


def headers_for(envelope: Envelope, traceparent: str | None = None) -> list[tuple[str, bytes]]:
    headers = [(HEADER_TYPE, envelope.type.encode()), (HEADER_VERSION, str(envelope.version).encode())]
    sealed = envelope.payload.get(SEALED_PAYLOAD)
    if isinstance(sealed, dict) and isinstance(ref := sealed.get("ref"), str):
        headers.append((HEADER_SUBJECT, ref.encode()))
        if isinstance(key_id := sealed.get("kid"), str):
            headers.append((HEADER_KEY, key_id.encode()))
    if envelope.intent is not None:
        headers.append((HEADER_INTENT, envelope.intent))
    if envelope.operation is not None:
        headers.append((HEADER_OPERATION, b"1" if envelope.operation else b"0"))
    if envelope.appended_ms is not None:
        headers.append((HEADER_APPENDED, str(envelope.appended_ms).encode()))
    if traceparent:
        headers.append((HEADER_TRACEPARENT, traceparent.encode()))
    return headers


def header(headers: Headers | None, name: str) -> bytes | None:
    for key, value in headers or ():
        if key == name:
            return value
    return None


def append_time_ms(timestamp: int, headers: Headers | None) -> int:
    """An event's time: the broker's time at its first append to a log, in ms since the epoch.

    `timestamp` is its record's Kafka timestamp (-1: none), the broker's append time on a topic with
    `message.timestamp.type=LogAppendTime` (what `graphledger topics ensure` sets); a copy's record
    carries the original's in `gl-appended-ms`. A copy follows its original, so the earlier of the two
    counts: a writer can date its own event back (as it could delete it), never forward. Raises
    `InvalidEventError` when neither says a time between 1970 and 9999.
    """
    times = [timestamp] if timestamp >= 0 else []
    carried = header(headers, HEADER_APPENDED)
    if carried is not None:
        text = carried.decode(errors="replace")
        if not text.isascii() or not text.isdigit() or len(text) > len(str(MAX_EPOCH_MS)):
            raise InvalidEventError(f"{HEADER_APPENDED} {text[:40]!r} is not a time in ms since the epoch")
        times.append(int(text))
    if not times:
        raise InvalidEventError("the record carries no timestamp: its event has no time")
    appended = min(times)
    if appended > MAX_EPOCH_MS:
        raise InvalidEventError(f"record time {appended} ms is not a time between 1970 and 9999")
    return appended


def decode(value: bytes | None) -> Envelope:
    """Decode a record value; raises `InvalidEventError` naming what is wrong."""
    if not value:
        raise InvalidEventError("empty record value")
    try:
        raw = ormsgpack.unpackb(value)
    except (ormsgpack.MsgpackDecodeError, ValueError, TypeError) as exc:
        raise InvalidEventError(f"record value is not msgpack: {exc}") from None
    if not isinstance(raw, Mapping):
        raise InvalidEventError(f"envelope is a {type(raw).__name__}, not a map")
    version = raw.get("v")
    if not isinstance(version, int) or version < 1:
        raise InvalidEventError(f"envelope version {version!r} is not a positive integer")
    if version > SCHEMA_VERSION:
        raise UnknownEventVersionError(
            f"event version {version} is newer than this worker's {SCHEMA_VERSION}; upgrade the worker", version
        )
    event_type, event_id, produced_ms, payload = raw.get("type"), raw.get("id"), raw.get("ts"), raw.get("p")
    if not isinstance(event_type, str):
        raise InvalidEventError(f"envelope type {event_type!r} is not a string")
    if not isinstance(event_id, str):
        raise InvalidEventError(f"envelope id {event_id!r} is not a string")
    if not isinstance(produced_ms, int):
        raise InvalidEventError(f"envelope ts {produced_ms!r} is not an integer")
    if not isinstance(payload, dict):
        raise InvalidEventError(f"envelope payload of {event_type} is not a map")
    written = version
    while version < SCHEMA_VERSION:
        upcast = UPCASTERS.get(version)
        if upcast is None:  # a packaging bug: stop (nothing lost) rather than dead-letter every old event
            raise UnknownEventVersionError(f"no upcaster from event version {version} to {version + 1}", written)
        payload = upcast(event_type, payload)
        version += 1
    return Envelope(event_type, event_id, produced_ms, payload, version, written_version=written)
