"""How a test waits: it polls a condition until it holds or a deadline passes, never a bare sleep.

`wait_until` (synchronous) is the dev stack's own, `graphledger_server.devstack.ports.wait_until`;
`wait_for` is the same for a test on the event loop, whose condition may be a coroutine function. Both
fail with `TimeoutError` naming what they waited for. `wait_applied` waits for a projector to reach log
positions. `within` bounds a step that should not wait at all,
so a hang fails as that step, with where it hung, well before the test's own timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

import asyncpg

from graphledger.settings import Settings
from graphledger_server.devstack.ports import wait_until

WAIT_S = 60.0
POLL_S = 0.05

__all__ = ["POLL_S", "WAIT_S", "wait_applied", "wait_for", "wait_until", "within"]


async def wait_for(
    condition: Callable[[], Awaitable[object] | object], what: str, timeout_s: float = WAIT_S, poll_s: float = POLL_S
) -> None:
    """Poll `condition` (awaited when it returns an awaitable) until it is true; `TimeoutError` naming
    `what` after `timeout_s`. The loop runs between polls, so a condition can wait on this loop's tasks."""
    deadline = time.monotonic() + timeout_s
    while not await _holds(condition):
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        await asyncio.sleep(poll_s)


async def _holds(condition: Callable[[], Awaitable[object] | object]) -> bool:
    result = condition()
    if inspect.isawaitable(result):
        result = await result
    return bool(result)


@contextlib.asynccontextmanager
async def within(timeout_s: float, what: str) -> AsyncIterator[None]:
    """Run the block within `timeout_s`; `TimeoutError` naming `what`, chained to the cancelled await."""
    try:
        async with asyncio.timeout(timeout_s):
            yield
    except TimeoutError as exc:
        raise TimeoutError(f"{what} took over {timeout_s:.0f}s") from exc


async def wait_applied(
    settings: Settings, positions: Mapping[tuple[str, int], int], what: str, poll_s: float = POLL_S
) -> None:
    """Wait until the projector group of `settings` applied every record below each `(topic, partition)`'s
    position (its `graphledger_offsets` next offset at least that)."""
    conn = await asyncpg.connect(settings.postgres_dsn)

    async def reached() -> bool:
        rows = await conn.fetch(
            f"SELECT topic, partition, next_offset FROM {settings.postgres_schema}.graphledger_offsets "
            "WHERE consumer_group = $1",
            settings.projector_group_id,
        )
        have = {(r["topic"], r["partition"]): r["next_offset"] for r in rows}
        return all(have.get((topic, partition), 0) >= end for (topic, partition), end in positions.items())

    try:
        await wait_for(reached, what, WAIT_S, poll_s)
    finally:
        await conn.close()
