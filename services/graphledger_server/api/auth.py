"""Bearer-token auth of the `/v1` routes: each token names a tenant, whose data alone it reads.

Tokens are configured hashed (`GRAPHLEDGER_API_TOKEN_HASHES`: `tenant:sha256hex,...`); a request's
token is hashed and compared with every entry by `hmac.compare_digest`, without stopping at a match.
The older single `GRAPHLEDGER_API_TOKEN` still works when no hashes are set: it is one tenant with no
prefix (single-tenant). Neither set: auth is off and every request is that unprefixed tenant. Health
routes stay open either way.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from fastapi import APIRouter, Depends, Request, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from graphledger.settings import Settings
from graphledger.tenancy import check_tenant_name, hash_token
from graphledger_server.api.codec import respond
from graphledger_server.api.errors import ApiError
from graphledger_server.api.tenant import Tenant

# auto_error=False: a missing or non-Bearer header reaches our check, which answers in the API's
# error format; the scheme object also documents the requirement in the OpenAPI schema.
_bearer = HTTPBearer(auto_error=False, description="A tenant's token (GRAPHLEDGER_API_TOKEN on the client)")
_SHA256_HEX = 64


@dataclass(frozen=True)
class TokenEntry:
    digest: bytes
    tenant: Tenant


def parse_token_hashes(text: str) -> list[TokenEntry]:
    """`tenant:sha256hex,...` as entries; a ValueError names the first bad one (never its hash)."""
    entries: list[TokenEntry] = []
    seen: set[str] = set()
    for n, raw in enumerate(text.split(","), start=1):
        item = raw.strip()
        if not item:
            continue
        tenant, sep, digest = item.rpartition(":")
        if not sep:
            raise ValueError(f"api_token_hashes entry {n}: expected tenant:sha256hex")
        check_tenant_name(tenant)
        digest = digest.lower()
        if len(digest) != _SHA256_HEX or any(c not in "0123456789abcdef" for c in digest):
            raise ValueError(f"api_token_hashes entry {n} ({tenant}): the hash is not 64 hex digits")
        if digest in seen:
            raise ValueError(f"api_token_hashes entry {n} ({tenant}): the same token hash is listed twice")
        seen.add(digest)
        entries.append(TokenEntry(bytes.fromhex(digest), Tenant(tenant)))
    if not entries:
        raise ValueError("api_token_hashes is set but lists no tokens")
    return entries


def token_entries(settings: Settings) -> list[TokenEntry] | None:
    """The accepted tokens, or None when auth is off."""
    if settings.api_token_hashes is not None:
        return parse_token_hashes(settings.api_token_hashes.get_secret_value())
    if settings.api_token is not None:
        digest = hash_token(settings.api_token.get_secret_value())
        return [TokenEntry(bytes.fromhex(digest), Tenant(""))]
    return None


def tenant_auth(entries: list[TokenEntry] | None) -> Callable[..., Awaitable[None]]:
    """A dependency that puts the request's tenant on `request.state`, or refuses it with a 401."""

    async def authenticate(
        request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(_bearer)
    ) -> None:
        if entries is None:
            request.state.tenant = Tenant("")
            return
        found: Tenant | None = None
        if credentials is not None:
            given = bytes.fromhex(hash_token(credentials.credentials))
            for entry in entries:  # every entry, so the time taken does not say which one matched
                if hmac.compare_digest(given, entry.digest):
                    found = entry.tenant
        if found is None:
            raise ApiError(
                401,
                "unauthorized",
                "missing or wrong bearer token (Authorization: Bearer <GRAPHLEDGER_API_TOKEN>)",
                headers={"WWW-Authenticate": "Bearer"},
            )
        request.state.tenant = found

    return authenticate


def tenant_of(request: Request) -> Tenant:
    """The tenant `tenant_auth` resolved; a route outside it is a bug, not an unscoped read."""
    tenant = getattr(request.state, "tenant", None)
    if not isinstance(tenant, Tenant):
        raise RuntimeError(f"{request.url.path} ran without tenant_auth")
    return tenant


whoami_router = APIRouter(prefix="/v1", tags=["auth"])


@whoami_router.get("/whoami", responses={200: {"content": {"application/json": {"example": {"tenant": "acme"}}}}})
async def whoami(request: Request) -> Response:
    """The caller's tenant ("" for none): the client prefixes its writes' threads and namespaces with it."""
    return respond(request, {"tenant": tenant_of(request).name})
