"""Bearer-token auth of the `/v1` routes: each token names a tenant, whose data alone it reads, and what
it may do there (`credentials.py`).

A request's token is hashed and compared with every configured entry by `hmac.compare_digest`, without
stopping at a match. With no token configured every request is the unprefixed tenant's, and may read;
fetching keys and erasing then need a read API that listens on loopback only (`graphledger dev`), where
only processes of the same host can call it. Health routes stay open either way.
"""

from __future__ import annotations

import hmac
import ipaddress
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.security.utils import get_authorization_scheme_param
from starlette.types import ASGIApp, Receive, Scope, Send

from graphledger.settings import Settings
from graphledger.tenancy import hash_token
from graphledger_server.api.codec import respond
from graphledger_server.api.credentials import EVERYTHING, Permission, TokenEntry, token_entries
from graphledger_server.api.errors import ApiError
from graphledger_server.api.tenant import Tenant

BEARER_SCHEME = "HTTPBearer"
REQUIRED = {"/v1/keys": Permission.KEYS, "/v1/erase": Permission.ERASE}
"""The permission each route needs beyond reading; every other `/v1` route needs `read`."""
LOOPBACK_NAMES = frozenset({"localhost"})


@dataclass(frozen=True)
class Caller:
    """Who sent a request: its tenant, what it may do, and its token (hashed; None: no token configured)."""

    tenant: Tenant
    permissions: frozenset[Permission]
    token: bytes | None


def listens_on_loopback(host: str) -> bool:
    """Whether an address to listen on admits only this host's processes: `localhost` or a loopback IP."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to any interface


class AccessPolicy:
    """The callers a read API accepts, from its settings: its tokens, or, with none, its address."""

    def __init__(self, settings: Settings) -> None:
        self.entries: list[TokenEntry] | None = token_entries(settings)
        self.host = settings.api_host
        anonymous = EVERYTHING if listens_on_loopback(self.host) else frozenset({Permission.READ})
        self.anonymous = Caller(Tenant(""), anonymous, None)

    @property
    def tenant_count(self) -> int:
        """How many tenants can call: those the tokens name, or the one unprefixed tenant."""
        return len({entry.tenant for entry in self.entries}) if self.entries is not None else 1

    def caller(self, authorization: str) -> Caller | None:
        """The caller an `Authorization` header names; None: a missing or wrong token."""
        if self.entries is None:
            return self.anonymous
        scheme, token = get_authorization_scheme_param(authorization)
        if scheme.lower() != "bearer" or not token:
            return None
        given = bytes.fromhex(hash_token(token))
        found: TokenEntry | None = None
        for entry in self.entries:  # every entry, so the time taken does not say which one matched
            if hmac.compare_digest(given, entry.digest):
                found = entry
        return None if found is None else Caller(found.tenant, found.permissions, found.digest)

    def refusal(self, caller: Caller, path: str) -> ApiError | None:
        """The 403 for a caller without the permission `path` needs; None: allowed."""
        needed = REQUIRED.get(path.rstrip("/"), Permission.READ)
        if needed in caller.permissions:
            return None
        if caller.token is None:
            return ApiError(
                403,
                "token_required",
                f"{path} needs a token: this read API has none configured and listens on {self.host!r} "
                "(GRAPHLEDGER_API_HOST), which is not loopback. Configure tokens (GRAPHLEDGER_API_TOKEN_HASHES, "
                "made by `graphledger token new`), or listen on 127.0.0.1",
            )
        grant = (
            f"grant it with `:{needed.value}` after the token's hash in GRAPHLEDGER_API_TOKEN_HASHES "
            f"(`graphledger token new TENANT --{needed.value}`)"
        )
        if needed is Permission.ERASE:
            grant += ", or run `graphledger erase` with the database"
        return ApiError(403, "permission_denied", f"this token may not {needed.value}: {grant}")


class TenantAuth:
    """ASGI middleware: every `/v1` request is authenticated and authorised before it is routed, and
    its caller put on `request.state`; a missing or wrong token is a 401, a missing permission a 403,
    in the API's error format.

    Middleware rather than a FastAPI dependency: no route under `/v1` can be added without it, and
    it skips the dependency solving FastAPI would do per request (0.1 ms measured, on every read).
    """

    def __init__(self, app: ASGIApp, policy: AccessPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"] if scope["type"] == "http" else ""
        if not (path == "/v1" or path.startswith("/v1/")):
            await self.app(scope, receive, send)
            return
        authorization = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
        caller = self.policy.caller(authorization.decode("latin-1"))
        refused = _unauthorized() if caller is None else self.policy.refusal(caller, path)
        if refused is not None:
            response = respond(Request(scope), refused.body(), refused.status, refused.headers)
            await response(scope, receive, send)
            return
        scope.setdefault("state", {})["caller"] = caller
        await self.app(scope, receive, send)


def _unauthorized() -> ApiError:
    return ApiError(
        401,
        "unauthorized",
        "missing or wrong bearer token (Authorization: Bearer <GRAPHLEDGER_API_TOKEN>)",
        headers={"WWW-Authenticate": "Bearer"},
    )


def document_bearer_auth(app: FastAPI) -> None:
    """Declare the bearer token on every `/v1` operation of the OpenAPI schema (the middleware,
    unlike a dependency, is invisible to FastAPI's schema)."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        first = app.openapi_schema is None
        schema = generate()  # built once; FastAPI keeps it as app.openapi_schema
        if first:
            schemes = schema.setdefault("components", {}).setdefault("securitySchemes", {})
            schemes[BEARER_SCHEME] = {
                "type": "http",
                "scheme": "bearer",
                "description": "A tenant's token (GRAPHLEDGER_API_TOKEN on the client)",
            }
            for path, operations in schema.get("paths", {}).items():
                if path.startswith("/v1/"):
                    for operation in operations.values():
                        operation["security"] = [{BEARER_SCHEME: []}]
        return schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to extend the schema


def tenant_of(request: Request) -> Tenant:
    """The tenant `TenantAuth` resolved; a route outside `/v1` asking for one is a bug, not an unscoped read."""
    return caller_of(request).tenant


def caller_of(request: Request) -> Caller:
    """Who sent the request, as `TenantAuth` resolved it."""
    caller = getattr(request.state, "caller", None)
    if not isinstance(caller, Caller):
        raise RuntimeError(f"{request.url.path} ran without TenantAuth")
    return caller


whoami_router = APIRouter(prefix="/v1", tags=["auth"])


@whoami_router.get("/whoami", responses={200: {"content": {"application/json": {"example": {"tenant": "acme"}}}}})
async def whoami(request: Request) -> Response:
    """The caller's tenant ("" for none): the client prefixes its writes' threads and namespaces with it."""
    return respond(request, {"tenant": tenant_of(request).name})
