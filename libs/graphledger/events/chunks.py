"""Framing an encoded event into Kafka records: one record, or chunks when it is larger than the limit.

Every writer of events frames them here (the client's publisher, the projector's dead letters,
`graphledger dlq replay`). An event of at most `max_message_bytes` is one record with the event's
headers. A larger one is split into chunks, each a record of its own with the event's key (so all
chunks share a partition), the same headers and a `gl-chunk` header `<event id>:<index>:<count>`
last. The projector keeps chunks in Postgres, inside its batch transaction, until the last one
arrives, so a crash between chunks loses nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from graphledger.errors import InvalidEventError
from graphledger.events.envelope import HEADER_CHUNK, Headers

RECORD_HEADROOM_BYTES = 64 * 1024
"""Room beyond a record's value for its key and headers (envelope, trace, chunk and dead-letter
headers): producers' request size and consumers' fetch size are `max_message_bytes` plus this."""


@dataclass(frozen=True, slots=True)
class ChunkRef:
    """Where one chunk belongs: the event it is part of, its position and the number of chunks."""

    event_id: str
    index: int
    count: int

    def header_value(self) -> bytes:
        return f"{self.event_id}:{self.index}:{self.count}".encode()


class FramedRecord(NamedTuple):
    """One record of a framed event (its key is the event's); a NamedTuple, the cheapest to make per write."""

    value: bytes
    headers: list[tuple[str, bytes]]
    """The event's headers, plus `gl-chunk` last on a chunk; a list of its own the caller may extend."""


def split(value: bytes, max_bytes: int) -> list[bytes]:
    return [value[i : i + max_bytes] for i in range(0, len(value), max_bytes)] or [b""]


def frame(value: bytes, headers: Headers, max_message_bytes: int, chunk_id: str) -> list[FramedRecord]:
    """The records of one encoded event: itself, or its chunks with `gl-chunk` headers naming `chunk_id`.

    `chunk_id` identifies the chunks of this event on its partition: the event id, or a fresh one for
    an event published again (the projector may still hold chunks of its first publication).
    """
    if len(value) <= max_message_bytes:
        return [FramedRecord(value, list(headers))]
    parts = split(value, max_message_bytes)
    return [
        FramedRecord(part, [*headers, (HEADER_CHUNK, ChunkRef(chunk_id, i, len(parts)).header_value())])
        for i, part in enumerate(parts)
    ]


def parse_header(value: bytes) -> ChunkRef:
    try:
        event_id, index, count = value.decode().rsplit(":", 2)
        ref = ChunkRef(event_id, int(index), int(count))
    except (UnicodeDecodeError, ValueError):
        raise InvalidEventError(f"malformed gl-chunk header {value[:80]!r}") from None
    if not event_id or ref.count < 1 or not 0 <= ref.index < ref.count:
        raise InvalidEventError(f"gl-chunk header {value[:80]!r} is out of range")
    return ref
