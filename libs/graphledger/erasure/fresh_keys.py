"""Fresh data keys a client holds ahead of use, so a new subject's first write waits on no key round
trip (docs/security.md, "Keys off the write path").

The key store issues keys that belong to no subject yet (`POST /v1/keys` with `fresh`); the client
binds one to a subject the first time it seals for it, and names the key in the sealed payload
(`sealing.py`). A reader of the log binds the key to that subject in the key store when a record of
it first opens with the key (a record that merely names the key binds nothing: its id is in the
record's headers for anyone to copy), refuses a record that names a key bound to another subject, and
the key is destroyed when the subject is erased, so an erasure reaches keys bound after it too. The pool refills in the
background when it runs low; when the read API is away it waits and tries again, and a subject that
finds the pool empty fetches its own key as before.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

from graphledger.erasure.sealing import Cipher
from graphledger.retry import Backoff

log = logging.getLogger(__name__)

BATCH = 256
"""Most keys one request asks for (the read API's limit)."""
RETRY_MIN_S = 0.5
RETRY_MAX_S = 30.0


class FreshDataKeySource(Protocol):
    async def fresh_keys(self, tenant: str, count: int) -> list[tuple[str, Cipher]]:
        """`count` new data keys of the tenant bound to no subject, as `(key id, key)`."""
        ...


class FreshKeyPool:
    """One tenant's fresh keys, up to `size` (`client_fresh_keys`), on the client's event loop. It asks
    for more once half the pool or a full request (`BATCH`) is used, whichever is fewer, and never for
    less: topping up to exactly `size` while writes take keys would send a request for every few keys
    (measured: 900 requests of 2-4 keys in 6 s at 500 new threads/s, a third of the stack's CPU). A pod
    can start `size / 2` to `size` new subjects through an outage."""

    def __init__(
        self, source: FreshDataKeySource, tenant: str, size: int, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._source = source
        self._tenant = tenant
        self.size = size
        self._clock = clock
        self._least = max(1, min(BATCH, size // 2))
        """The fewest keys a request asks for: the pool refills when at least this many are missing."""
        self._keys: deque[tuple[str, Cipher]] = deque()
        self._refill: asyncio.Task[None] | None = None
        self._backoff = Backoff(RETRY_MIN_S, RETRY_MAX_S)
        self._next_try = 0.0

    def __len__(self) -> int:
        return len(self._keys)

    def take(self) -> tuple[str, Cipher] | None:
        """A fresh key, or None when the pool is empty; asks for more when it runs low."""
        key = self._keys.popleft() if self._keys else None
        self._start_refill()
        return key

    def fill(self) -> None:
        """Start filling the pool (a client's start); a failure is logged and retried later."""
        self._start_refill()

    async def close(self) -> None:
        if self._refill is not None:
            self._refill.cancel()
            await asyncio.gather(self._refill, return_exceptions=True)

    def _missing(self) -> int:
        """How many keys to ask for now (0: the pool holds enough)."""
        missing = self.size - len(self._keys)
        return min(BATCH, missing) if missing >= self._least else 0

    def _start_refill(self) -> None:
        if (self._refill is not None and not self._refill.done()) or self._clock() < self._next_try:
            return
        if self._missing():
            self._refill = asyncio.get_running_loop().create_task(self._ask())

    async def _ask(self) -> None:
        while wanted := self._missing():
            try:
                fresh = await self._source.fresh_keys(self._tenant, wanted)
            except Exception as exc:  # the read API or the key store away: writes fetch their own keys meanwhile
                if not self._backoff.failures:
                    log.warning(
                        "no fresh data keys from the read API (%s); retrying, new subjects fetch their own", exc
                    )
                self._next_try = self._clock() + self._backoff.delay()
                return
            self._keys.extend(fresh)
            self._backoff.reset()
            if not fresh:
                return
