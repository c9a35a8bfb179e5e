"""A bound on what a process keeps of threads: whole entries, least recently used first out.

One mechanism for the client's held threads (`client/threads.py`) and the read API's folded views
(`graphledger_server/api/consistency/read_through.py`). An entry is replaced, never changed in place, so a reader that
took one keeps a whole snapshot whatever is evicted after.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class ViewLru(Generic[K, V]):
    """Entries by key; beyond `max_bytes` of their sizes the least recently used are dropped whole."""

    def __init__(self, max_bytes: int, size: Callable[[V], int]) -> None:
        self._entries: OrderedDict[K, V] = OrderedDict()
        self._size_of = size
        self._size = 0
        self.max_bytes = max_bytes

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def size(self) -> int:
        """Bytes of the entries kept, as their sizes count them."""
        return self._size

    def peek(self, key: K) -> V | None:
        """The entry, leaving its place in the order as it is."""
        return self._entries.get(key)

    def get(self, key: K) -> V | None:
        """The entry, marked as the most recently used."""
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def put(self, key: K, entry: V, *, touch: bool = True) -> None:
        """Keep `entry` for `key` in place of what was kept (as the most recently used unless not `touch`),
        then drop the least recently used while the bound is passed."""
        previous = self._entries.get(key)
        if previous is not None:
            self._size -= self._size_of(previous)
        self._entries[key] = entry
        if touch:
            self._entries.move_to_end(key)
        self._size += self._size_of(entry)
        while self._size > self.max_bytes and self._entries:
            _, dropped = self._entries.popitem(last=False)
            self._size -= self._size_of(dropped)

    def pop(self, key: K) -> V | None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._size -= self._size_of(entry)
        return entry

    def clear(self) -> None:
        self._entries.clear()
        self._size = 0

    def items(self) -> list[tuple[K, V]]:
        """The entries, least recently used first (a copy: putting while iterating is safe)."""
        return list(self._entries.items())
