"""The newest checkpoint of each thread namespace a client read, as of a log position.

A get of the newest checkpoint that finds it here sends `X-Graphledger-Cached-Through`: when the
read API finds no record of the thread since that position but the client's own named ones, it
answers `current` without reading Postgres, and the client brings the kept checkpoint up to date with
its own writes (`own_writes.py`). Anything else (another process's write, a delete, a copy) gets the
projection's answer as usual, which replaces the kept one. Bounded: the least recently read
namespaces are forgotten first. A kept checkpoint is held packed (msgpack), so every read unpacks
objects of its own, as an answer from the read API would give it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import ormsgpack

DEFAULT_MAX_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Kept:
    """A namespace's newest checkpoint (packed wire form), as of `through`: it reflects every record of
    the thread below that offset of `partition`."""

    partition: int
    through: int
    packed: bytes

    @classmethod
    def of(cls, partition: int, through: int, wire: dict[str, Any] | None) -> Kept:
        return cls(partition, through, ormsgpack.packb(wire))

    def tuple(self) -> dict[str, Any] | None:
        """The checkpoint (None: the namespace has none), as objects of the caller's own."""
        return ormsgpack.unpackb(self.packed)  # type: ignore[no-any-return]


class LatestCheckpoints:
    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self._kept: OrderedDict[tuple[str, str], tuple[Kept, int]] = OrderedDict()
        self._size = 0
        self._max_bytes = max_bytes
        self._lock = threading.Lock()

    def get(self, thread_id: str, checkpoint_ns: str) -> Kept | None:
        with self._lock:
            entry = self._kept.get((thread_id, checkpoint_ns))
            if entry is None:
                return None
            self._kept.move_to_end((thread_id, checkpoint_ns))
            return entry[0]

    def forget(self, thread_id: str, checkpoint_ns: str) -> None:
        with self._lock:
            entry = self._kept.pop((thread_id, checkpoint_ns), None)
            if entry is not None:
                self._size -= entry[1]

    def put(self, thread_id: str, checkpoint_ns: str, kept: Kept) -> None:
        size = len(kept.packed)
        with self._lock:
            previous = self._kept.pop((thread_id, checkpoint_ns), None)
            if previous is not None:
                self._size -= previous[1]
            if size > self._max_bytes:
                return
            self._kept[(thread_id, checkpoint_ns)] = (kept, size)
            self._size += size
            while self._size > self._max_bytes:
                _, (_, forgotten) = self._kept.popitem(last=False)
                self._size -= forgotten
