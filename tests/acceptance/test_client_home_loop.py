"""A client opened with `async with` runs on the opening loop: that loop's reads and writes need no hop.

Its producer and HTTP session live on that loop; another loop, or a plain thread, hops onto it; a sync
call from the opening loop's own thread is refused (it would block the loop it waits for).
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

import pytest

from graphledger import KafkaStore
from graphledger.client.loop import HomeLoop


async def test_the_opening_loop_runs_the_client_and_other_loops_hop_onto_it(stack: Any) -> None:
    root = f"home-{uuid.uuid4().hex[:8]}"
    async with KafkaStore(stack.settings) as store:
        runtime = store._runtime
        assert isinstance(runtime._loop, HomeLoop) and runtime._loop.loop is asyncio.get_running_loop()
        for i in range(20):
            await store.aput((root,), f"k{i}", {"n": i})
            item = await store.aget((root,), f"k{i}")
            assert item is not None and item.value == {"n": i}
        assert runtime._reader is not None
        session = runtime._reader._session
        assert session is not None and not session.closed

        # Another loop, in another thread, hops onto the opening loop; so does a plain thread.
        found: list[Any] = []
        thread = threading.Thread(target=lambda: found.append(asyncio.run(store.aget((root,), "k3"))))
        thread.start()
        await asyncio.to_thread(thread.join)
        assert found[0] is not None and found[0].value == {"n": 3}
        assert (await asyncio.to_thread(store.get, (root,), "k4")).value == {"n": 4}  # type: ignore[union-attr]

        with pytest.raises(RuntimeError, match="call the async method"):
            store.get((root,), "k5")  # on the opening loop's thread
    assert session.closed
    assert runtime._loop is None
