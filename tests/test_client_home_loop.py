"""Reads from the event loop that opened a client skip the hop to the client's loop thread.

The opening loop (`async with`) reads through its own HTTP session, closed when the block ends; its
reads still wait for the client's writes, which are acknowledged on the loop thread. Any other loop
reads through the loop thread as before.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

from graphledger import KafkaStore


async def test_the_opening_loop_reads_directly_and_still_reads_its_writes(stack: Any) -> None:
    root = f"home-{uuid.uuid4().hex[:8]}"
    async with KafkaStore(stack.settings) as store:
        runtime = store._runtime
        home = runtime._home
        assert home is not None and home[0] is asyncio.get_running_loop()
        for i in range(20):
            await store.aput((root,), f"k{i}", {"n": i})
            item = await store.aget((root,), f"k{i}")  # the put's token, taken on this thread
            assert item is not None and item.value == {"n": i}
        session = home[1]._session
        assert session is not None and not session.closed  # the reads went through it
        assert runtime._reader is not None and runtime._reader._session is None  # not through the thread

        # Another loop, in another thread, reads through the loop thread.
        found: list[Any] = []
        thread = threading.Thread(target=lambda: found.append(asyncio.run(store.aget((root,), "k3"))))
        thread.start()
        await asyncio.to_thread(thread.join)
        assert found[0] is not None and found[0].value == {"n": 3}
        assert runtime._reader._session is not None
    assert session.closed
    assert runtime._home is None
