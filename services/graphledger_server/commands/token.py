"""`graphledger token new|hash TENANT [--erase]`: tokens and their `GRAPHLEDGER_API_TOKEN_HASHES` entries.

`new` makes a random token and prints it with its entry; `hash` reads a token from stdin, never from
the command line, so it stays out of shell history and process listings, and prints only its entry.
Without `--erase` the entry is an agent's token (reads and data keys); with it, an operator's, which
may also erase its tenant's subjects (docs/security.md, "Auth").
"""

from __future__ import annotations

import argparse
import secrets
import sys
from typing import Any

from graphledger.settings import Settings
from graphledger.tenancy import check_tenant_name

TOKEN_BYTES = 32


def register(commands: Any) -> None:
    """Add `token new` and `token hash` to the `graphledger` command's subparsers."""
    token = commands.add_parser("token", help="make read API tokens and their GRAPHLEDGER_API_TOKEN_HASHES entries")
    token_commands = token.add_subparsers(dest="token_command", required=True, metavar="COMMAND")
    new_cmd = token_commands.add_parser(
        "new",
        help="print a new random token and its `tenant:sha256hex[:erase]` entry",
        description="Print a new random token (line 1: give it to the agent or operator as GRAPHLEDGER_API_TOKEN) "
        "and its GRAPHLEDGER_API_TOKEN_HASHES entry for TENANT (line 2: join entries with commas).",
    )
    hash_cmd = token_commands.add_parser(
        "hash",
        help="print the `tenant:sha256hex[:erase]` entry of the token on stdin",
        description="Read one token from stdin and print its GRAPHLEDGER_API_TOKEN_HASHES entry for TENANT; "
        "join entries with commas.",
    )
    for cmd, run in ((new_cmd, _new), (hash_cmd, _hash)):
        cmd.add_argument("tenant", help="tenant name: 1-64 of A-Z a-z 0-9 _ -")
        cmd.add_argument(
            "--erase",
            action="store_true",
            help="an operator's token: it may also erase the tenant's subjects (POST /v1/erase)",
        )
        cmd.set_defaults(run=run)


def _new(args: argparse.Namespace, settings: Settings) -> int:
    return _print_entry(args, secrets.token_urlsafe(TOKEN_BYTES), show_token=True)


def _hash(args: argparse.Namespace, settings: Settings) -> int:
    token = sys.stdin.readline().rstrip("\r\n")
    if not token:
        print("graphledger: no token on stdin (pipe one line in)", file=sys.stderr)
        return 2
    return _print_entry(args, token, show_token=False)


def _print_entry(args: argparse.Namespace, token: str, *, show_token: bool) -> int:
    from graphledger_server.api.credentials import Permission, token_entry

    try:
        check_tenant_name(args.tenant)
    except ValueError as exc:
        print(f"graphledger: {exc}", file=sys.stderr)
        return 2
    entry = token_entry(args.tenant, token, frozenset({Permission.ERASE}) if args.erase else frozenset())
    if show_token:
        print(token)
    print(entry)
    return 0
