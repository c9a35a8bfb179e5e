"""The read API's slots for reads that wait for the projection, shared fairly between tenants.

At most `api_max_consistency_waits` reads of one process wait at once. With several tenants, a tenant
takes a slot only while it holds fewer than are free, so a tenant holding all it can leaves at least as
many slots free as it holds: alone, half of them; k tenants that all keep asking settle at 1/(k+1) of
the slots each, the last share staying free for a tenant that holds none. No tenant, by filling its
share (with reads the projection will not reach soon, say), stops another tenant's reads. With one
tenant (no token, a single token, or hashes naming one tenant) nobody needs a share: every slot is its.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager


class WaitSlotsFull(Exception):
    """No slot for the tenant now: every slot is taken, or the tenant holds at least as many as are free."""


class WaitSlots:
    def __init__(self, limit: int, tenants: int) -> None:
        self.limit = limit
        self._shared = tenants > 1
        self._taken: Counter[str] = Counter()
        self._total = 0

    @property
    def waiting(self) -> int:
        return self._total

    def taken_by(self, tenant: str) -> int:
        return self._taken[tenant]

    @contextmanager
    def slot(self, tenant: str) -> Iterator[None]:
        """Hold one slot for `tenant` while the block runs; `WaitSlotsFull` at once when there is none.
        Taking it does not await, so the bound is exact."""
        free = self.limit - self._total
        if free <= 0 or (self._shared and self._taken[tenant] >= free):
            raise WaitSlotsFull
        self._taken[tenant] += 1
        self._total += 1
        try:
            yield
        finally:
            self._total -= 1
            self._taken[tenant] -= 1
            if not self._taken[tenant]:
                del self._taken[tenant]
