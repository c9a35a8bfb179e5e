"""One replay, start to switch: check the log, rebuild beside the live schema, catch up, verify, switch.

The switch protocol (docs/replay.md argues it):
1. catch up without locks until the rebuild is within one batch of the live projector (loading with
   primary keys only; the live schema's secondary indexes are then built on the rebuild, and it
   catches up again);
2. `LOCK TABLE <live>.graphledger_offsets IN EXCLUSIVE MODE`: every projector batch starts by locking
   its offset rows (`FOR UPDATE`, which this blocks), so from here the live schema stands still, while
   reads (plain SELECTs) go on;
3. apply the rest up to exactly the live offsets; compare offsets, row counts and checksums;
4. in the same transaction rename live -> `<live>_old_<time>` and rebuild -> live, NOTIFY, commit.
The projector batch that waited on the lock then finds the offsets table its name means is another
one, rolls back and re-runs into the new schema (`SchemaSwitchedError`), continuing from offsets equal
to those it had. A mismatch rolls back instead: nothing switched, the rebuild stays for inspection.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TextIO

import asyncpg

from graphledger.errors import GraphledgerError, ReplayVerificationError
from graphledger.settings import Settings
from graphledger_server.log.offsets import (
    OffsetStatements,
    group_offsets,
    hold_projection,
    notify_applied,
    offsets_table_exists,
)
from graphledger_server.opening.vector_index import load_vector_index
from graphledger_server.projection.migrate import migrate
from graphledger_server.replay import indexes, schemas, shares
from graphledger_server.replay.catch_up import carry_verdicts_once, catch_up
from graphledger_server.replay.checksums import TableCheck, compare
from graphledger_server.replay.preflight import inspect_sources, refuse_losses
from graphledger_server.replay.progress import Progress
from graphledger_server.replay.rebuild import TP, Rebuilder
from graphledger_server.replay.shares import Share
from graphledger_server.replay.workers import LocalWorkers, await_shares, load_share
from graphledger_server.telemetry import replay as telemetry

log = logging.getLogger(__name__)

FINAL_CATCH_UP_S = 120.0
"""Longest the last catch-up may hold the live projector; past it the replay gives up (retry later)."""


@dataclass
class ReplayReport:
    live: str
    rebuilt: str
    retired: str | None
    """The old schema's name after the switch; None when not switched."""
    events: int
    seconds: float
    offsets: dict[TP, int]
    checks: list[TableCheck] = field(default_factory=list)
    losses: list[str] = field(default_factory=list)


def _nonzero(offsets: dict[TP, int]) -> dict[TP, int]:
    return {tp: o for tp, o in offsets.items() if o}


async def run_replay(
    settings: Settings,
    *,
    accept_loss: bool = False,
    restart: bool = False,
    switch: bool = True,
    accept_differences: bool = False,
    out: TextIO | None = sys.stderr,
    stop: asyncio.Event | None = None,
    workers: int = 1,
    spawn: bool = True,
    run: str | None = None,
) -> ReplayReport:
    """Rebuild `settings.postgres_schema` from the log and (with `switch`) put the rebuild in its place.

    Resumes an unfinished rebuild unless `restart`. Raises `LossRefusedError` before touching anything
    when the log lacks events (unless `accept_loss`), `ReplayVerificationError` when the rebuild differs
    (unless `accept_differences`: a rebuild meant to differ, by a version that applies events otherwise
    than the one that built the live schema, switches all the same). With `workers` above 1 the load is
    split by partition (`replay/shares.py`): this process is worker 0, the coordinator, and starts the
    others as child processes (`spawn`) or leaves them to the pods of an Indexed Job, which share `run`.
    """
    live, group = settings.postgres_schema, settings.projector_group_id
    rebuilt = schemas.rebuild_name(live)
    started = time.monotonic()
    with telemetry.span("replay.run", **{"db.namespace": live}):
        losses = refuse_losses(await inspect_sources(settings), accept_loss=accept_loss)
        conn = await asyncpg.connect(settings.postgres_dsn)
        try:
            if not await offsets_table_exists(conn, OffsetStatements(live)):
                raise GraphledgerError(f"schema {live!r} has no projection to replace; run `graphledger migrate`")
            if restart and await schemas.drop_rebuild(conn, live):
                log.info("dropped the unfinished rebuild %s", rebuilt)
            # The live schema's vector table shape, not the settings': the projector obeys the schema's.
            await migrate(settings.postgres_dsn, rebuilt, vectors=await load_vector_index(conn, live))
            await schemas.mark_rebuild(conn, live)
            await indexes.drop_secondary(conn, rebuilt)
            shared = await _load_shares(settings, conn, workers, spawn, run, out, stop) if workers > 1 else 0
            rebuilder = Rebuilder(settings, rebuilt)
            progress = Progress(out)
            await rebuilder.start()
            try:
                with telemetry.span("replay.catch_up"):
                    await catch_up(conn, rebuilder, progress, live, group, stop)
                    await rebuilder.flush()
                with telemetry.span("replay.index"):
                    await indexes.create_like_live(conn, live, rebuilt)
                with telemetry.span("replay.catch_up"):
                    await catch_up(conn, rebuilder, progress, live, group, stop)
                report = await _verify_and_switch(
                    conn, rebuilder, progress, live, group, switch=switch, accept_differences=accept_differences
                )
            finally:
                await rebuilder.close()
        finally:
            await conn.close()
    report.events += shared
    report.seconds = time.monotonic() - started
    report.losses = losses
    return report


async def _load_shares(
    settings: Settings, conn: asyncpg.Connection, workers: int, spawn: bool, run: str | None,
    out: TextIO | None, stop: asyncio.Event | None,
) -> int:  # fmt: skip
    """Worker 0's part of a split load: open the run's shares, load share 0 while the other workers load
    theirs, wait for every one; returns the records all of them applied."""
    if run is None:
        if not spawn:
            raise GraphledgerError("--worker-index 0 coordinates the pods of one run: give them all the same --run-id")
        run = uuid.uuid4().hex
    rebuilt = schemas.rebuild_name(settings.postgres_schema)
    await shares.open_shares(conn, rebuilt, workers, run)
    local = LocalWorkers(settings, workers, run) if spawn else None
    try:
        if local is not None:
            await local.start()
        with telemetry.span("replay.load"):
            own = await load_share(settings, conn, Share(0, workers), out, stop)
            await await_shares(conn, rebuilt, local, out, stop)
    finally:
        if local is not None:
            await local.stop()
    return own + await shares.loaded(conn, rebuilt)


async def _verify_and_switch(
    conn: asyncpg.Connection,
    rebuilder: Rebuilder,
    progress: Progress,
    live: str,
    group: str,
    *,
    switch: bool,
    accept_differences: bool,
) -> ReplayReport:
    rebuilt = rebuilder.schema
    async with conn.transaction():
        with telemetry.span("replay.verify"):
            await hold_projection(conn, OffsetStatements(live))  # the live projector waits from here
            targets = await group_offsets(conn, OffsetStatements(live), group)
            rebuilder.set_caps(targets)
            # On a connection of its own, committed before the rebuild applies: its lanes write the same
            # rows when they park a barrier. The lock held here keeps the live ones as they are.
            carrying = await asyncpg.connect(rebuilder.settings.postgres_dsn)
            try:
                await carry_verdicts_once(carrying, live, rebuilt)
            finally:
                await carrying.close()
            deadline = time.monotonic() + FINAL_CATCH_UP_S
            while rebuilder.lag() > 0:
                if time.monotonic() > deadline:
                    raise GraphledgerError(
                        f"the rebuild did not reach the live offsets within {FINAL_CATCH_UP_S:.0f}s while holding "
                        "the live projector; run the replay again (it resumes)"
                    )
                await rebuilder.step()
            await rebuilder.flush()
            progress.update("verifying", rebuilder.records, 0, rebuilder.positions, rebuilder.caps, final=True)
            reached = await group_offsets(conn, OffsetStatements(rebuilt), group)
            if _nonzero(reached) != _nonzero(targets):
                raise ReplayVerificationError(
                    f"offsets differ: live {sorted(targets.items())}, rebuilt {sorted(reached.items())}"
                )
            checks = await compare(conn, live, rebuilt)
            for check in checks:
                log.info("verify %s", check.describe())
            if not all(c.equal for c in checks) and accept_differences:
                log.warning("the rebuild of %r differs from it; switching as told (--accept-differences)", live)
            elif not all(c.equal for c in checks):
                raise ReplayVerificationError(
                    f"the rebuild of {live!r} differs from it at the same offsets, nothing switched (the rebuild "
                    f"stays in {rebuilt!r}; `replay run --restart` starts over): "
                    + "; ".join(c.describe() for c in checks if not c.equal)
                )
        retired = None
        if switch:
            with telemetry.span("replay.switch"):
                await shares.drop_shares(conn, rebuilt)
                retired = await schemas.switch(conn, live, datetime.now(UTC))
                await notify_applied(conn, live)
    return ReplayReport(live, rebuilt, retired, rebuilder.records, 0.0, targets, checks)
