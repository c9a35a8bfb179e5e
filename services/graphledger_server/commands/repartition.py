"""`graphledger repartition --to-prefix NEW --partitions N`: copy the log into topics of another partition
count (`graphledger_server.log_copy.run.repartition`; docs/operations.md, "Changing the partition count")."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from graphledger.settings import Settings


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "repartition",
        help="copy the log into new topics with another partition count (writers stopped)",
        description="Copy the checkpoint and store topics of GRAPHLEDGER_TOPIC_PREFIX into TO_PREFIX.checkpoints and "
        "TO_PREFIX.store with PARTITIONS partitions each, every event as it is, at the partition its key gives with "
        "the new count, each thread's and item's events in the order they were written. A source topic's partition "
        "count must never change in place: its threads would move. STOP EVERY WRITER FIRST (agents, the sweeper, "
        "imports, dlq replays): the copy goes up to the source's end as of its start. Run again after an "
        "interruption: it writes only what is missing. Then project the new topics and switch (docs/operations.md, "
        "'Changing the partition count').",
    )
    parser.add_argument("--to-prefix", required=True, help="prefix of the new topics (created when missing)")
    parser.add_argument("--partitions", required=True, type=int, help="partitions of each new topic")
    parser.add_argument(
        "--accept-loss",
        action="store_true",
        help="copy even though a source topic has finite retention or has lost its first offsets",
    )
    parser.set_defaults(run=_run)


def _run(args: argparse.Namespace, settings: Settings) -> int:
    from graphledger_server.log_copy.run import repartition

    reports = asyncio.run(repartition(settings, args.to_prefix, args.partitions, accept_loss=args.accept_loss))
    for report in reports:
        for line in report.describe():
            print(f"repartition: {line}")
    print(
        f"repartition: done. Project the topics of {args.to_prefix!r} into a fresh schema, then point "
        "GRAPHLEDGER_TOPIC_PREFIX at them (docs/operations.md)"
    )
    return 0
