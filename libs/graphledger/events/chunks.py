"""Splitting an encoded event larger than the broker's message limit into chunk records.

Each chunk is a record of its own with the event's key (so all chunks share a partition) and a
`gl-chunk` header `<event id>:<index>:<count>`. The projector keeps chunks in Postgres, inside its
batch transaction, until the last one arrives, so a crash between chunks loses nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from graphledger.errors import InvalidEventError


@dataclass(frozen=True, slots=True)
class ChunkRef:
    """Where one chunk belongs: the event it is part of, its position and the number of chunks."""

    event_id: str
    index: int
    count: int

    def header_value(self) -> bytes:
        return f"{self.event_id}:{self.index}:{self.count}".encode()


def split(value: bytes, max_bytes: int) -> list[bytes]:
    return [value[i : i + max_bytes] for i in range(0, len(value), max_bytes)] or [b""]


def parse_header(value: bytes) -> ChunkRef:
    try:
        event_id, index, count = value.decode().rsplit(":", 2)
        ref = ChunkRef(event_id, int(index), int(count))
    except (UnicodeDecodeError, ValueError):
        raise InvalidEventError(f"malformed gl-chunk header {value[:80]!r}") from None
    if not event_id or ref.count < 1 or not 0 <= ref.index < ref.count:
        raise InvalidEventError(f"gl-chunk header {value[:80]!r} is out of range")
    return ref
