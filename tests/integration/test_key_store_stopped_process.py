"""A process stopped inside a key store transaction holds its subject for `IDLE_IN_TRANSACTION_S` at most
(`keys/key_store.py`, `bounded_transaction`): Postgres ends its session, another reader's binding of the same
subject goes through, and the stopped process, once it runs again, gets an error it retries.

The stopped process is a real one (SIGSTOP), stopped at the point the hazard needs: inside its binding,
holding the subject's lock, its UPDATE done. A row lock the test holds keeps it waiting there until it is
stopped."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import AsyncIterator

import asyncpg
import pytest

from graphledger_server.keys.key_store import IDLE_IN_TRANSACTION_S, KeyStore
from graphledger_server.keys.ring import KeyRing

SCHEMA = "graphledger_keys"
BINDER = "graphledger-test-stopped-binder"
"""The stopped process's `application_name`, to find its session."""
HUNG_S = IDLE_IN_TRANSACTION_S + 10.0
"""How long the other binding may take before it counts as held for as long as the process stays stopped."""
STATE_DEADLINE_S = 30.0

BINDER_PROCESS = """
import asyncio, sys
import asyncpg
from graphledger_server.driver_errors import verdict_of
from graphledger_server.keys.ring import KeyRing
from graphledger_server.keys.key_store import KeyStore

async def main(dsn, schema, kek, ref, key_id, name):
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=1, server_settings={"application_name": name})
    store = KeyStore(pool, schema, KeyRing([("kek", bytes.fromhex(kek))]))
    try:
        await store.bind_fresh([(ref, key_id)])
        print("bound", flush=True)
    except Exception as exc:
        print(verdict_of(exc).value, type(exc).__name__, flush=True)
    await pool.close()

asyncio.run(main(*sys.argv[1:]))
"""


@pytest.fixture
async def pool(fresh_database: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await asyncpg.create_pool(fresh_database, min_size=1, max_size=2)
    yield pool
    await pool.close()


async def _binder_session(conn: asyncpg.Connection, until: str) -> None:
    """Wait until the stopped process's session is `until`: waiting on a lock, or idle in transaction."""
    deadline = time.monotonic() + STATE_DEADLINE_S
    while True:
        row = await conn.fetchrow(
            "SELECT state, wait_event_type FROM pg_stat_activity WHERE application_name = $1", BINDER
        )
        if row is not None and until in (row["state"], row["wait_event_type"]):
            return
        assert time.monotonic() < deadline, f"the binder's session never reached {until!r}: {row}"
        await asyncio.sleep(0.05)


async def test_a_process_stopped_inside_its_binding_holds_the_subject_for_a_bounded_time(
    fresh_database: str, pool: asyncpg.Pool
) -> None:
    kek = os.urandom(32)
    store = KeyStore(pool, SCHEMA, KeyRing([("kek", kek)]))
    [(key_id, key)] = await store.fresh_keys("acme", 1)
    watcher = await asyncpg.connect(fresh_database)  # outside a transaction: pg_stat_activity is then current
    holder = await asyncpg.connect(fresh_database)
    row_lock = holder.transaction()
    await row_lock.start()
    await holder.execute(f"SELECT 1 FROM {SCHEMA}.fresh_keys WHERE id = $1 FOR UPDATE", key_id)
    binder = await asyncio.create_subprocess_exec(
        *(sys.executable, "-c", BINDER_PROCESS, fresh_database, SCHEMA, kek.hex(), "thread-a", key_id, BINDER),
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        await _binder_session(watcher, "Lock")  # it holds the subject's lock and waits for the row
        os.kill(binder.pid, signal.SIGSTOP)
        await row_lock.commit()  # its UPDATE goes through; stopped, it never ends its transaction
        await _binder_session(watcher, "idle in transaction")
        bound = await asyncio.wait_for(store.bind_fresh([("thread-a", key_id)]), HUNG_S)
        assert bound == {("thread-a", key_id): key}
        assert await watcher.fetchval("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", BINDER) == 0
        os.kill(binder.pid, signal.SIGCONT)
        out, _ = await asyncio.wait_for(binder.communicate(), STATE_DEADLINE_S)
        assert out.decode().split()[0] == "retry", out
    finally:
        if binder.returncode is None:
            binder.kill()
            await binder.wait()
        await holder.close()
        await watcher.close()
