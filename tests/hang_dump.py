"""Where a hanging async test waits: each unfinished asyncio task's stack, printed shortly before
pytest-timeout ends the test. Its own dump shows threads only, and an async test's thread sits in the
event loop's `select`, which says nothing of the coroutine that waits."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

MARGIN_S = 15.0
"""How long before the test's timeout the tasks are printed."""


def print_tasks(out: TextIO) -> None:
    """Every unfinished task's coroutine stack (Python 3.11 and 3.12 keep all tasks in one WeakSet; a
    later Python without it prints nothing)."""
    tasks = getattr(asyncio.tasks, "_all_tasks", None)
    if tasks is None:
        return
    for task in list(tasks):
        try:
            if not task.done():
                print(f"--- asyncio task {task.get_name()} waits in:", file=out)
                for line in _awaits(task.get_coro()):
                    print(f"  {line}", file=out)
        except Exception as exc:  # the loop moves on while this thread reads: a diagnostic, not the test
            print(f"--- a task could not be read ({exc!r})", file=out)


def _awaits(awaitable: object) -> Iterator[str]:
    """The chain of awaits from a task's coroutine down to what it waits on (`Task.print_stack` shows
    only the outermost frame of a suspended coroutine)."""
    for _ in range(200):
        frame = next((f for a in _FRAMES if (f := getattr(awaitable, a, None)) is not None), None)
        if frame is None:
            yield repr(awaitable)[:300]
            return
        yield f"{frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}"
        awaitable = next((w for a in _AWAITS if (w := getattr(awaitable, a, None)) is not None), None)
        if awaitable is None:
            return


_FRAMES = ("cr_frame", "gi_frame", "ag_frame")
_AWAITS = ("cr_await", "gi_yieldfrom", "ag_await")


@contextmanager
def tasks_printed_before(timeout_s: float) -> Iterator[None]:
    """Print the tasks to stderr `MARGIN_S` before `timeout_s` passes, unless the block ended first."""
    if timeout_s <= MARGIN_S:
        yield
        return
    timer = threading.Timer(timeout_s - MARGIN_S, print_tasks, args=(sys.stderr,))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
