"""`graphledger import`: move an existing langgraph-checkpoint-postgres database into the log.

Only the command line lives here (importable without the server extra); the work is in
`graphledger_server.importer`.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from graphledger.settings import Settings


def register(commands: Any) -> None:
    """Register `import` on the `graphledger` parser."""
    parser = commands.add_parser(
        "import",
        help="publish an existing PostgresSaver/PostgresStore database as events",
        description="Read the checkpoints, blobs, writes, store items and vectors of a "
        "langgraph-checkpoint-postgres database and publish them to graphledger's topics (parents before "
        "children, store items with their original times and vectors). Progress is kept in the target "
        "projection (graphledger_imports): an interrupted import resumes, a finished one does nothing again.",
    )
    parser.add_argument("--from-postgres", required=True, metavar="DSN", help="the source database")
    parser.add_argument("--from-schema", default="public", help="the source's schema (default public)")
    parser.add_argument("--name", help="the import's name in the progress table (default: the source's address)")
    parser.add_argument("--restart", action="store_true", help="forget recorded progress and publish everything")
    parser.add_argument("--thread-chunk", type=int, default=64, help="threads read and published at once")
    parser.add_argument("--item-chunk", type=int, default=256, help="store items read and published at once")
    parser.set_defaults(run=_run)


def _run(args: argparse.Namespace, settings: Settings) -> int:
    from graphledger_server.importer.run import import_postgres

    report = asyncio.run(
        import_postgres(
            settings,
            args.from_postgres,
            source_schema=args.from_schema,
            name=args.name,
            restart=args.restart,
            thread_chunk=args.thread_chunk,
            item_chunk=args.item_chunk,
        )
    )
    if report.finished_before:
        print(f"import: {report.source} was imported completely before; --restart publishes it again")
    else:
        print(
            f"import: published {report.events} events ({report.threads} threads, {report.items} store items) "
            f"from {report.source}; the projector applies them"
        )
    return 0
