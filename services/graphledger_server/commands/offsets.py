"""`graphledger offsets reset`: move a partition's stored projector offset, after the log lost records.

The projector stops a partition whose log no longer holds what the projection applied (see
`projector/log_guard.py`) rather than guess. This is the operator's answer: `--to earliest` applies
the partition's log as it now is from its beginning (the records the lost log held stay projected;
the new ones are applied on top), `--to N` starts at offset N. A running projector notices the new
offset within a second or two and resumes the partition. `--yes` is required: without it the command
only says what it would change.
"""

from __future__ import annotations

import argparse
import asyncio

from graphledger.settings import Settings


def parse_target(text: str) -> str | int:
    """`earliest` or a non-negative offset."""
    if text == "earliest":
        return text
    try:
        offset = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--to must be 'earliest' or an offset, not {text!r}") from None
    if offset < 0:
        raise argparse.ArgumentTypeError(f"--to must not be negative, got {offset}")
    return offset


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `offsets reset` to the `graphledger` command line."""
    offsets = commands.add_parser("offsets", help="inspect or move the projector's stored offsets")
    offset_commands = offsets.add_subparsers(dest="offsets_command", required=True, metavar="COMMAND")
    reset = offset_commands.add_parser(
        "reset",
        help="move a partition's stored offset (after the projector stopped it on a lost log)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    reset.add_argument("--topic", required=True, help="topic of the partition, e.g. graphledger.checkpoints")
    reset.add_argument("--partition", required=True, type=int, help="partition number")
    reset.add_argument("--to", required=True, type=parse_target, help="'earliest' or the next offset to apply")
    reset.add_argument("--group", help="projector consumer group (default: GRAPHLEDGER_PROJECTOR_GROUP_ID)")
    reset.add_argument("--yes", action="store_true", help="do it; without this flag, only show what would change")
    reset.set_defaults(run=_run)


def _run(args: argparse.Namespace, settings: Settings) -> int:
    # Service dependencies (asyncpg, aiokafka) are imported here: `graphledger --help` registers this
    # command and must work in a client-only install.
    from graphledger_server.log.reset import reset_offset

    done = asyncio.run(reset_offset(settings, args.topic, args.partition, args.to, group=args.group, apply=args.yes))
    before = "none" if done.before is None else str(done.before)
    where = f"{done.topic}:{done.partition} of group {done.group} in schema {settings.postgres_schema}"
    if not args.yes:
        print(f"offsets reset: would move {where} from {before} to {done.after}; pass --yes to do it")
        return 2
    print(f"offsets reset: moved {where} from {before} to {done.after}")
    return 0
