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
from dataclasses import dataclass

from graphledger.errors import OffsetResetError
from graphledger.settings import Settings

# Service dependencies (asyncpg) are imported where used: `graphledger --help` registers this
# command and must work in a client-only install.


@dataclass(frozen=True)
class Reset:
    group: str
    topic: str
    partition: int
    before: int | None
    after: int


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


async def earliest_offset(settings: Settings, topic: str, partition: int) -> int:
    """The first offset the broker still holds for the partition (ListOffsets earliest)."""
    from aiokafka import TopicPartition

    from graphledger_server.log.clients import new_consumer

    consumer = new_consumer(settings)
    await consumer.start()
    try:
        tp = TopicPartition(topic, partition)
        return (await consumer.beginning_offsets([tp]))[tp]
    finally:
        await consumer.stop()


async def reset_offset(
    settings: Settings, topic: str, partition: int, to: str | int, *, group: str | None = None, apply: bool
) -> Reset:
    """Set the stored next offset of `group`'s `topic`:`partition` (only when `apply`); returns what
    it was and what it is (or would be)."""
    import asyncpg

    from graphledger_server.log.offsets import (
        OffsetStatements,
        lock_partition_offset,
        notify_applied,
        set_offset,
    )
    from graphledger_server.log.topics import source_topics

    group = group or settings.projector_group_id
    if topic not in source_topics(settings):
        raise OffsetResetError(f"topic {topic} is not one the projector consumes: {', '.join(source_topics(settings))}")
    target = await earliest_offset(settings, topic, partition) if to == "earliest" else int(to)
    sql = OffsetStatements(settings.postgres_schema)
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        async with conn.transaction():
            before = await lock_partition_offset(conn, sql, group, (topic, partition))
            if apply:
                await set_offset(conn, sql, group, (topic, partition), target)
                await notify_applied(conn, settings.postgres_schema)  # the read API re-reads the offsets
    finally:
        await conn.close()
    return Reset(group, topic, partition, before, target)


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
    done = asyncio.run(reset_offset(settings, args.topic, args.partition, args.to, group=args.group, apply=args.yes))
    before = "none" if done.before is None else str(done.before)
    where = f"{done.topic}:{done.partition} of group {done.group} in schema {settings.postgres_schema}"
    if not args.yes:
        print(f"offsets reset: would move {where} from {before} to {done.after}; pass --yes to do it")
        return 2
    print(f"offsets reset: moved {where} from {before} to {done.after}")
    return 0
