"""Bearer-token auth for the `/v1` routes when `GRAPHLEDGER_API_TOKEN` is set (health stays open)."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable

from fastapi import Depends
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import SecretStr

from graphledger_server.api.errors import ApiError

# auto_error=False: a missing or non-Bearer header reaches our check, which answers in the API's
# error format; the scheme object also documents the requirement in the OpenAPI schema.
_bearer = HTTPBearer(auto_error=False, description="GRAPHLEDGER_API_TOKEN")


def bearer_auth(token: SecretStr) -> Callable[..., Awaitable[None]]:
    """A dependency that refuses a request without exactly `token`, in constant time."""
    expected = token.get_secret_value().encode()

    async def require_token(credentials: HTTPAuthorizationCredentials | None = Depends(_bearer)) -> None:
        given = credentials.credentials.encode() if credentials else b""
        if not (credentials and hmac.compare_digest(given, expected)):
            raise ApiError(
                401,
                "unauthorized",
                "missing or wrong bearer token (Authorization: Bearer <GRAPHLEDGER_API_TOKEN>)",
                headers={"WWW-Authenticate": "Bearer"},
            )

    return require_token
