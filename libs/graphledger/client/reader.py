"""The read API's HTTP client: msgpack bodies, bearer token, consistency token on every read."""

from __future__ import annotations

from typing import Any

import httpx
import ormsgpack
from opentelemetry.context import Context

from graphledger.errors import ConsistencyTimeoutError, ReadApiError
from graphledger.settings import Settings
from graphledger.telemetry.client import http_client_span, redact_url
from graphledger.wire import CONSISTENCY_HEADER, MSGPACK, format_token

_CONNECT_TIMEOUT_S = 5.0


class ReadApiClient:
    """One httpx connection pool; runs on the client's background loop."""

    def __init__(self, settings: Settings) -> None:
        headers = {"Accept": MSGPACK, "Content-Type": MSGPACK}
        if settings.api_token is not None:
            headers["Authorization"] = f"Bearer {settings.api_token.get_secret_value()}"
        # The server waits up to consistency_timeout_s before it answers; allow for that and the query.
        read_timeout = settings.consistency_timeout_s + 30.0
        self._traced_url = redact_url(settings.api_url)
        self._http = httpx.AsyncClient(
            base_url=settings.api_url.rstrip("/"),
            headers=headers,
            timeout=httpx.Timeout(read_timeout, connect=_CONNECT_TIMEOUT_S),
        )

    async def close(self) -> None:
        await self._http.aclose()

    async def whoami(self) -> str:
        """The tenant the read API knows this client's token by ("" : none)."""
        try:
            response = await self._http.get("/v1/whoami")
        except httpx.TransportError as exc:
            raise ReadApiError(0, "unreachable", f"/v1/whoami: {exc or type(exc).__name__}", retryable=True) from exc
        if response.status_code != 200:
            raise _error("/v1/whoami", response)
        tenant = ormsgpack.unpackb(response.content).get("tenant")
        if not isinstance(tenant, str):
            raise ReadApiError(response.status_code, "bad_answer", f"/v1/whoami answered tenant {tenant!r}")
        return tenant

    async def call(
        self, path: str, body: dict[str, Any], token: dict[tuple[str, int], int], context: Context | None = None
    ) -> Any:
        """POST `body` to `path` with the consistency token, in an HTTP client span under `context`."""
        headers = {CONSISTENCY_HEADER: format_token(token)} if token else {}
        with http_client_span(self._traced_url, "POST", path, headers, context) as span:
            try:
                response = await self._http.post(path, content=ormsgpack.packb(body), headers=headers)
            except httpx.TransportError as exc:
                raise ReadApiError(0, "unreachable", f"{path}: {exc or type(exc).__name__}", retryable=True) from exc
            span.status(response.status_code)
            if response.status_code == 200:
                return ormsgpack.unpackb(response.content)
            raise _error(path, response)


def _error(path: str, response: httpx.Response) -> ReadApiError:
    try:
        body = (
            ormsgpack.unpackb(response.content)
            if response.headers.get("content-type", "").startswith(MSGPACK)
            else response.json()
        )
    except ValueError:
        body = {}
    if not isinstance(body, dict):
        body = {}
    code = str(body.get("error", "http_error"))
    message = str(body.get("message") or body.get("detail") or response.text[:500])
    retryable = bool(body.get("retryable", response.status_code in (429, 502, 503, 504)))
    cls = ConsistencyTimeoutError if code == "consistency_timeout" else ReadApiError
    return cls(response.status_code, code, f"{path}: {message}", retryable)
