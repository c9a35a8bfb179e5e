"""`graphledger keys new-kek|rotate`: the key-encryption keys that wrap the key store's keys.

Rotation without downtime: `new-kek` prints a fresh entry; put it first in GRAPHLEDGER_KEY_ENCRYPTION_KEYS
(the old one after it) on every service; `rotate` rewraps every key with it; then drop the old entry.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from graphledger.settings import Settings


def register(commands: Any) -> None:
    keys = commands.add_parser("keys", help="key-encryption keys: make one, rewrap the key store with the first")
    sub = keys.add_subparsers(dest="keys_command", required=True, metavar="COMMAND")
    new = sub.add_parser("new-kek", help="print a fresh `id:base64` entry for GRAPHLEDGER_KEY_ENCRYPTION_KEYS")
    new.add_argument("--id", default=None, help="the key's id (default: kek-<unix time>)")
    new.set_defaults(run=_new_kek)
    rotate = sub.add_parser("rotate", help="rewrap every key not wrapped by the first key-encryption key (idempotent)")
    rotate.set_defaults(run=_rotate)


def _new_kek(args: argparse.Namespace, settings: Settings) -> int:
    from graphledger_server.keys.ring import new_key_entry

    print(new_key_entry(args.id or f"kek-{int(time.time())}"))
    return 0


def _rotate(args: argparse.Namespace, settings: Settings) -> int:
    count = asyncio.run(rotate(settings))
    print(f"keys rotate: rewrapped {count} keys")
    return 0


async def rotate(settings: Settings) -> int:
    import asyncpg

    from graphledger_server.keys.key_store import KeyStore
    from graphledger_server.keys.ring import KeyRing

    pool = await asyncpg.create_pool(settings.postgres_dsn, min_size=0, max_size=1)
    try:
        return await KeyStore(pool, settings.key_store_schema, KeyRing.from_settings(settings)).rotate()
    finally:
        await pool.close()
