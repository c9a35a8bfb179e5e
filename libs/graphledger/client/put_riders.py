"""A superstep's writes ride in the produce request of their checkpoint's put.

LangGraph puts a superstep's checkpoint only once the previous put is acknowledged, while the
superstep's tasks may finish before that: their `put_writes` come first. aiokafka sends one request
at a time per broker, so writes sent on their own take a request (a round trip) that the put then
waits behind. Writes of a checkpoint newer than any the thread holds, whose put is not sent yet,
wait for that put (at most `WAIT_FOR_PUT_S`): the put lets them go first in the same turn of the event loop,
and they share one request. Writes of any other checkpoint go at once. The log then holds the writes
before their put, which the projection and the fold (`folds/thread.py`) take as they come.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter

from graphledger.client.threads import HeldThreads
from graphledger.events.checkpoint import CheckpointPut, CheckpointWrites

WAIT_FOR_PUT_S = 0.05
"""Longest a writes call waits for its checkpoint's put (a put that never comes: its chain failed)."""

Checkpoint = tuple[str, str, str]


class PutRiders:
    """On the client's event loop."""

    def __init__(self, threads: HeldThreads) -> None:
        self._threads = threads
        self._sending: Counter[Checkpoint] = Counter()
        """Puts handed to the producer and not acknowledged yet."""
        self._waiting: dict[Checkpoint, asyncio.Future[None]] = {}

    async def before_writes(self, event: CheckpointWrites) -> None:
        checkpoint = (event.thread_id, event.checkpoint_ns, event.checkpoint_id)
        if self._sending[checkpoint] or not self._threads.before_newest(*checkpoint):
            return
        released = self._waiting.get(checkpoint)
        if released is None:
            released = self._waiting[checkpoint] = asyncio.get_running_loop().create_future()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(WAIT_FOR_PUT_S):
                await asyncio.shield(released)
        if self._waiting.get(checkpoint) is released and not released.done():
            del self._waiting[checkpoint]

    async def before_put(self, event: CheckpointPut) -> Checkpoint:
        """Call right before the put goes to the producer; `put_done` once it is acknowledged or failed."""
        checkpoint = (event.thread_id, event.checkpoint_ns, event.checkpoint_id)
        self._sending[checkpoint] += 1
        released = self._waiting.pop(checkpoint, None)
        if released is not None:
            released.set_result(None)
            await asyncio.sleep(0)  # the waiting writes reach the producer first, in this loop turn
        return checkpoint

    def put_done(self, checkpoint: Checkpoint) -> None:
        self._sending[checkpoint] -= 1
        if not self._sending[checkpoint]:
            del self._sending[checkpoint]
