"""`graphledger parked list|release|drop`: the subjects parked at a record no projector version can apply
(`graphledger_server.projector.release`; docs/operations.md, "Parked subjects")."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from graphledger.settings import Settings

REASON_COLUMN_CHARS = 90


def register(commands: Any) -> None:
    """Register `parked` and its subcommands on the `graphledger` parser."""
    parked = commands.add_parser(
        "parked",
        help="list, release or drop the subjects parked at a record no projector version can apply",
        description="A record the projector cannot apply (a version it does not read, a copy barrier beyond "
        "its log) parks its subject, a thread's or a store item's records on one partition: they wait while "
        "the partition moves on. Release them after an upgrade, or drop the record that parked them. A subject "
        "is named topic:partition@offset, its first record's position. Reads GRAPHLEDGER_POSTGRES_DSN/_SCHEMA, "
        "the Kafka settings and the key store's.",
    )
    sub = parked.add_subparsers(dest="parked_command", required=True, metavar="COMMAND")
    listing = sub.add_parser("list", help="parked subjects, oldest first (cause, reason, records held)")
    listing.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
    listing.add_argument("--json", action="store_true", help="one JSON document instead of a table")
    listing.set_defaults(run=_run_list)
    release = sub.add_parser(
        "release", help="apply a subject's records in order with this version (after an upgrade, or a fix)"
    )
    release.add_argument("subjects", nargs="+", metavar="SUBJECT", help="topic:partition@offset, as `list` names it")
    release.set_defaults(run=_run_release, drop=False)
    drop = sub.add_parser(
        "drop", help="dead-letter the record that parked a subject, then apply the subject's other records"
    )
    drop.add_argument("subjects", nargs="+", metavar="SUBJECT", help="topic:partition@offset, as `list` names it")
    drop.set_defaults(run=_run_release, drop=True)


def _run_list(args: argparse.Namespace, settings: Settings) -> int:
    from graphledger_server.projector.release import parked_subjects

    found = asyncio.run(parked_subjects(settings, args.limit))
    if args.json:
        print(json.dumps(found, indent=2))
        return 0
    if not found:
        print("parked: no subjects parked")
        return 0
    print(f"{'SUBJECT':<34}  {'SINCE (UTC)':<19}  {'CAUSE':<13}  {'RECORDS':>7}  REASON")
    for s in found:
        reason = s["reason"]
        if len(reason) > REASON_COLUMN_CHARS:
            reason = reason[: REASON_COLUMN_CHARS - 1] + "…"
        since = (s["parked_at"] or "?")[:19]
        print(f"{s['subject']:<34}  {since:<19}  {s['cause']:<13}  {s['records']:>7}  {reason}")
    return 0


def _run_release(args: argparse.Namespace, settings: Settings) -> int:
    from graphledger_server.projector.release import release

    verb = "drop" if args.drop else "release"
    failed = 0
    for outcome in asyncio.run(release(settings, args.subjects, drop=args.drop)):
        if outcome.released is None:
            failed += 1
            print(f"graphledger parked {verb}: {outcome.error}", file=sys.stderr)
            continue
        result = outcome.released.result
        done = f"{outcome.released.records} records: {result.applied} applied, {result.dead_letters} dead-lettered"
        if result.parked:
            failed += 1
            again = ", ".join(f"{s.name} ({s.cause}: {s.reason})" for s in result.parked)
            print(f"parked: {verb} {outcome.name}: {done}; parked again at {again}", file=sys.stderr)
        else:
            print(f"parked: {verb} {outcome.name}: {done}")
    return 1 if failed else 0
