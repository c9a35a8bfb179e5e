"""The read API's configured tokens and what each may do.

`GRAPHLEDGER_API_TOKEN_HASHES` lists `tenant:sha256hex` entries, each optionally followed by
`:PERMISSION[+PERMISSION...]`, permissions beyond an agent's. Every token reads its tenant's data and
fetches its data keys (`read`, `keys`); erasing (`erase`) is granted only by naming it, so an agent's
token cannot destroy its tenant's data unless the operator says so. An entry without the third field is
an agent's token: the format of earlier releases means what it meant, minus erasure.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from graphledger.settings import Settings
from graphledger.tenancy import check_tenant_name, hash_token
from graphledger_server.api.tenant import Tenant

_SHA256_HEX = 64
PERMISSION_SEPARATOR = "+"


class Permission(StrEnum):
    READ = "read"
    """Checkpoint and store reads, `/v1/whoami`."""
    KEYS = "keys"
    """`POST /v1/keys`: the tenant's hashing key and its subjects' data keys (created on first use)."""
    ERASE = "erase"
    """`POST /v1/erase`: destroy a subject's or the whole tenant's keys for ever."""


AGENT = frozenset({Permission.READ, Permission.KEYS})
"""What every token may do."""
GRANTABLE = frozenset({Permission.ERASE})
"""What an entry's third field may add."""
EVERYTHING = frozenset(Permission)


@dataclass(frozen=True)
class TokenEntry:
    digest: bytes
    tenant: Tenant
    permissions: frozenset[Permission] = AGENT


def parse_token_hashes(text: str) -> list[TokenEntry]:
    """`tenant:sha256hex[:permission+...],...` as entries; a ValueError names the first bad one (never its hash)."""
    entries: list[TokenEntry] = []
    seen: set[str] = set()
    for n, raw in enumerate(text.split(","), start=1):
        item = raw.strip()
        if not item:
            continue
        fields = item.split(":")
        if len(fields) not in (2, 3):
            raise ValueError(f"api_token_hashes entry {n}: expected tenant:sha256hex or tenant:sha256hex:erase")
        tenant, digest = fields[0], fields[1].lower()
        check_tenant_name(tenant)
        if len(digest) != _SHA256_HEX or any(c not in "0123456789abcdef" for c in digest):
            raise ValueError(f"api_token_hashes entry {n} ({tenant}): the hash is not 64 hex digits")
        if digest in seen:
            raise ValueError(f"api_token_hashes entry {n} ({tenant}): the same token hash is listed twice")
        seen.add(digest)
        granted = _permissions(fields[2], n, tenant) if len(fields) == 3 else frozenset()
        entries.append(TokenEntry(bytes.fromhex(digest), Tenant(tenant), AGENT | granted))
    if not entries:
        raise ValueError("api_token_hashes is set but lists no tokens")
    return entries


def _permissions(text: str, n: int, tenant: str) -> frozenset[Permission]:
    names = text.split(PERMISSION_SEPARATOR)
    unknown = [name for name in names if name not in GRANTABLE]
    if unknown:
        allowed = ", ".join(sorted(GRANTABLE))
        raise ValueError(f"api_token_hashes entry {n} ({tenant}): permission {unknown[0]!r} is not one of {allowed}")
    return frozenset(Permission(name) for name in names)


def token_entries(settings: Settings) -> list[TokenEntry] | None:
    """The accepted tokens, or None when no token is configured.

    The single `api_token` (without hashes) is an agent's token of the unprefixed tenant: an operator
    of a single-tenant deployment erases with `graphledger erase`, or lists hashed tokens instead.
    """
    if settings.api_token_hashes is not None:
        return parse_token_hashes(settings.api_token_hashes.get_secret_value())
    if settings.api_token is not None:
        digest = hash_token(settings.api_token.get_secret_value())
        return [TokenEntry(bytes.fromhex(digest), Tenant(""))]
    return None


def token_entry(tenant: str, token: str, permissions: frozenset[Permission] = frozenset()) -> str:
    """The `GRAPHLEDGER_API_TOKEN_HASHES` entry of `token` for `tenant`, granting `permissions` beyond an agent's."""
    check_tenant_name(tenant)
    extra = sorted(permissions & GRANTABLE)
    suffix = f":{PERMISSION_SEPARATOR.join(extra)}" if extra else ""
    return f"{tenant}:{hash_token(token)}{suffix}"
