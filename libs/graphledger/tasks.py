"""asyncio waits that pass a cancellation of their caller on, where the standard forms can swallow it."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def cancel_and_wait(task: asyncio.Task[Any]) -> None:
    """Cancel `task` and return once it has ended; an exception it ended with, other than the
    cancellation, is raised. A cancellation of the caller while it waits is raised too:
    `contextlib.suppress(CancelledError)` around the wait would take it for the task's and swallow it.
    """
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        caller = asyncio.current_task()
        if caller is not None and caller.cancelling():
            raise


async def set_within(event: asyncio.Event, timeout_s: float) -> None:
    """Wait until `event` is set or `timeout_s` passed. Not `asyncio.wait_for`: on Python 3.11 it swallows
    a cancellation that arrives as the event is set (a watcher's wake-up as `stop` cancels it), and the
    cancelled task would then go on waiting."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            await event.wait()
