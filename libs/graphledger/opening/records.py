"""Kafka records as the projector sees them, and their pure classification before a batch applies.

A record is an event, a chunk of a larger event, a dead letter (undecodable or invalid, or the stand-in
for a compressed batch beyond `max_decompressed_batch_bytes`), or an event from a newer graphledger that
parks its subject. Classifying needs no database; chunks are resolved later, inside the
batch transaction, where earlier chunks are stored.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from graphledger.erasure.sealing import Erased as ErasedKey
from graphledger.erasure.sealing import (
    KeyLookup,
    Misbound,
    SealedSubject,
    Unclaimed,
    sealed_key_id,
    sealed_kind,
    sealed_ref,
    unseal,
)
from graphledger.errors import InvalidEventError, UnknownEventVersionError
from graphledger.events import envelope, to_envelope
from graphledger.events.checkpoint import ThreadPrune
from graphledger.events.chunks import ChunkRef, parse_header
from graphledger.events.envelope import Envelope
from graphledger.events.erasure import NamespaceErase, ThreadErase
from graphledger.log.compressed_batches import UNREADABLE_HEADER
from graphledger.log.records import Header, LogRecord
from graphledger.quick_init import quick_init

log = logging.getLogger(__name__)


MAX_EVENT_ID_CHARS = 200
"""Longer chunk event ids are refused: they key `graphledger_chunks`, whose btree rows are bounded."""
MAX_EVENT_TYPE_CHARS = 200


@quick_init
@dataclass(frozen=True, slots=True)
class Decoded:
    """A valid event, ready to apply at its record's position."""

    record: LogRecord
    event: Any
    chunk_event_id: str | None = None
    """Set when the event was reassembled from chunks; `record` is then the chunk that completed it."""
    assembled: bytes | None = None
    """The reassembled value (the dead-letter topic needs it if Postgres rejects the event)."""
    subject: SealedSubject | None = None
    """The subject of a sealed event (opened with its data key), None for one in the clear."""
    key_id: str | None = None
    """The fresh key a sealed event opened with (its seal names it), None for its subject's own."""

    @property
    def value(self) -> bytes | None:
        return self.assembled if self.chunk_event_id is not None else self.record.value


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A record (or reassembled chunked event, `value`) that goes to the dead-letter topic."""

    record: LogRecord
    reason: str
    event_type: str | None
    value: bytes | None
    chunk_event_id: str | None = None
    subject: SealedSubject | None = None
    """The subject of a sealed event that opened and was then refused."""
    key_id: str | None = None
    """The fresh key such an event opened with, None for its subject's own."""


@dataclass(frozen=True, slots=True)
class TooNew:
    """An event written by a newer graphledger (or claiming to be): it parks its subject
    (`projection/parking.py`) until a worker that reads its version, or an operator, releases it."""

    record: LogRecord
    reason: str
    version: int | None = None
    """The envelope version the event claims (None: not known)."""
    chunk_event_id: str | None = None
    """Set when the event was reassembled from chunks; `record` is then the chunk that completed it."""
    assembled: bytes | None = None

    @property
    def value(self) -> bytes | None:
        return self.assembled if self.chunk_event_id is not None else self.record.value


@dataclass(frozen=True, slots=True)
class Erased:
    """A sealed event of an erased subject: never applied nor dead-lettered; the erasure it stands for
    is (`erasure_at`)."""

    record: LogRecord
    ref: str
    event_type: str | None
    kind: str | None = None
    """The subject's kind as the seal names it (`SealedSubject.kind`): which erasure it stands for."""


@dataclass(frozen=True, slots=True)
class Chunk:
    """One chunk of an event larger than the broker's message limit."""

    record: LogRecord
    ref: ChunkRef


Opened = Decoded | DeadLetter | TooNew | Erased
"""What a record (or a chunked event, put together) opens to."""
Classified = Opened | Chunk

ToEvent = Callable[[Envelope, int], Any]
"""Validates an envelope, at its time (`append_time_ms`), into a typed event of one topic; raises
`InvalidEventError`."""


def header_type(record: LogRecord) -> str | None:
    """The `gl-type` header, as text a dead-letter row can hold."""
    raw = envelope.header(record.headers, envelope.HEADER_TYPE)
    if raw is None:
        return None
    return raw[:MAX_EVENT_TYPE_CHARS].decode(errors="replace").replace("\x00", "\\x00")


def erasure_at(erased: Erased, to_event: ToEvent) -> Any | None:
    """The erasure of `erased`'s subject, typed by its topic's `to_event` at the record's time, or None
    (a seal naming no kind of its topic: it changes nothing).

    The key store answers a subject erased only once its eraser recorded the erasure, which it does
    before publishing the erasure's events: the subject is erased from this record on, whether its
    erasure event is in the log yet or not (or ever: an eraser can die in between). Applied here, a
    thread never reads as its older checkpoints without the acknowledged write whose key was erased
    under it, and a replay, which finds every key of the subject erased, erases it at its first record,
    to the same rows."""
    match erased.kind:
        case "thread":
            event: ThreadErase | NamespaceErase = ThreadErase(erased.ref)
        case "namespace":
            event = NamespaceErase(erased.ref)
        case _:
            return None
    try:
        return to_event(to_envelope(event), envelope.append_time_ms(erased.record.timestamp, erased.record.headers))
    except InvalidEventError:
        return None


def subject_ref(record: LogRecord) -> str | None:
    """The subject a sealed event's record names in its `gl-subject` header (None: in the clear)."""
    raw = envelope.header(record.headers, envelope.HEADER_SUBJECT)
    return None if raw is None else raw[:MAX_EVENT_ID_CHARS].decode(errors="replace")


def key_name(record: LogRecord) -> tuple[str, str | None] | None:
    """The key a sealed event's record opens with: its subject, and the fresh key its `gl-key` header
    names (None: the subject's own); None for a record in the clear."""
    ref = subject_ref(record)
    if ref is None:
        return None
    raw = envelope.header(record.headers, envelope.HEADER_KEY)
    return ref, None if raw is None else raw[:MAX_EVENT_ID_CHARS].decode(errors="replace")


def with_append_time(record: LogRecord) -> tuple[Header, ...]:
    """The record's headers with its event's time in `gl-appended-ms`, for a copy of it (a dead letter,
    and so a `dlq replay` of it, keeps the time of the event it copies); as they are when it has none."""
    try:
        appended = envelope.append_time_ms(record.timestamp, record.headers)
    except InvalidEventError:
        return record.headers
    kept = tuple(h for h in record.headers if h[0] != envelope.HEADER_APPENDED)
    return (*kept, (envelope.HEADER_APPENDED, str(appended).encode()))


def no_keys(ref: str, key_id: str | None) -> None:
    """The key lookup of a reader without a key store: no sealed event opens."""
    return None


def opened_with(item: Classified) -> tuple[str, str] | None:
    """The `(reference, fresh key id)` a sealed event opened with (a reader binds that key to that
    subject: `keys/lookup.py`), None when it did not open or opened with its subject's own key."""
    if isinstance(item, Decoded | DeadLetter) and item.subject is not None and item.key_id is not None:
        return item.subject.ref, item.key_id
    return None


def unwrapped(event: Any) -> Any:
    """A projection's event without its timed wrapper (the event itself when it has none)."""
    return getattr(event, "event", event)


def classify(record: LogRecord, to_event: ToEvent, keys: KeyLookup = no_keys) -> Classified:
    """What a record is, without touching the database (`keys`: the batch's data keys, fetched before)."""
    unreadable = envelope.header(record.headers, UNREADABLE_HEADER)
    if unreadable is not None:  # a compressed batch beyond the bound, in the consumer's answer
        reason = "unreadable record batch, " + unreadable[:1000].decode(errors="replace")
        return DeadLetter(record, reason, None, record.value)
    chunk_header = envelope.header(record.headers, envelope.HEADER_CHUNK)
    if chunk_header is not None:
        try:
            ref = parse_header(chunk_header)
        except InvalidEventError as exc:
            return DeadLetter(record, str(exc), header_type(record), record.value)
        if len(ref.event_id) > MAX_EVENT_ID_CHARS or "\x00" in ref.event_id:
            return DeadLetter(
                record, f"gl-chunk event id {ref.event_id[:80]!r}... is too long", header_type(record), record.value
            )
        return Chunk(record, ref)
    return decode_value(record, record.value, to_event, keys)


def decode_value(
    record: LogRecord,
    value: bytes | None,
    to_event: ToEvent,
    keys: KeyLookup = no_keys,
    chunk_event_id: str | None = None,
) -> Opened:
    """Decode, open (a sealed event) and validate an event's bytes (a record's value, or a reassembled
    chunked event, which takes the time of `record`, its last chunk)."""
    subject: SealedSubject | None = None
    key_id: str | None = None
    try:
        env = envelope.decode(value)
        if (ref := sealed_ref(env)) is not None:
            key_id = sealed_key_id(env)
            key = keys(ref, key_id)
            if isinstance(key, ErasedKey):
                # A key destroyed before any record opened with it proves no subject: no erasure to apply.
                kind = None if isinstance(key, Unclaimed) else sealed_kind(env)
                return Erased(record, ref, header_type(record), kind)
            if isinstance(key, Misbound):
                raise InvalidEventError(f"sealed with fresh key {key_id}, which is bound to another subject than {ref}")
            if key is None:
                raise InvalidEventError(f"no data key for subject {ref}: is the key store the one the writers used?")
            env, subject = unseal(env, key)
        event = to_event(env, envelope.append_time_ms(record.timestamp, record.headers))
        check_clear_headers(record.headers, event)
        held = value if chunk_event_id is not None else None
        return Decoded(record, event, chunk_event_id, held, subject, key_id if subject is not None else None)
    except UnknownEventVersionError as exc:
        held = value if chunk_event_id is not None else None
        return TooNew(record, str(exc), exc.version, chunk_event_id, held)
    except InvalidEventError as exc:
        opened_key = key_id if subject is not None else None
        return DeadLetter(record, str(exc), header_type(record), value, chunk_event_id, subject, opened_key)
    except Exception as exc:  # a validator bug must not stop the partition; the DLQ keeps the event
        log.exception("unexpected error validating %s:%d@%d", record.topic, record.partition, record.offset)
        reason = f"unexpected {type(exc).__name__}: {exc}"
        opened_key = key_id if subject is not None else None
        return DeadLetter(record, reason, header_type(record), value, chunk_event_id, subject, opened_key)


def check_clear_headers(headers: Sequence[Header] | None, event: Any) -> None:
    """What a record says in clear for the one-writer rule is what its payload (sealed: authenticated)
    says: a protected write's `gl-intent` byte for byte, a prune's `gl-operation` (when it has one) its
    strategy. Readers of headers alone (a writer deciding its own verdict) then decide as the projector
    does. `InvalidEventError` otherwise: the projector dead-letters such a record, and a copy of the log
    leaves it out."""
    opened = unwrapped(event)
    carried = envelope.header(headers, envelope.HEADER_INTENT)
    intent = getattr(opened, "intent", None)
    if carried != intent:
        said = "no intent" if intent is None else "another intent"
        raise InvalidEventError(f"{envelope.HEADER_INTENT} header does not match its event, which carries {said}")
    operation = envelope.header(headers, envelope.HEADER_OPERATION)
    if operation is not None:
        expected = (b"1" if opened.strategy == "delete" else b"0") if isinstance(opened, ThreadPrune) else None
        if operation != expected:
            raise InvalidEventError(f"{envelope.HEADER_OPERATION} header does not match its event")
