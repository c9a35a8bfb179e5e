"""A rebuild's catch-up without locks: apply until within one batch of the live projector."""

from __future__ import annotations

import asyncio

import asyncpg

from graphledger.errors import GraphledgerError
from graphledger_server.log.offsets import OffsetStatements, group_offsets
from graphledger_server.log.parked import carry_verdicts
from graphledger_server.replay.progress import Progress
from graphledger_server.replay.rebuild import Rebuilder
from graphledger_server.replay.shares import Stall
from graphledger_server.sql import lock_key


async def carry_verdicts_once(conn: asyncpg.Connection, live: str, rebuilt: str) -> None:
    """`carry_verdicts`, one process at a time: the workers of a split replay carry into one schema."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1::bigint)", lock_key(f"replay verdicts {rebuilt}"))
        await carry_verdicts(conn, live, rebuilt)


async def catch_up(
    conn: asyncpg.Connection, rebuilder: Rebuilder, progress: Progress, live: str, group: str,
    stop: asyncio.Event | None, stall: Stall | None = None,
) -> None:  # fmt: skip
    """Apply, without holding anything of the live schema, until within one batch of the live projector
    (or, with `stall`, until the rebuilder's partitions stop moving: a share waiting for another's)."""
    while True:
        rebuilder.set_caps(await group_offsets(conn, OffsetStatements(live), group))
        # After the caps: every verdict on a record below them was committed with (or before) its offset.
        await carry_verdicts_once(conn, live, rebuilder.schema)
        lag = rebuilder.lag()
        progress.update("catching up", rebuilder.records, lag, rebuilder.positions, rebuilder.caps)
        if lag <= rebuilder.settings.replay_batch_max_events:
            return
        if stall is not None and stall.stalled(rebuilder.positions):
            return
        if stop is not None and stop.is_set():
            raise GraphledgerError("replay interrupted; run it again to resume the rebuild")
        await rebuilder.step()
