"""The read API's HTTP client: msgpack bodies, bearer token, and the headers a read adds.

aiohttp rather than httpx: its C HTTP parser made a read API round trip ~0.3 ms shorter (0.24 ms
against 0.5 ms for a trivial request on the development machine), which is most of a store search's
budget at concurrency 1. For the same reason the proxy the environment names (HTTP(S)_PROXY,
NO_PROXY) is looked up once per session, not by aiohttp's `trust_env` on every request: that costs
two thread-pool hops per request (proxy and .netrc lookups), 0.4 ms measured.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import aiohttp
import ormsgpack
from aiohttp.helpers import get_env_proxy_for_url
from opentelemetry.context import Context
from yarl import URL

from graphledger.errors import ConsistencyTimeoutError, ReadApiError, SubjectErasedError
from graphledger.settings import Settings
from graphledger.telemetry.client import http_client_span, redact_url
from graphledger.wire import CLIENT_KEEPALIVE_S, CLIENT_READ_SLACK_S, MSGPACK

_CONNECT_TIMEOUT_S = 5.0


class ReadApiClient:
    """One aiohttp connection pool, made on first use on the client's background loop."""

    def __init__(self, settings: Settings) -> None:
        self._headers = {"Accept": MSGPACK, "Content-Type": MSGPACK}
        if settings.api_token is not None:
            self._headers["Authorization"] = f"Bearer {settings.api_token.get_secret_value()}"
        # The server waits up to consistency_timeout_s before it answers, and bounds a request itself
        # below this (`api/deadline.py`).
        self._timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=_CONNECT_TIMEOUT_S, sock_read=settings.consistency_timeout_s + CLIENT_READ_SLACK_S
        )
        self._base_url = settings.api_url.rstrip("/")
        self._ssl = settings.api_ssl_context()  # a bad GRAPHLEDGER_API_CA_FILE fails here, before any request
        self._traced_url = redact_url(settings.api_url)
        self._session: aiohttp.ClientSession | None = None
        self._proxy: URL | None = None
        self._proxy_auth: aiohttp.BasicAuth | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def whoami(self) -> str:
        """The tenant the read API knows this client's token by ("" : none)."""
        status, content_type, content = await self._request("GET", "/v1/whoami")
        if status != 200:
            _raise("/v1/whoami", status, content_type, content)
        answer = ormsgpack.unpackb(content)
        tenant = answer.get("tenant") if isinstance(answer, dict) else None
        if not isinstance(tenant, str):
            raise ReadApiError(status, "bad_answer", f"/v1/whoami answered tenant {tenant!r}")
        return tenant

    async def call(
        self, path: str, body: dict[str, Any], headers: Mapping[str, str] | None = None, context: Context | None = None
    ) -> Any:
        """POST `body` to `path` with `headers`, in an HTTP client span under `context`."""
        headers = dict(headers or {})  # the span injects the trace context into it
        with http_client_span(self._traced_url, "POST", path, headers, context) as span:
            status, content_type, content = await self._request("POST", path, ormsgpack.packb(body), headers)
            span.status(status)
            if status == 200:
                return ormsgpack.unpackb(content)
            return _raise(path, status, content_type, content)

    async def _request(
        self, method: str, path: str, data: bytes | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, str, bytes]:
        """Status, content type and body of one request; an unreachable API is a retryable error."""
        if self._session is None:
            self._proxy, self._proxy_auth = _env_proxy(self._base_url)
            connector = aiohttp.TCPConnector(keepalive_timeout=CLIENT_KEEPALIVE_S, ssl=self._ssl or True)
            self._session = aiohttp.ClientSession(headers=self._headers, timeout=self._timeout, connector=connector)
        try:
            try:
                return await self._send(method, path, data, headers)
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
                # A pooled connection closed by the other end (a proxy's idle timeout, a restarted
                # replica) fails the request that reuses it: send it once more, on a new connection.
                # Every route the client calls may be repeated (reads; key creation and erasure are
                # idempotent). A refused connection is the API being down: no second try.
                if isinstance(exc, aiohttp.ClientConnectorError):
                    raise
            return await self._send(method, path, data, headers)
        except aiohttp.ClientConnectorCertificateError as exc:
            raise ReadApiError(0, "untrusted_certificate", f"{path}: {_untrusted(exc)}") from exc
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise ReadApiError(0, "unreachable", f"{path}: {exc or type(exc).__name__}", retryable=True) from exc

    async def _send(
        self, method: str, path: str, data: bytes | None, headers: dict[str, str] | None
    ) -> tuple[int, str, bytes]:
        assert self._session is not None
        async with self._session.request(
            method,
            self._base_url + path,
            data=data,
            headers=headers,
            proxy=self._proxy,
            proxy_auth=self._proxy_auth,
        ) as response:
            return response.status, response.headers.get("content-type", ""), await response.read()


def _untrusted(exc: aiohttp.ClientConnectorCertificateError) -> str:
    """Why the read API's certificate was refused, and which setting decides whom the client trusts."""
    return (
        f"the read API's certificate is not trusted ({exc.certificate_error}): its CA must be in "
        "GRAPHLEDGER_API_CA_FILE (or the system CAs, without it)"
    )


def _env_proxy(url: str) -> tuple[URL | None, aiohttp.BasicAuth | None]:
    """The proxy HTTP(S)_PROXY names for `url` unless NO_PROXY exempts it, as the usual HTTP clients honour them."""
    try:
        return get_env_proxy_for_url(URL(url))
    except LookupError:
        return None, None


def _raise(path: str, status: int, content_type: str, content: bytes) -> Any:
    try:
        body = ormsgpack.unpackb(content) if content_type.startswith(MSGPACK) else json.loads(content)
    except ValueError:
        body = {}
    if not isinstance(body, dict):
        body = {}
    code = str(body.get("error", "http_error"))
    message = str(body.get("message") or body.get("detail") or content[:500].decode("utf-8", "replace"))
    retryable = bool(body.get("retryable", status in (429, 502, 503, 504)))
    if code == "subject_erased":
        raise SubjectErasedError(f"{path}: {message}")
    cls = ConsistencyTimeoutError if code == "consistency_timeout" else ReadApiError
    raise cls(status, code, f"{path}: {message}", retryable)
