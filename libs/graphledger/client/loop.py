"""A private event loop on a daemon thread, where the client's Kafka producer and HTTP client live.

aiokafka and httpx's async client are bound to the loop they start on, while LangGraph calls a
checkpointer from plain threads (`graph.invoke`) and from any number of user loops (`ainvoke`). Both
paths hop onto this one loop, so there is one producer, one connection pool and one code path.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class BackgroundLoop:
    """Runs coroutines on a dedicated loop thread; `run` blocks the caller, `arun` awaits."""

    def __init__(self, name: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("graphledger's sync API was called from its own loop thread")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def arun(self, coro: Coroutine[Any, Any, T]) -> T:
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    def stop(self) -> None:
        if self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
