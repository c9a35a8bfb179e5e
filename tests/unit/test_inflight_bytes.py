"""The client's bound on bytes sent and not acknowledged (`InflightBytes`): an event larger than the bound
holds all of it, alone. The bound with the real broker is `integration/test_publisher_backpressure.py`."""

from __future__ import annotations

import asyncio

import pytest

from graphledger.client.publisher import InflightBytes


async def test_one_event_larger_than_the_bound_goes_alone() -> None:
    bound = InflightBytes(1024)
    held = await bound.acquire(10_000)
    assert bound.used == 1024
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.2):
            await bound.acquire(1)
    bound.release(held)
    assert bound.used == 0
