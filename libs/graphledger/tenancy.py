"""Tenant prefixes, shared by the read API (which enforces them on reads) and the client (which applies
them to its writes).

A tenant's thread `t` is stored as `<tenant>/t` and its store namespace `("a", "b")` as
`("<tenant>", "a", "b")`. The empty tenant (single-token or no auth) maps everything to itself.
Tenant names are short, plain words, so they can neither contain the thread separator nor a `.`
(which the store projection joins namespace labels with).
"""

from __future__ import annotations

import hashlib
import re

THREAD_SEPARATOR = "/"
TENANT_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def check_tenant_name(name: str) -> str:
    if not TENANT_NAME.match(name):
        raise ValueError(f"tenant name {name!r} must be 1-64 characters of A-Z, a-z, 0-9, '_' or '-'")
    return name


def hash_token(token: str) -> str:
    """The hex SHA-256 of a token, as `GRAPHLEDGER_API_TOKEN_HASHES` lists it."""
    return hashlib.sha256(token.encode()).hexdigest()


def scoped_thread(tenant: str, thread_id: str) -> str:
    return f"{tenant}{THREAD_SEPARATOR}{thread_id}" if tenant else thread_id


def scoped_namespace(tenant: str, namespace: tuple[str, ...]) -> tuple[str, ...]:
    return (tenant, *namespace) if tenant else namespace
