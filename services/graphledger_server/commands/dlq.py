"""`graphledger dlq list|show|replay`: inspect dead letters and re-publish them after a fix
(`graphledger_server.dlq`; docs/operations.md)."""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, assert_never

from graphledger.errors import DeadLetterError
from graphledger.settings import Settings

if TYPE_CHECKING:
    from graphledger_server.dlq.decided import Replayed

REASON_COLUMN_CHARS = 90


def register(commands: Any) -> None:
    """Register `dlq` and its subcommands on the `graphledger` parser."""
    dlq = commands.add_parser(
        "dlq",
        help="inspect dead-lettered events and re-publish them after a fix",
        description="Dead letters are events the projector could not apply (undecodable, invalid, or "
        "rejected by Postgres). List them, show one, and replay it to its source partition, as it was or "
        "with a fixed payload. Reads GRAPHLEDGER_POSTGRES_DSN/_SCHEMA and the Kafka settings.",
    )
    sub = dlq.add_subparsers(dest="dlq_command", required=True, metavar="COMMAND")
    listing = sub.add_parser("list", help="dead letters not replayed yet (reason, source position, type, time)")
    listing.add_argument("--all", action="store_true", help="include the ones already replayed")
    listing.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
    listing.add_argument("--json", action="store_true", help="one JSON document instead of a table")
    listing.set_defaults(run=_run_list)
    show = sub.add_parser("show", help="one dead letter in full, its payload decoded where possible")
    show.add_argument("id", type=int)
    show.add_argument(
        "--payload", action="store_true", help="print only the payload, in the form --payload-file reads back"
    )
    show.set_defaults(run=_run_show)
    replay = sub.add_parser(
        "replay",
        help="re-publish dead letters to their source partition, once each",
        description="Re-publish each dead letter to its source partition, once. A checkpoint event is decided "
        "where it lands: the command waits up to GRAPHLEDGER_CONSISTENCY_TIMEOUT_S for the projector and says "
        "whether the one-writer rule refused it there (exit 0 either way; 1 when an ID was not published).",
    )
    replay.add_argument("ids", type=int, nargs="+", metavar="ID")
    replay.add_argument(
        "--payload-file",
        type=Path,
        help="publish this payload (JSON, as `show --payload` prints it) instead of the original, keeping the "
        "event's type, id and time; one ID only",
    )
    replay.add_argument(
        "--event-type", help="the event type of --payload-file, when the dead letter's own cannot be read"
    )
    replay.set_defaults(run=_run_replay)


def _run_list(args: argparse.Namespace, settings: Settings) -> int:
    from graphledger_server.dlq.show import summaries

    found = asyncio.run(summaries(settings, include_replayed=args.all, limit=args.limit))
    if args.json:
        print(json.dumps(found, indent=2))
        return 0
    if not found:
        print("dlq: no dead letters" + ("" if args.all else " waiting for a replay"))
        return 0
    print(f"{'ID':>6}  {'RECORDED (UTC)':<19}  {'SOURCE':<34}  {'TYPE':<17}  REASON")
    for s in found:
        reason = s["reason"]
        if len(reason) > REASON_COLUMN_CHARS:
            reason = reason[: REASON_COLUMN_CHARS - 1] + "…"
        if s["replayed_at"]:
            reason = f"[replayed to {s['replayed_to']}] {reason}"
        print(f"{s['id']:>6}  {s['recorded_at'][:19]:<19}  {s['source']:<34}  {s['event_type'] or '?':<17}  {reason}")
    return 0


def _run_show(args: argparse.Namespace, settings: Settings) -> int:
    from graphledger_server.dlq.show import show

    shown = asyncio.run(show(settings, args.id))
    if args.payload:
        if shown.get("payload") is None:
            raise DeadLetterError(f"dead letter {args.id} has no decodable payload: {shown.get('decode_error')}")
        print(json.dumps(shown["payload"], indent=2, ensure_ascii=False))
    else:
        print(json.dumps(shown, indent=2, ensure_ascii=False))
    return 0


def _run_replay(args: argparse.Namespace, settings: Settings) -> int:
    from graphledger_server.dlq.editable import from_editable
    from graphledger_server.dlq.republish import replay

    if args.payload_file is not None and len(args.ids) != 1:
        print("graphledger dlq replay: --payload-file replaces one dead letter's payload: give one ID", file=sys.stderr)
        return 2
    payload = None
    if args.payload_file is not None:
        try:
            payload = from_editable(json.loads(args.payload_file.read_text(encoding="utf-8")))
        except (OSError, ValueError) as exc:
            raise DeadLetterError(f"cannot read --payload-file {args.payload_file}: {exc}") from None
        if not isinstance(payload, dict):
            raise DeadLetterError(f"--payload-file {args.payload_file} holds a {type(payload).__name__}, not a map")
    results = asyncio.run(replay(settings, args.ids, payload=payload, event_type=args.event_type))
    failed = 0
    for _, outcome in results:
        if isinstance(outcome, DeadLetterError):
            failed += 1
            print(f"graphledger dlq replay: {outcome}", file=sys.stderr)
        else:
            print(_replayed_line(outcome))
    return 1 if failed else 0


def _replayed_line(replayed: Replayed) -> str:
    """Where a dead letter went and, for a checkpoint event, what the projector decided there. A refused or
    not yet applied replay still exits 0: it was published, and replaying it again would publish nothing."""
    from graphledger_server.dlq.decided import Applied, DeadLetteredAgain, NotApplied, NotAwaited, Parked, RefusedByRule

    published = replayed.published
    line = f"dlq: replayed {published.dead_letter_id} to {published.replayed_to}"
    match replayed.decision:
        case Applied() | NotAwaited():
            return line
        case RefusedByRule(reason=reason):
            return f"{line}; the one-writer rule refused it: {reason}"
        case DeadLetteredAgain(dead_letter_id=again, reason=reason):
            return f"{line}; dead-lettered again as {again}: {reason}"
        case Parked():
            return f"{line}; a parked subject holds it: see graphledger parked list"
        case NotApplied(timeout_s=timeout_s):
            thread = f" --thread {shlex.quote(published.thread_id)}" if published.thread_id is not None else ""
            return f"{line}; not applied within {timeout_s:g}s: see graphledger forks list{thread}"
        case _:
            assert_never(replayed.decision)
