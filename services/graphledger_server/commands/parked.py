"""`graphledger parked list|release|skip`: the subjects the projector parked (`projection/parked.py`).

A record no projector version can apply (an event from a newer graphledger, a copy barrier that can
never be met) parks its subject, the records of its partition with its record key, while the other
subjects go on. `release` runs the subject again (after an upgrade, an upgraded projector applies it;
otherwise it parks again); `skip` dead-letters the record that parked it and runs the rest. The
projector that owns the partition carries either out within a second (docs/operations.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
from typing import Any

from graphledger.errors import GraphledgerError
from graphledger.settings import Settings

REASON_COLUMN_CHARS = 80
SUBJECT = re.compile(r"^(?P<topic>.+):(?P<partition>\d+)@(?P<offset>\d+)$")


def register(commands: Any) -> None:
    """Register `parked` and its subcommands on the `graphledger` parser."""
    parked = commands.add_parser(
        "parked",
        help="list the subjects the projector parked, and release or skip them",
        description="Subjects the projector set aside at a record no projector version can apply, while the "
        "rest of their partition goes on. Reads GRAPHLEDGER_POSTGRES_DSN/_SCHEMA.",
    )
    sub = parked.add_subparsers(dest="parked_command", required=True, metavar="COMMAND")
    listing = sub.add_parser("list", help="oldest first: subject, cause, records waiting, reason")
    listing.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
    listing.add_argument("--json", action="store_true", help="one JSON document instead of a table")
    listing.set_defaults(run=_run_list)
    for action, text in (
        ("release", "run a subject again (after upgrading the projectors, for newer_version)"),
        ("skip", "dead-letter the record that parked a subject and run its other records"),
    ):
        command = sub.add_parser(action, help=text)
        command.add_argument("subject", metavar="TOPIC:PARTITION@OFFSET", help="as `parked list` names it")
        command.set_defaults(run=_run_request, action=action)


def _run_list(args: argparse.Namespace, settings: Settings) -> int:
    rows = asyncio.run(_list(settings, args.limit))
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("parked: no subjects parked")
        return 0
    print(f"{'SUBJECT':<40}  {'CAUSE':<13}  {'RECORDS':>7}  {'TYPE':<19}  REASON")
    for r in rows:
        reason = r["reason"]
        if len(reason) > REASON_COLUMN_CHARS:
            reason = reason[: REASON_COLUMN_CHARS - 1] + "…"
        if r["action"]:
            reason = f"[{r['action']} asked] {reason}"
        print(f"{r['subject']:<40}  {r['cause']:<13}  {r['records']:>7}  {r['event_type'] or '?':<19}  {reason}")
    return 0


def _run_request(args: argparse.Namespace, settings: Settings) -> int:
    match = SUBJECT.match(args.subject)
    if match is None:
        raise GraphledgerError(f"{args.subject!r} is not TOPIC:PARTITION@OFFSET as `graphledger parked list` names it")
    topic, partition, offset = match["topic"], int(match["partition"]), int(match["offset"])
    cause = asyncio.run(_request(settings, topic, partition, offset, args.action))
    if cause is None:
        raise GraphledgerError(f"no subject is parked at {args.subject} (`graphledger parked list` shows them)")
    print(f"parked: {args.action} of {args.subject} ({cause}) asked; the projector owning the partition carries it out")
    return 0


async def _list(settings: Settings, limit: int) -> list[dict[str, Any]]:
    import asyncpg

    from graphledger_server.projection import parked

    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        return await parked.list_parked(conn, settings.postgres_schema, limit)
    finally:
        await conn.close()


async def _request(settings: Settings, topic: str, partition: int, offset: int, action: str) -> str | None:
    import asyncpg

    from graphledger_server.projection import parked

    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        return await parked.request(conn, settings.postgres_schema, topic, partition, offset, action)
    finally:
        await conn.close()
