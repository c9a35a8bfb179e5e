"""`cancel_and_wait`: the stopped task's cancellation ends quietly, the caller's own is raised; `set_within`
passes a cancellation on even when it arrives as its event is set."""

from __future__ import annotations

import asyncio

import pytest

from graphledger.tasks import cancel_and_wait, set_within


async def test_a_task_stopped_ends_cancelled_and_the_caller_returns() -> None:
    running = asyncio.Event()

    async def forever() -> None:
        running.set()
        await asyncio.Event().wait()

    task = asyncio.create_task(forever())
    await running.wait()
    await cancel_and_wait(task)
    assert task.cancelled()


async def test_an_error_the_task_ends_with_is_raised() -> None:
    running = asyncio.Event()

    async def fails_on_stop() -> None:
        try:
            running.set()
            await asyncio.Event().wait()
        finally:
            raise RuntimeError("cleanup failed")

    task = asyncio.create_task(fails_on_stop())
    await running.wait()
    with pytest.raises(RuntimeError, match="cleanup failed"):
        await cancel_and_wait(task)


async def test_a_caller_cancelled_while_it_waits_is_cancelled() -> None:
    running, cleaning = asyncio.Event(), asyncio.Event()

    async def slow_to_stop() -> None:
        try:
            running.set()
            await asyncio.Event().wait()
        finally:
            cleaning.set()
            await asyncio.Event().wait()  # ends only when cancelled again

    task = asyncio.create_task(slow_to_stop())
    await running.wait()
    stopper = asyncio.create_task(cancel_and_wait(task))
    await cleaning.wait()  # the stopper cancelled the task and waits for it
    stopper.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopper
    assert stopper.cancelled() and task.cancelled()


async def test_a_wait_cancelled_as_its_event_is_set_is_cancelled() -> None:
    event = asyncio.Event()
    waiting = asyncio.create_task(set_within(event, 300))
    await asyncio.sleep(0)  # the point: one loop step, so that the wait has begun
    event.set()
    waiting.cancel()  # in the same step as the wake-up (a watcher's `stop` as a notification arrives)
    with pytest.raises(asyncio.CancelledError):
        await waiting


async def test_a_wait_ends_when_its_event_is_set_or_its_time_is_up() -> None:
    event = asyncio.Event()
    event.set()
    await set_within(event, 300)
    await set_within(asyncio.Event(), 0)
