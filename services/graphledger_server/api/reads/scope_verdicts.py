"""Whether a vector search's scope holds many items, remembered for a few seconds per API process.

A search with a query is exact when at most `exact_max_items` items match its namespace prefix and
filter, and uses the HNSW index otherwise; a capped count decides (0.2 ms for a scope of over 1,000
items: a sixth of the index search it gates). Scopes change size slowly, so each verdict is kept for
`ttl_s`. A stale one only picks the other of two correct algorithms for that long: an exact search
over a scope that just grew past the limit, or an index search over one that just shrank below it,
which falls back to the exact search when the index cannot fill the page.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import orjson

TTL_S = 10.0
MAX_ENTRIES = 10_000


def scope_key(namespace_prefix: Sequence[str], filter: dict[str, Any] | None) -> Hashable:
    """The scope of a search: its namespace prefix and its filter (key order does not matter)."""
    return tuple(namespace_prefix), orjson.dumps(filter, option=orjson.OPT_SORT_KEYS) if filter else b""


class ScopeVerdicts:
    """Bounded (least recently set first out) map of scope -> "more than exact_max_items match"."""

    def __init__(
        self, ttl_s: float = TTL_S, max_entries: int = MAX_ENTRIES, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._ttl_s = ttl_s
        self._max_entries = max_entries
        self._clock = clock
        self._verdicts: OrderedDict[Hashable, tuple[float, bool]] = OrderedDict()

    def get(self, key: Hashable) -> bool | None:
        """The verdict on `key` while it is fresh, else None (count again)."""
        entry = self._verdicts.get(key)
        if entry is None:
            return None
        expires, large = entry
        if self._clock() >= expires:
            del self._verdicts[key]
            return None
        return large

    def put(self, key: Hashable, large: bool) -> None:
        self._verdicts[key] = (self._clock() + self._ttl_s, large)
        self._verdicts.move_to_end(key)
        if len(self._verdicts) > self._max_entries:
            self._verdicts.popitem(last=False)
