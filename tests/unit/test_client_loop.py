"""The client's background loop: results, errors and cancellation cross threads intact."""

from __future__ import annotations

import asyncio
import threading

import pytest

from graphledger.client.loop import BackgroundLoop


@pytest.fixture
def background():
    loop = BackgroundLoop("test-loop")
    yield loop
    loop.stop()


async def _thread_name() -> str:
    await asyncio.sleep(0)
    return threading.current_thread().name


async def test_many_concurrent_calls_run_on_the_background_thread(background) -> None:
    names = await asyncio.gather(*(background.arun(_thread_name()) for _ in range(500)))
    assert set(names) == {"test-loop"}


async def test_an_error_reaches_the_caller(background) -> None:
    async def fail() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        await background.arun(fail())


async def test_a_cancelled_caller_cancels_the_work(background) -> None:
    started, cancelled = threading.Event(), threading.Event()

    async def wait_forever() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    call = asyncio.create_task(background.arun(wait_forever()))
    await asyncio.to_thread(started.wait, 10)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert await asyncio.to_thread(cancelled.wait, 10)


def test_sync_run_from_a_plain_thread(background) -> None:
    assert background.run(_thread_name(), timeout=10) == "test-loop"
