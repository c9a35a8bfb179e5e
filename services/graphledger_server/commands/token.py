"""`graphledger token hash TENANT`: the `GRAPHLEDGER_API_TOKEN_HASHES` entry of a token read from stdin.

The token is read from stdin, never from the command line, so it stays out of shell history and
process listings; only its hash is printed.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from graphledger.settings import Settings
from graphledger.tenancy import check_tenant_name, hash_token


def register(commands: Any) -> None:
    """Add `token hash` to the `graphledger` command's subparsers."""
    token = commands.add_parser("token", help="make API token entries for GRAPHLEDGER_API_TOKEN_HASHES")
    token_commands = token.add_subparsers(dest="token_command", required=True, metavar="COMMAND")
    hash_cmd = token_commands.add_parser(
        "hash",
        help="print `tenant:sha256hex` for the token on stdin",
        description="Read one token from stdin and print its GRAPHLEDGER_API_TOKEN_HASHES entry for TENANT; "
        "join entries with commas. Make a token with e.g. "
        "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`.",
    )
    hash_cmd.add_argument("tenant", help="tenant name: 1-64 of A-Z a-z 0-9 _ -")
    hash_cmd.set_defaults(run=_hash)


def _hash(args: argparse.Namespace, settings: Settings) -> int:
    try:
        tenant = check_tenant_name(args.tenant)
    except ValueError as exc:
        print(f"graphledger: {exc}", file=sys.stderr)
        return 2
    token = sys.stdin.readline().rstrip("\r\n")
    if not token:
        print("graphledger: no token on stdin (pipe one line in)", file=sys.stderr)
        return 2
    print(f"{tenant}:{hash_token(token)}")
    return 0
