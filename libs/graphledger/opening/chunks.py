"""Chunks of an event larger than the broker's message limit, put together again (pure): which chunk completes
its event, and the event's bytes from its parts. Where the earlier parts come from is the reader's: the
projector's chunk table (`graphledger_server/opening/chunk_table.py`), or the records a read holds."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from graphledger.opening.records import Chunk

ChunkKey = tuple[str, int, str]
"""`(topic, partition, event_id)`: one chunked event on one partition."""


def key_of(chunk: Chunk) -> ChunkKey:
    return (chunk.record.topic, chunk.record.partition, chunk.ref.event_id)


def completions(chunks: Sequence[tuple[int, Chunk]], stored: Mapping[ChunkKey, set[int]]) -> dict[int, ChunkKey]:
    """Positions (of `chunks`' `(position, chunk)`) where an event's last missing chunk arrives. Pure.

    An event completes when the distinct indexes stored and seen so far reach its count; chunks of
    it seen later in the batch are duplicates.
    """
    have: dict[ChunkKey, set[int]] = {}
    done: set[ChunkKey] = set()
    found: dict[int, ChunkKey] = {}
    for position, chunk in chunks:
        key = key_of(chunk)
        if key in done:
            continue
        indexes = have.setdefault(key, set(stored.get(key, ())))
        indexes.add(chunk.ref.index)
        if len(indexes) >= chunk.ref.count:
            found[position] = key
            done.add(key)
    return found


def assemble(parts: Mapping[int, bytes], count: int) -> bytes | None:
    """The event's bytes from its chunks in index order; None when one is missing."""
    try:
        return b"".join(parts[i] for i in range(count))
    except KeyError:
        return None
