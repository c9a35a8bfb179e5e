"""`graphledger replay run | list | drop-old`: argument parsing and printing.

The work is in `graphledger_server.replay`.

Import-light (argparse only at module level), so `graphledger --help` works without the server extra.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import TYPE_CHECKING, Any

from graphledger.settings import Settings

if TYPE_CHECKING:
    from graphledger_server.replay.shares import Share


def register(commands: Any) -> None:
    """Add the `replay` command and its subcommands to the CLI's subparsers."""
    replay = commands.add_parser(
        "replay",
        help="rebuild every projection from the log into a fresh schema, verify it, switch to it",
        description="Rebuild the projection schema (GRAPHLEDGER_POSTGRES_SCHEMA) from the topics' earliest "
        "offsets into <schema>_rebuild while the projector keeps running, verify it equals the live schema "
        "at the same offsets, and switch to it atomically. See docs/replay.md.",
    )
    sub = replay.add_subparsers(dest="replay_command", required=True, metavar="COMMAND")
    run = sub.add_parser("run", help="rebuild, verify and switch (resumes an unfinished rebuild)")
    run.add_argument(
        "--accept-loss",
        action="store_true",
        help="rebuild even though a source topic has finite retention or has lost its first offsets",
    )
    run.add_argument("--restart", action="store_true", help="drop an unfinished rebuild and start from offset 0")
    run.add_argument(
        "--no-switch", dest="switch", action="store_false", help="rebuild and verify, but keep the live schema"
    )
    run.add_argument(
        "--accept-differences",
        action="store_true",
        help="switch even when the rebuild differs from the live schema (after an upgrade that applies events "
        "otherwise, such as one that dates them by another clock)",
    )
    run.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="split the load by partition between N worker processes (default 1); worker 0 coordinates: it "
        "starts the others unless --worker-index is given, then indexes, verifies and switches",
    )
    run.add_argument(
        "--worker-index",
        type=int,
        metavar="I",
        help="run only worker I of N, as a pod of an Indexed Job does (0: the coordinator); needs --run-id",
    )
    run.add_argument(
        "--indexed-job",
        action="store_true",
        help="take --worker-index from JOB_COMPLETION_INDEX, which Kubernetes sets in each pod of an Indexed Job",
    )
    run.add_argument(
        "--run-id",
        metavar="ID",
        help="what the workers of one run share (the chart: the Job's name); a new run resets the shares' marks",
    )
    run.set_defaults(run=_run)
    sub.add_parser("list", help="the live schema, a rebuild in progress and old schemas").set_defaults(run=_list)
    drop = sub.add_parser("drop-old", help="drop old schemas a replay switched away from")
    drop.add_argument("schemas", nargs="*", help="which ones (default: every old schema of the live schema)")
    drop.set_defaults(run=_drop_old)


def _run(args: argparse.Namespace, settings: Settings) -> int:
    from graphledger_server import telemetry
    from graphledger_server.replay.run import run_replay
    from graphledger_server.replay.shares import Share

    share = Share(_worker_index(args), args.workers)
    telemetry.setup("graphledger-replay", settings)
    from graphledger_server.collector import collecting_fully, freeze_and_defer_full_collections

    freeze_and_defer_full_collections()  # as the projector's main
    if share.index > 0:
        return _run_worker(args, settings, share)
    replay = run_replay(
        settings,
        accept_loss=args.accept_loss,
        restart=args.restart,
        switch=args.switch,
        accept_differences=args.accept_differences,
        out=sys.stderr,
        workers=share.count,
        spawn=args.worker_index is None and not args.indexed_job,
        run=args.run_id,
    )
    report = asyncio.run(collecting_fully(replay))
    rate = report.events / report.seconds if report.seconds else 0.0
    print(f"replay: rebuilt {report.live!r} in {report.rebuilt!r}: {report.events:,} events in "
          f"{report.seconds:,.1f}s ({rate:,.0f} events/s)")  # fmt: skip
    for check in report.checks:
        print(f"  {check.describe()}")
    if report.retired:
        print(f"replay: switched; the previous projection is {report.retired!r} "
              f"(`graphledger replay drop-old {report.retired}` drops it)")  # fmt: skip
    else:
        print(f"replay: verified, not switched; the rebuild stays in {report.rebuilt!r}")
    return 0


def _worker_index(args: argparse.Namespace) -> int:
    from graphledger.errors import GraphledgerError

    if not args.indexed_job:
        return 0 if args.worker_index is None else int(args.worker_index)
    if args.worker_index is not None:
        raise GraphledgerError("--indexed-job takes the worker's index from JOB_COMPLETION_INDEX: drop --worker-index")
    index = os.environ.get("JOB_COMPLETION_INDEX", "")
    if not index.isdigit():
        raise GraphledgerError(
            f"--indexed-job needs JOB_COMPLETION_INDEX (Kubernetes sets it in an Indexed Job's pods), found {index!r}"
        )
    return int(index)


def _run_worker(args: argparse.Namespace, settings: Settings, share: Share) -> int:
    """Worker `share` (index above 0) of a split replay: its share of the load, nothing else."""
    import time

    from graphledger.errors import GraphledgerError
    from graphledger_server.collector import collecting_fully
    from graphledger_server.replay.workers import run_worker

    if args.run_id is None:
        raise GraphledgerError("--worker-index above 0 needs --run-id: the coordinator's run to join")
    started = time.monotonic()
    records = asyncio.run(collecting_fully(run_worker(settings, share, args.run_id)))
    print(f"replay worker {share.label}: applied {records:,} events of its share in {time.monotonic() - started:,.1f}s")
    return 0


async def _with_conn(settings: Settings, work: Any) -> Any:
    import asyncpg

    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        return await work(conn)
    finally:
        await conn.close()


def _list(args: argparse.Namespace, settings: Settings) -> int:
    from graphledger_server.replay.schemas import list_schemas

    found = asyncio.run(_with_conn(settings, lambda conn: list_schemas(conn, settings.postgres_schema)))
    for s in found:
        print(f"{s.name}\t{s.role}\t{s.bytes / 1e6:,.1f} MB\t{s.comment or ''}")
    if not found:
        print(f"replay: no schema {settings.postgres_schema!r} yet")
    return 0


def _drop_old(args: argparse.Namespace, settings: Settings) -> int:
    from graphledger_server.replay.schemas import drop_old

    names = args.schemas or None
    dropped = asyncio.run(_with_conn(settings, lambda conn: drop_old(conn, settings.postgres_schema, names)))
    print(f"replay: dropped {', '.join(dropped)}" if dropped else "replay: no old schema to drop")
    return 0
