"""`drop_speculative`: work begun ahead of need ends without failing the caller, whose answer stands; its
failure is logged; a cancellation of the caller while it waits is the caller's, and stops the work."""

from __future__ import annotations

import asyncio
import logging

import pytest

from graphledger.tasks import drop_speculative

log = logging.getLogger("speculative")


async def _forever(running: asyncio.Event) -> None:
    running.set()
    await asyncio.Event().wait()


async def test_running_tasks_are_cancelled_and_the_caller_returns() -> None:
    running = [asyncio.Event(), asyncio.Event()]
    tasks = [asyncio.create_task(_forever(event)) for event in running]
    for event in running:
        await event.wait()
    await drop_speculative(log, tasks[0], None, tasks[1])
    assert all(task.cancelled() for task in tasks)


async def test_a_failure_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    async def fails() -> None:
        raise RuntimeError("the projection is gone")

    task = asyncio.create_task(fails(), name="a read ahead")
    await asyncio.sleep(0)  # it fails before the caller drops it
    with caplog.at_level(logging.WARNING, logger="speculative"):
        await drop_speculative(log, task)
    assert "a read ahead" in caplog.text and "the projection is gone" in caplog.text


async def test_a_task_not_cancelled_is_let_finish() -> None:
    finish = asyncio.Event()

    async def statement() -> str:
        await finish.wait()
        return "rows"

    task = asyncio.create_task(statement())
    await asyncio.sleep(0)
    dropping = asyncio.create_task(drop_speculative(log, task, cancel=False))
    await asyncio.sleep(0)
    assert not dropping.done()
    finish.set()
    await dropping
    assert task.result() == "rows"


async def test_a_caller_cancelled_while_it_waits_is_cancelled_and_stops_the_tasks() -> None:
    running = asyncio.Event()
    task = asyncio.create_task(_forever(running))
    await running.wait()
    dropping = asyncio.create_task(drop_speculative(log, task, cancel=False))
    await asyncio.sleep(0)
    dropping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await dropping
    await asyncio.sleep(0)
    assert dropping.cancelled() and task.cancelled()


async def test_a_caller_already_cancelled_waits_for_the_tasks_and_goes_on_with_its_cancellation() -> None:
    """Called while the caller's own cancellation is on its way out (a `finally`), every task is stopped."""
    running = [asyncio.Event(), asyncio.Event()]
    tasks = [asyncio.create_task(_forever(event)) for event in running]

    async def read() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await drop_speculative(log, *tasks)

    for event in running:
        await event.wait()
    reading = asyncio.create_task(read())
    await asyncio.sleep(0)
    reading.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reading
    assert all(task.cancelled() for task in tasks)
