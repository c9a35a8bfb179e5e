"""The client's memory bound (`max_inflight_bytes`) with the real broker: concurrent large writes share
the bound and all land; a write that finds no room within `produce_timeout_s` fails with a clear,
retryable error instead of queueing without bound.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from graphledger.client.publisher import EventPublisher
from graphledger.errors import PublishError
from graphledger.events import to_envelope
from graphledger.events.store import StorePut
from graphledger_server.log.topics import ensure_topics

EVENT_BYTES = 30_000
LIMIT = 64 * 1024


def _event(i: int) -> Any:
    return to_envelope(StorePut(("bp",), f"k{i}", b'{"pad": "' + b"x" * EVENT_BYTES + b'"}', None, None))


async def test_concurrent_large_publishes_stay_within_the_bound(make_settings: Any) -> None:
    settings = make_settings(max_inflight_bytes=LIMIT)
    await ensure_topics(settings)
    publisher = EventPublisher(settings)
    await publisher.start()
    try:
        assert publisher.inflight is not None
        inflight = publisher.inflight
        peak = 0
        done = asyncio.Event()

        async def sample() -> None:  # `used` only changes on this loop: every state that lasts an await is seen
            nonlocal peak
            while not done.is_set():
                peak = max(peak, inflight.used)
                await asyncio.sleep(0)

        sampler = asyncio.create_task(sample())
        acked = await asyncio.gather(*(publisher.publish(settings.store_topic, f"k{i}", _event(i)) for i in range(12)))
        done.set()
        await sampler
        assert len({position for positions in acked for position in positions}) == 12
        assert EVENT_BYTES < peak <= LIMIT  # two events fit at once, never a third
        assert inflight.used == 0
    finally:
        await publisher.stop()


async def test_a_publish_without_room_fails_retryably_after_the_deadline(make_settings: Any) -> None:
    settings = make_settings(max_inflight_bytes=LIMIT, produce_timeout_s=1.0)
    await ensure_topics(settings)
    publisher = EventPublisher(settings)
    await publisher.start()
    try:
        assert publisher.inflight is not None
        # Unacknowledged events holding the whole bound (a broker that stopped answering).
        held = await publisher.inflight.acquire(LIMIT)
        try:
            with pytest.raises(PublishError) as full:
                await publisher.publish(settings.store_topic, "k", _event(0))
        finally:
            publisher.inflight.release(held)
        assert full.value.retryable is True
        message = str(full.value)
        assert "GRAPHLEDGER_MAX_INFLIGHT_BYTES" in message and f"{LIMIT} bytes await" in message
        # Room again: the same write goes through.
        assert await publisher.publish(settings.store_topic, "k", _event(0))
        assert publisher.inflight.used == 0
    finally:
        await publisher.stop()
