"""A KafkaSaver with a bound (`max_inflight_bytes`) of about two checkpoints lands every one of many
concurrent checkpoints through the dev stack, and reads each back. The bound itself is
`integration/test_publisher_backpressure.py`."""

from __future__ import annotations

import asyncio
import uuid

from langgraph.checkpoint.base import empty_checkpoint

from graphledger import KafkaSaver
from graphledger_server.devstack.stack import DevStack

EVENT_BYTES = 30_000
LIMIT = 64 * 1024


def test_a_saver_with_a_tiny_bound_lands_every_concurrent_checkpoint(stack: DevStack) -> None:
    settings = stack.settings.model_copy(update={"max_inflight_bytes": LIMIT})
    threads = [f"bp-{uuid.uuid4().hex[:8]}-{i}" for i in range(8)]

    async def write_all(saver: KafkaSaver) -> None:
        async def one(thread: str) -> None:
            checkpoint = empty_checkpoint()
            checkpoint["channel_values"] = {"blob": b"y" * EVENT_BYTES}
            checkpoint["channel_versions"] = {"blob": saver.get_next_version(None, None)}
            config = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
            await saver.aput(config, checkpoint, {}, checkpoint["channel_versions"])

        await asyncio.gather(*(one(t) for t in threads))

    with KafkaSaver(settings) as saver:
        asyncio.run(write_all(saver))
        for thread in threads:
            found = saver.get_tuple({"configurable": {"thread_id": thread}})
            assert found is not None and found.checkpoint["channel_values"]["blob"] == b"y" * EVENT_BYTES
