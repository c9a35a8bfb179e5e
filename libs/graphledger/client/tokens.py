"""The newest acknowledged offset per partition of one client's writes: its consistency token.

Reads do not need it to be consistent (the read API finds what they must reflect in the log itself);
a store opened with `search_consistency="own_writes"` sends it with its searches, which then wait for
the caller's own writes only. It is also what `consistency_token` reports.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from graphledger.wire import Token


class AckedOffsets:
    """The newest acknowledged offset per (topic, partition)."""

    def __init__(self) -> None:
        self._newest: Token = {}
        self._lock = threading.Lock()
        """Acks are recorded on the client's loop thread; reads may take the token on the caller's."""

    def record(self, acked: Iterable[tuple[str, int, int]]) -> None:
        with self._lock:
            for topic, partition, offset in acked:
                if offset > self._newest.get((topic, partition), -1):
                    self._newest[(topic, partition)] = offset

    def token(self, topic: str | None = None) -> Token:
        """A copy of the offsets, of every topic or of one."""
        with self._lock:
            return {tp: offset for tp, offset in self._newest.items() if topic is None or tp[0] == topic}
