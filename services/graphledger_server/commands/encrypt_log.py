"""`graphledger encrypt-log --to-prefix NEW`: copy a log written in the clear into sealed topics
(`graphledger_server.log_copy`; docs/operations.md)."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from graphledger.settings import Settings


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "encrypt-log",
        help="copy a log written in the clear into new topics, every event sealed (writers stopped)",
        description="Copy the checkpoint and store topics of GRAPHLEDGER_TOPIC_PREFIX into TO_PREFIX.checkpoints "
        "and TO_PREFIX.store, every event sealed with its subject's data key from the key store and keyed by its "
        "keyed hash, as clients with GRAPHLEDGER_ENCRYPT_EVENTS on write them; events already sealed are copied as "
        "they are. STOP EVERY WRITER FIRST (agents, the sweeper, imports, dlq replays): the copy goes up to the "
        "source's end as of its start, and writes made meanwhile are not in it. Run again after an interruption: it "
        "writes only what is missing. Then switch to the new topics (docs/operations.md, 'Turning encryption on "
        "for an existing log').",
    )
    parser.add_argument("--to-prefix", required=True, help="prefix of the new topics (created when missing)")
    parser.add_argument(
        "--tenant",
        action="append",
        default=[],
        metavar="NAME",
        help="a tenant whose stored names carry its prefix, besides those of GRAPHLEDGER_API_TOKEN_HASHES "
        "(repeatable; e.g. a tenant whose token was revoked)",
    )
    parser.add_argument(
        "--accept-loss",
        action="store_true",
        help="copy even though a source topic has finite retention or has lost its first offsets",
    )
    parser.set_defaults(run=_run)


def _run(args: argparse.Namespace, settings: Settings) -> int:
    from graphledger_server.log_copy.run import encrypt_log

    reports = asyncio.run(
        encrypt_log(settings, args.to_prefix, extra_tenants=args.tenant, accept_loss=args.accept_loss)
    )
    for report in reports:
        for line in report.describe():
            print(f"encrypt-log: {line}")
    print(
        f"encrypt-log: done. Point GRAPHLEDGER_TOPIC_PREFIX at {args.to_prefix!r} with GRAPHLEDGER_ENCRYPT_EVENTS on, "
        "project the new topics into a fresh schema, then switch (docs/operations.md)"
    )
    return 0
