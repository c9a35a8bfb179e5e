"""Coalescing of TTL refreshes: a hot item read many times gets one `store.refresh` per window.

Each refresh is an event on the log (so a replay keeps refreshed lifetimes); without coalescing an
item read a thousand times a second would publish a thousand events a second for one outcome.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Iterable

Target = tuple[tuple[str, ...], str]
"""An item: `(namespace, key)`."""

DEFAULT_MAX_ITEMS = 100_000


class RefreshCoalescer:
    """Which items are due a refresh: those not refreshed by this client within `window_s`.

    Bounded: the least recently refreshed items are forgotten first (and may then refresh early).
    Thread-safe, as the store serves plain threads and event loops alike.
    """

    def __init__(self, window_s: float, max_items: int = DEFAULT_MAX_ITEMS) -> None:
        self.window_s = window_s
        self._max_items = max_items
        self._last: OrderedDict[Target, float] = OrderedDict()
        self._lock = threading.Lock()

    def due(self, targets: Iterable[Target]) -> list[Target]:
        """The targets to refresh now (each once), recorded as refreshed."""
        now = time.monotonic()
        out: list[Target] = []
        with self._lock:
            for target in dict.fromkeys(targets):
                last = self._last.get(target)
                if last is not None and now - last < self.window_s:
                    continue
                self._last[target] = now
                self._last.move_to_end(target)
                out.append(target)
            while len(self._last) > self._max_items:
                self._last.popitem(last=False)
        return out
