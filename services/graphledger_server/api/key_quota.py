"""How many data keys one token may create: a token bucket per token, per read API process.

Every key `POST /v1/keys` creates is a row in the key store kept for ever (erasure leaves a tombstone),
so a token naming new subjects without end would grow it without end. Each token holds up to
`api_max_key_creations_per_minute` creations and earns them back at that rate; a request that would
create more than the token holds creates none and is a 429 saying when to retry. Fetching keys that
exist costs nothing. Buckets are per token hash, so their number is bounded by the configured tokens.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

SECONDS_PER_MINUTE = 60.0


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float


class KeyCreationQuota:
    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.capacity = per_minute
        self._rate = per_minute / SECONDS_PER_MINUTE
        self._clock = clock
        self._buckets: dict[bytes, _Bucket] = {}

    def take(self, token: bytes, count: int) -> float | None:
        """Spend `count` creations of `token`; None if it held them, else the seconds until it will
        (`math.inf`: more than a full bucket, never)."""
        if count <= 0:
            return None
        if count > self.capacity:
            return math.inf
        now = self._clock()
        bucket = self._buckets.setdefault(token, _Bucket(float(self.capacity), now))
        bucket.tokens = min(float(self.capacity), bucket.tokens + (now - bucket.at) * self._rate)
        bucket.at = now
        if bucket.tokens >= count:
            bucket.tokens -= count
            return None
        return (count - bucket.tokens) / self._rate
