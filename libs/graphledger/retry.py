"""Capped exponential backoff, and one loop that retries an attempt with it: the one way graphledger waits
out a passing failure (a broker, Postgres or the read API away) instead of a loop written at each place."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


class Backoff:
    """The delays before each attempt after a failure: `initial_s`, doubling up to `max_s`, until `reset`."""

    def __init__(self, initial_s: float, max_s: float) -> None:
        if not 0 < initial_s <= max_s:
            raise ValueError(f"backoff from {initial_s}s to {max_s}s: want 0 < initial <= max")
        self.initial_s = initial_s
        self.max_s = max_s
        self._next_s = initial_s
        self.failures = 0
        """Failures since the last `reset`."""

    def delay(self) -> float:
        """The delay after one more failure."""
        delay = self._next_s
        self._next_s = min(self._next_s * 2, self.max_s)
        self.failures += 1
        return delay

    def reset(self) -> None:
        """After a success: the next failure waits `initial_s` again."""
        self._next_s = self.initial_s
        self.failures = 0


async def retried(
    attempt: Callable[[], Awaitable[T]],
    backoff: Backoff,
    *,
    retry_if: Callable[[Exception], bool],
    on_retry: Callable[[Exception, float], Awaitable[None] | None] | None = None,
    wait: Callable[[float], Awaitable[object]] = asyncio.sleep,
) -> T:
    """`attempt()`'s result, attempting again after `backoff`'s delay while it fails with an exception
    `retry_if` accepts (any other is raised at once). `on_retry` is told each failure and its delay before
    the wait; `wait` waits (a stop event's `set_within` ends a wait early)."""
    while True:
        try:
            result = await attempt()
        except Exception as exc:
            if not retry_if(exc):
                raise
            delay = backoff.delay()
            if on_retry is not None and (told := on_retry(exc, delay)) is not None:
                await told
            await wait(delay)
        else:
            backoff.reset()
            return result
