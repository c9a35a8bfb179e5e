"""Consistency tokens scoped to what a read touches.

A checkpoint read of thread X only needs this client's own writes that touched X to be projected;
waiting for every partition this client ever wrote to would make each `graph.invoke` wait for the
previous run's writes on unrelated threads. So acknowledged offsets are kept per thread (an LRU),
plus a client-wide token for writes that name no single thread (`delete_for_runs`, store writes) and
for reads that span threads (`list` without a thread). Losing a thread's entry to the LRU bound
falls back to the client-wide token, which is always a superset: never weaker, only slower.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable

Token = dict[tuple[str, int], int]

DEFAULT_MAX_SCOPES = 100_000


def _merge(into: Token, acked: Iterable[tuple[str, int, int]]) -> None:
    for topic, partition, offset in acked:
        if offset > into.get((topic, partition), -1):
            into[(topic, partition)] = offset


class ConsistencyTokens:
    """The newest acknowledged offsets, client-wide and per scope (thread id)."""

    def __init__(self, max_scopes: int = DEFAULT_MAX_SCOPES) -> None:
        self.client_wide: Token = {}
        self._global: Token = {}
        self._scoped: OrderedDict[str, Token] = OrderedDict()
        self._max_scopes = max_scopes
        self._evicted = False
        self._lock = threading.Lock()
        """Acks are recorded on the client's loop thread; reads may take tokens on the caller's."""

    def record(self, acked: list[tuple[str, int, int]], scopes: Iterable[str] | None) -> None:
        """Offsets of one acknowledged event; `scopes=None` means it may touch any thread."""
        with self._lock:
            self._record(acked, scopes)

    def _record(self, acked: list[tuple[str, int, int]], scopes: Iterable[str] | None) -> None:
        _merge(self.client_wide, acked)
        if scopes is None:
            _merge(self._global, acked)
            return
        for scope in scopes:
            token = self._scoped.pop(scope, None) or {}
            _merge(token, acked)
            self._scoped[scope] = token
            if len(self._scoped) > self._max_scopes:
                self._scoped.popitem(last=False)
                self._evicted = True

    def for_scope(self, scope: str | None) -> Token:
        """What a read must wait for: everything for a cross-thread read, else the thread's own writes."""
        with self._lock:
            return self._for_scope(scope)

    def _for_scope(self, scope: str | None) -> Token:
        if scope is None:
            return dict(self.client_wide)
        own = self._scoped.get(scope)
        if own is None and self._evicted:
            return dict(self.client_wide)
        token = dict(self._global)
        _merge(token, ((t, p, o) for (t, p), o in (own or {}).items()))
        return token
