"""asyncio waits that pass a cancellation of their caller on, where the standard forms can swallow it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
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


async def drop_speculative(log: logging.Logger, *tasks: asyncio.Task[Any] | None, cancel: bool = True) -> None:
    """End `tasks`, begun ahead of need and needed no more: cancel them (unless not `cancel`: a statement let
    finish costs Postgres less than one cancelled) and return once they have ended. What they ended with is
    not raised, so an answered read stays answered: a failure is logged. A cancellation of the caller while
    it waits is raised, and cancels the tasks; `asyncio.wait` keeps it apart from the tasks' own."""
    started = [task for task in tasks if task is not None]
    if not started:
        return
    if cancel:
        for task in started:
            task.cancel()
    try:
        await asyncio.wait(started)
    except asyncio.CancelledError:
        for task in started:
            task.cancel()
        raise
    for task in started:
        if not task.cancelled() and (failure := task.exception()) is not None:
            log.warning("%s, begun ahead of need, failed: %r", task.get_name(), failure)


async def set_within(event: asyncio.Event, timeout_s: float) -> None:
    """Wait until `event` is set or `timeout_s` passed. Not `asyncio.wait_for`: on Python 3.11 it swallows
    a cancellation that arrives as the event is set (a watcher's wake-up as `stop` cancels it), and the
    cancelled task would then go on waiting."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            await event.wait()
