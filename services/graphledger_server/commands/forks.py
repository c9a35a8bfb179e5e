"""`graphledger forks list`: the forks the projector found, newest first.

A fork is a checkpoint put whose parent was not its thread namespace's newest checkpoint when the
projector applied it (`graphledger_forks`): two processes writing one thread at once, or a branch a
user asked for (`source` `update`/`fork`, or a run started from an older checkpoint).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from graphledger.settings import Settings


def register(commands: Any) -> None:
    """Register `forks` and its subcommand on the `graphledger` parser."""
    forks = commands.add_parser(
        "forks",
        help="list the forks the projector found (two writers on one thread, or branches)",
        description="Checkpoint puts whose parent was not their thread namespace's newest checkpoint when "
        "applied. Reads GRAPHLEDGER_POSTGRES_DSN/_SCHEMA.",
    )
    sub = forks.add_subparsers(dest="forks_command", required=True, metavar="COMMAND")
    listing = sub.add_parser("list", help="newest first")
    listing.add_argument("--thread", help="only this thread (as stored: with its tenant prefix)")
    listing.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
    listing.add_argument("--json", action="store_true", help="one JSON document instead of a table")
    listing.set_defaults(run=_run_list)


def _run_list(args: argparse.Namespace, settings: Settings) -> int:
    rows = asyncio.run(_forks(settings, args.thread, args.limit))
    if args.json:
        print(json.dumps(rows, indent=2))
    elif not rows:
        print("forks: none")
    else:
        print(f"{'ID':>6}  {'RECORDED (UTC)':<19}  {'THREAD':<24}  {'SOURCE':<6}  CHECKPOINT <- PARENT (NEWEST WAS)")
        for r in rows:
            print(
                f"{r['id']:>6}  {r['recorded_at'][:19]:<19}  {r['thread_id'][:24]:<24}  {r['source'] or '?':<6}  "
                f"{r['checkpoint_id']} <- {r['parent_checkpoint_id']} ({r['newest_checkpoint_id']})"
            )
    return 0


async def _forks(settings: Settings, thread_id: str | None, limit: int) -> list[dict[str, Any]]:
    import asyncpg

    from graphledger_server.projection import forks

    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        return await forks.list_forks(conn, settings.postgres_schema, thread_id, limit)
    finally:
        await conn.close()
