"""Stopping a background task from the task that owns it."""

from __future__ import annotations

import asyncio
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
