"""`graphledger erase thread|namespace|tenant`: erase a subject for good (docs/security.md).

The operator's side of `KafkaSaver.erase_thread`, `KafkaStore.erase_namespace` and `erase_tenant`,
for any tenant: names are given as the tenant's clients give them, with `--tenant` naming the tenant
(none: the unnamed tenant of a deployment without tokens). Reads GRAPHLEDGER_* settings: the key
store, the projection (for a thread's copies) and Kafka.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import socket
from typing import Any

from graphledger.settings import Settings
from graphledger.tenancy import check_tenant_name, scoped_namespace, scoped_thread


def register(commands: Any) -> None:
    erase = commands.add_parser(
        "erase",
        help="erase a thread, a store namespace or a tenant for good (their keys destroyed)",
        description="Destroy the subject's data key (no copy of its events in the log can be read again), "
        "publish its erasure so every projection drops its rows, and record who asked in the key store's audit "
        "table. An erased thread id or namespace cannot be written again.",
    )
    sub = erase.add_subparsers(dest="erase_command", required=True, metavar="WHAT")
    thread = sub.add_parser("thread", help="a thread, and every thread copied from it")
    thread.add_argument("thread_id")
    namespace = sub.add_parser("namespace", help="a store namespace subject: its first labels, and all below")
    namespace.add_argument("labels", nargs="+", metavar="LABEL")
    for parser in (thread, namespace):
        parser.add_argument("--tenant", default="", help="the tenant the name is in (default: none)")
    tenant = sub.add_parser("tenant", help="everything of a tenant, threads and store items")
    tenant.add_argument("tenant")
    for parser in (thread, namespace, tenant):
        parser.add_argument("--by", default=None, help="who asks, for the audit table (default: user@host)")
        parser.add_argument("--json", action="store_true", help="print the erased subjects as JSON")
        parser.set_defaults(run=_run)


def _run(args: argparse.Namespace, settings: Settings) -> int:
    tenant = args.tenant
    if tenant:
        check_tenant_name(tenant)
    by = args.by or f"graphledger erase, {getpass.getuser()}@{socket.gethostname()}"
    report = asyncio.run(erase(settings, args.erase_command, tenant, getattr(args, "thread_id", None),
                               tuple(getattr(args, "labels", None) or ()), by))  # fmt: skip
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for subject in report["erased"]:
            print(f"erased {subject['kind']} {subject['ref']}")
    return 0


async def erase(
    settings: Settings, what: str, tenant: str, thread_id: str | None, labels: tuple[str, ...], by: str
) -> dict[str, Any]:
    import asyncpg

    from graphledger_server.keys.erase import Eraser
    from graphledger_server.keys.key_store import KeyStore
    from graphledger_server.keys.ring import KeyRing
    from graphledger_server.keys.source import StoreKeySource
    from graphledger_server.log.applied import AppliedOffsets

    pool = await asyncpg.create_pool(settings.postgres_dsn, min_size=0, max_size=2)
    applied = AppliedOffsets(settings.postgres_dsn, settings.postgres_schema, settings.projector_group_id)
    await applied.start()
    store = KeyStore(pool, settings.key_store_schema, KeyRing.from_settings(settings))
    eraser = Eraser(settings, StoreKeySource(store, settings), pool, applied)
    try:
        if what == "thread":
            assert thread_id is not None
            report = await eraser.erase_thread(tenant, scoped_thread(tenant, thread_id), by)
        elif what == "namespace":
            report = await eraser.erase_namespace(tenant, scoped_namespace(tenant, labels), by)
        else:
            report = await eraser.erase_tenant(tenant, by)
    finally:
        await eraser.close()
        await applied.stop()
        await pool.close()
    return {
        "erased": [{"kind": kind, "ref": ref} for kind, ref in report.erased],
        "positions": [list(p) for p in report.positions],
    }
