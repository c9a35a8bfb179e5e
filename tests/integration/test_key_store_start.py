"""A process starting on a key store that exists takes no lock on its tables (`keys/key_store.py`,
`migrate_key_store`), so a writer holding one of them in an open transaction (a projector stopped inside
its binding of a fresh key) holds up neither that process's first call nor the binds and key creations
of every other process, which would queue behind the lock it waits for."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

import asyncpg
import pytest

from graphledger_server.keys.key_store import KeyStore
from graphledger_server.keys.ring import KeyRing

SCHEMA = "graphledger_keys"
HUNG_S = 10.0
"""How long a call may take before it counts as held behind a lock (each takes milliseconds)."""


@pytest.fixture
async def pools(fresh_database: str) -> AsyncIterator[tuple[asyncpg.Pool, asyncpg.Pool]]:
    """The pools of a process running since the key store was made, and of one starting now."""
    running = await asyncpg.create_pool(fresh_database, min_size=1, max_size=2)
    starting = await asyncpg.create_pool(fresh_database, min_size=1, max_size=2)
    yield running, starting
    await starting.close()
    await running.close()


async def test_a_process_starting_beside_a_stopped_binding_waits_for_nothing(
    fresh_database: str, pools: tuple[asyncpg.Pool, asyncpg.Pool]
) -> None:
    ring = KeyRing([("kek", os.urandom(32))])
    running = KeyStore(pools[0], SCHEMA, ring)
    (stopped_key, _), (other_key, _) = await running.fresh_keys("acme", 2)  # makes the key store
    stopped = await asyncpg.connect(fresh_database)
    binding = stopped.transaction()
    await binding.start()
    try:
        # A binding whose process stopped after its UPDATE: its row and the table's ROW EXCLUSIVE lock are held.
        await stopped.execute(
            f"UPDATE {SCHEMA}.fresh_keys SET ref = 'thread-a', bound_at = now() WHERE id = $1", stopped_key
        )
        starting = KeyStore(pools[1], SCHEMA, ring)
        found = await asyncio.wait_for(starting.fresh([other_key]), HUNG_S)
        assert found[other_key].ref is None and found[other_key].tenant == "acme"
        bound = await asyncio.wait_for(running.bind_fresh([("thread-b", other_key)]), HUNG_S)
        assert isinstance(bound[("thread-b", other_key)], bytes)
        assert len(await asyncio.wait_for(running.fresh_keys("acme", 1), HUNG_S)) == 1
    finally:
        await binding.rollback()
        await stopped.close()


async def test_a_process_starting_on_an_empty_database_makes_the_key_store(
    pools: tuple[asyncpg.Pool, asyncpg.Pool],
) -> None:
    store = KeyStore(pools[1], SCHEMA, KeyRing([("kek", os.urandom(32))]))
    [(key_id, key)] = await store.fresh_keys("acme", 1)
    assert (await store.fresh([key_id]))[key_id].key == key
