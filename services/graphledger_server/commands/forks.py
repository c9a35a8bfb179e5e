"""`graphledger forks list`: what the projector found writing a thread off its newest checkpoint, newest first.

Three kinds (docs/architecture.md, "One writer per thread"): `refused`, a put or writes of a superseded or
concurrent writer, which the one-writer rule did not apply (`graphledger_refusals`); `branch`, a counted put
whose parent was not the newest, asked for by its writer (time travel, `update_state` on an older
checkpoint); `fork`, a put made without an intent off the newest (a writer outside the rule: an older client,
`GRAPHLEDGER_WRITE_OWNERSHIP=record`, a direct put).
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
        help="list refused writes, branches and forks (writers off their thread's newest checkpoint)",
        description="Puts and writes the one-writer rule refused, and checkpoint puts whose parent was not "
        "their thread namespace's newest checkpoint when applied (branches asked for, forks by writers outside "
        "the rule). Reads GRAPHLEDGER_POSTGRES_DSN/_SCHEMA.",
    )
    sub = forks.add_subparsers(dest="forks_command", required=True, metavar="COMMAND")
    listing = sub.add_parser("list", help="newest first")
    listing.add_argument("--thread", help="only this thread (as stored: with its tenant prefix)")
    listing.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
    listing.add_argument("--json", action="store_true", help="one JSON document instead of a table")
    listing.set_defaults(run=_run_list)


def _run_list(args: argparse.Namespace, settings: Settings) -> int:
    refused, forks = asyncio.run(_forks(settings, args.thread, args.limit))
    if args.json:
        print(json.dumps({"refused": refused, "forks": forks}, indent=2))
        return 0
    if not refused and not forks:
        print("forks: none")
        return 0
    if refused:
        print(f"{'KIND':<8}  {'RECORDED (UTC)':<19}  {'THREAD':<24}  {'EVENT':<17}  CHECKPOINT: WHY")
        for r in refused:
            print(
                f"{'refused':<8}  {r['recorded_at'][:19]:<19}  {r['thread_id'][:24]:<24}  {r['event_type']:<17}  "
                f"{r['checkpoint_id']}: {r['reason']}"
            )
    if forks:
        print(f"{'KIND':<8}  {'RECORDED (UTC)':<19}  {'THREAD':<24}  {'SOURCE':<6}  CHECKPOINT <- PARENT (NEWEST WAS)")
        for r in forks:
            print(
                f"{r['kind']:<8}  {r['recorded_at'][:19]:<19}  {r['thread_id'][:24]:<24}  {r['source'] or '?':<6}  "
                f"{r['checkpoint_id']} <- {r['parent_checkpoint_id']} ({r['newest_checkpoint_id']})"
            )
    return 0


async def _forks(
    settings: Settings, thread_id: str | None, limit: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    import asyncpg

    from graphledger_server.projection import forks

    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        refused = await forks.list_refusals(conn, settings.postgres_schema, thread_id, limit)
        return refused, await forks.list_forks(conn, settings.postgres_schema, thread_id, limit)
    finally:
        await conn.close()
