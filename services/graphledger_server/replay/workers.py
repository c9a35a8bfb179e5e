"""The load of a replay split by partition (`replay run --workers N`, `replay/shares.py`): each worker's share,
the local run's worker processes, and the coordinator's wait for them.

A local run starts workers 1 to N-1 as child processes of its own (`graphledger replay run --workers N
--worker-index i`, the settings passed as `GRAPHLEDGER_*` variables) and loads share 0 itself; the chart's
Indexed Job starts one pod per index instead. Either way a worker waits for the coordinator to open its run,
loads its share, marks it done and exits; the coordinator goes on once every share is done, and a local run
stops every worker and fails when one fails (run again: every share resumes where it stored its offsets).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import time
from typing import TextIO

import asyncpg

from graphledger.errors import GraphledgerError
from graphledger.settings import Settings
from graphledger.telemetry import names
from graphledger_server.replay import schemas, shares
from graphledger_server.replay.catch_up import catch_up
from graphledger_server.replay.progress import Progress
from graphledger_server.replay.rebuild import Rebuilder
from graphledger_server.replay.shares import Share, Stall
from graphledger_server.telemetry import replay as telemetry

log = logging.getLogger(__name__)

OPEN_WAIT_S = 600.0
"""How long a worker waits for its coordinator to open the run before it fails (Kubernetes starts it again)."""
POLL_S = 0.5
"""How often a worker looks for its run, and the coordinator for the shares done."""
STOP_WAIT_S = 10.0


async def load_share(
    settings: Settings, conn: asyncpg.Connection, share: Share, out: TextIO | None, stop: asyncio.Event | None
) -> int:
    """Apply `share`'s partitions into the rebuild until within one batch of the live projector, or until they
    wait on another share; returns the records applied."""
    live, group = settings.postgres_schema, settings.projector_group_id
    rebuilder = Rebuilder(settings, schemas.rebuild_name(live), share)
    progress = Progress(out, worker=share.label)
    await rebuilder.start()
    try:
        with telemetry.span("replay.load_share", **{names.GRAPHLEDGER_REPLAY_WORKER: share.label}):
            await catch_up(conn, rebuilder, progress, live, group, stop, Stall())
            await rebuilder.flush()
    finally:
        await rebuilder.close()
    progress.update("share loaded", rebuilder.records, rebuilder.lag(), rebuilder.positions, rebuilder.caps, final=True)
    return rebuilder.records


async def run_worker(
    settings: Settings, share: Share, run: str, out: TextIO | None = sys.stderr, stop: asyncio.Event | None = None
) -> int:
    """A worker beyond the coordinator: wait for `run` to be opened, load `share`, mark it done; returns the
    records applied (0 when this run had it done already)."""
    rebuilt = schemas.rebuild_name(settings.postgres_schema)
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        deadline = time.monotonic() + OPEN_WAIT_S
        while (done := await shares.opened(conn, rebuilt, share, run)) is None:
            if time.monotonic() > deadline:
                raise GraphledgerError(
                    f"the coordinator (--worker-index 0) of replay run {run!r} did not open {rebuilt!r} within "
                    f"{OPEN_WAIT_S:.0f}s; start it with the same --workers and --run-id"
                )
            if stop is not None and stop.is_set():
                raise GraphledgerError("replay worker interrupted before its share began")
            await asyncio.sleep(POLL_S)  # the coordinator's preparation: a poll interval, not a synchronisation
        if done:
            log.info("share %s of replay run %s was done already", share.label, run)
            return 0
        records = await load_share(settings, conn, share, out, stop)
        await shares.mark_done(conn, rebuilt, share, records)
        return records
    finally:
        await conn.close()


class LocalWorkers:
    """Workers 1 to N-1 of a local run, as child processes of this one."""

    def __init__(self, settings: Settings, count: int, run: str) -> None:
        self._settings = settings
        self._count = count
        self._run = run
        self._children: dict[int, asyncio.subprocess.Process] = {}

    async def start(self) -> None:
        from graphledger_server.devstack.stack import settings_to_env

        env = {**os.environ, **settings_to_env(self._settings)}
        for index in range(1, self._count):
            self._children[index] = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "graphledger_server", "replay", "run", "--workers", str(self._count),
                "--worker-index", str(index), "--run-id", self._run, env=env,
            )  # fmt: skip

    def failed(self, pending: list[int]) -> str | None:
        """Which worker exited unsuccessfully, or without marking its share done; None while none has."""
        for index, child in sorted(self._children.items()):
            if child.returncode not in (None, 0) or (child.returncode == 0 and index in pending):
                return f"replay worker {index}/{self._count} (pid {child.pid}) exited with status {child.returncode}"
        return None

    async def stop(self) -> None:
        """Stop the children still running (a failed run), and reap every one."""
        for child in self._children.values():
            if child.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    child.terminate()
        for child in self._children.values():
            try:
                await asyncio.wait_for(child.wait(), STOP_WAIT_S)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    child.kill()
                await child.wait()


async def await_shares(
    conn: asyncpg.Connection, rebuilt: str, local: LocalWorkers | None, out: TextIO | None,
    stop: asyncio.Event | None,
) -> None:  # fmt: skip
    """Until every other share is marked done; a local worker that fails fails the run."""
    printed = 0.0
    while waiting := await shares.pending(conn, rebuilt):
        if local is not None and (failure := local.failed(waiting)) is not None:
            raise GraphledgerError(f"{failure}; run the replay again to resume every share")
        if stop is not None and stop.is_set():
            raise GraphledgerError("replay interrupted; run it again to resume the rebuild")
        now = time.monotonic()
        if out is not None and now - printed >= 10.0:
            print(f"replay: waiting for workers {', '.join(map(str, waiting))} to load their shares",
                  file=out, flush=True)  # fmt: skip
            printed = now
        # A poll interval: the table says what is done, and a local child's exit status is set when it exits.
        await asyncio.sleep(POLL_S)
