"""Thread ids whose records a saver's producer routes to a chosen partition of the checkpoint topic."""

from __future__ import annotations

import uuid

from graphledger import KafkaSaver


async def threads_on_partition(saver: KafkaSaver, partition: int, count: int = 1, label: str = "p") -> list[str]:
    """`count` new thread ids on `partition`, as the started `saver` keys and routes their records."""
    runtime = saver._runtime
    found: list[str] = []
    while len(found) < count:
        thread_id = f"{label}-{uuid.uuid4().hex[:10]}"
        key = runtime.record_key_of_thread(thread_id)
        assert key is not None, "the saver does not know its record keys yet"
        if await runtime.publisher.partition_of(runtime._settings.checkpoint_topic, key) == partition:
            found.append(thread_id)
    return found
