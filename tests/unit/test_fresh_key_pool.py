"""The fresh-key pool asks in large requests, never one per few keys taken."""

from __future__ import annotations

import asyncio

from graphledger.erasure.fresh_keys import BATCH, FreshKeyPool
from graphledger.erasure.sealing import Cipher, cipher_of, new_data_key


class HeldSource:
    """A key source whose requests stay in flight until the test answers them."""

    def __init__(self) -> None:
        self.asked: list[int] = []
        self._in_flight: asyncio.Future[None] | None = None
        self._issued = 0

    async def fresh_keys(self, tenant: str, count: int) -> list[tuple[str, Cipher]]:
        self.asked.append(count)
        self._in_flight = asyncio.get_running_loop().create_future()
        await self._in_flight
        keys = [(f"k{self._issued + i}", cipher_of(new_data_key())) for i in range(count)]
        self._issued += count
        return keys

    async def answer(self, pool: FreshKeyPool) -> None:
        """Answer the request in flight and wait until the pool holds its keys."""
        assert self._in_flight is not None and not self._in_flight.done(), "no request in flight"
        held = len(pool)
        self._in_flight.set_result(None)
        for _ in range(2):
            await asyncio.sleep(0)  # the refill takes the keys, and asks again if it will
        assert len(pool) > held

    @property
    def in_flight(self) -> bool:
        return self._in_flight is not None and not self._in_flight.done()


async def _filling(size: int) -> tuple[HeldSource, FreshKeyPool]:
    """A pool of `size` keys whose first request is in flight."""
    source = HeldSource()
    pool = FreshKeyPool(source, "t", size)
    pool.fill()
    await asyncio.sleep(0)
    return source, pool


async def test_a_pool_in_use_asks_for_half_of_it_or_more_at_a_time() -> None:
    source, pool = await _filling(512)
    for _ in range(10):  # bounded: a pool that asks for every few keys taken would never stop
        if not source.in_flight:
            break
        for _ in range(3):  # new subjects take keys while each request is in flight
            pool.take()
        await source.answer(pool)
    for _ in range(600):
        assert pool.take() is not None
        await asyncio.sleep(0)  # a refill starts
        if source.in_flight:
            pool.take()
            await source.answer(pool)
    await pool.close()
    assert min(source.asked) >= 256, source.asked
    assert len(source.asked) <= 6, source.asked


async def test_a_pool_of_one_key_refills_after_it_is_taken() -> None:
    source, pool = await _filling(1)
    await source.answer(pool)
    assert pool.take() is not None
    await asyncio.sleep(0)
    assert source.in_flight, "taking the only key asks for another"
    await source.answer(pool)
    await pool.close()
    assert source.asked == [1, 1]


async def test_a_large_pool_fills_in_requests_the_read_api_accepts() -> None:
    source, pool = await _filling(1000)
    while source.in_flight:
        await source.answer(pool)
    await pool.close()
    assert source.asked == [BATCH, BATCH, BATCH], "asks in full requests while a quarter or more is missing"
    assert len(pool) == 3 * BATCH
