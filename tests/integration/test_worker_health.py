"""`/livez` and `/readyz` of the projector and the sweeper against the real broker and Postgres.

The projector: ready once assigned and caught up; live while idle for several deadlines; not live
once its batch is stuck on a statement that never returns (the offset rows locked by another session,
as a hung connection or a deadlock would leave it), within the deadline; live again, and the batch
applied, once the lock goes. The sweeper: ready and live as the active replica and as a standby.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import asyncpg

from graphledger.settings import Settings
from graphledger_server.devstack.ports import free_port
from graphledger_server.projection.migrate import migrate
from graphledger_server.sweeper.main import run_sweeper
from graphledger_server.sweeper.sweep import longest_step_s
from polling import wait_for
from projection_helpers import put
from worker_helpers import aprobe, producer_for, publish, running_projector

DEADLINE_S = 4.0


async def _applied(conn: asyncpg.Connection, settings: Settings, thread_id: str) -> bool:
    sql = f"SELECT count(*) FROM {settings.postgres_schema}.checkpoints WHERE thread_id = $1"
    return bool(await conn.fetchval(sql, thread_id))


async def test_a_frozen_projector_turns_not_live_within_the_deadline_and_an_idle_one_stays_live(
    ready_settings: Callable[..., Awaitable[Settings]],
) -> None:
    settings = await ready_settings(health_port=free_port(), health_deadline_s=DEADLINE_S, projector_retry_max_s=1.0)
    base = f"http://127.0.0.1:{settings.health_port}"
    db = await asyncpg.connect(settings.postgres_dsn)
    try:
        async with producer_for(settings) as producer, running_projector(settings):
            await wait_for(lambda: _ok(f"{base}/readyz"), "the projector to be assigned and caught up")

            # Idle for three deadlines: every probe says live (the loop keeps completing empty polls).
            idle_until = time.monotonic() + 3 * DEADLINE_S
            while time.monotonic() < idle_until:
                code, body = await aprobe(f"{base}/livez")
                assert code == 200 and body["seconds_since_progress"] <= DEADLINE_S, body
                await asyncio.sleep(0.2)
            assert (await aprobe(f"{base}/readyz"))[0] == 200

            # Frozen: the next batch waits for ever on the offset rows another session holds.
            blocker = await asyncpg.connect(settings.postgres_dsn)
            try:
                lock = blocker.transaction()
                await lock.start()
                await blocker.execute(f"LOCK TABLE {settings.postgres_schema}.graphledger_offsets IN EXCLUSIVE MODE")
                await publish(producer, settings, put("frozen", 1), 0)
                await wait_for(lambda: _not_ok(f"{base}/livez"), "/livez to report the frozen loop", 3 * DEADLINE_S)
                code, body = await aprobe(f"{base}/livez")
                assert code == 503 and body["status"] == "not live", body
                assert body["seconds_since_progress"] > DEADLINE_S and "stuck" in body["reason"]
                assert (await aprobe(f"{base}/readyz"))[0] == 503
                assert not await _applied(db, settings, "frozen")
                await lock.rollback()
            finally:
                await blocker.close()

            await wait_for(lambda: _applied(db, settings, "frozen"), "the batch once the lock is gone")
            await wait_for(lambda: _ok(f"{base}/livez"), "/livez to recover")
            await wait_for(lambda: _ok(f"{base}/readyz"), "/readyz to recover")
    finally:
        await db.close()


async def test_the_sweeper_is_ready_as_the_active_replica_and_as_a_standby(
    make_settings: Callable[..., Settings],
) -> None:
    settings = make_settings(sweeper_interval_s=0.5)
    await migrate(settings.postgres_dsn, settings.postgres_schema)
    first = settings.model_copy(update={"health_port": free_port()})
    second = settings.model_copy(update={"health_port": free_port()})
    stop = asyncio.Event()
    active = asyncio.create_task(run_sweeper(first, stop))
    try:
        await wait_for(lambda: _ok(f"http://127.0.0.1:{first.health_port}/readyz"), "the active sweeper")
        standby = asyncio.create_task(run_sweeper(second, stop))
        try:
            await wait_for(lambda: _ok(f"http://127.0.0.1:{second.health_port}/readyz"), "the standby sweeper")
            for port in (first.health_port, second.health_port):
                code, body = await aprobe(f"http://127.0.0.1:{port}/livez")
                assert code == 200 and body["limit_s"] == settings.health_deadline_s + longest_step_s(settings), body
        finally:
            stop.set()
            await asyncio.wait_for(standby, 30)
    finally:
        stop.set()
        await asyncio.wait_for(active, 30)
    assert (await aprobe(f"http://127.0.0.1:{first.health_port}/livez"))[0] == 0  # the server stopped with it


async def _ok(url: str) -> bool:
    return (await aprobe(url))[0] == 200


async def _not_ok(url: str) -> bool:
    return (await aprobe(url))[0] == 503
