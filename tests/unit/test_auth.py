"""Who may call which `/v1` route (`api/auth.py`): the middleware in front of a stand-in app, so each
decision is seen as a client sees it (status, error code, message) without a database."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from pydantic import SecretStr
from starlette.types import Receive, Scope, Send

from graphledger.settings import Settings
from graphledger_server.api.auth import AccessPolicy, Caller, TenantAuth, listens_on_loopback
from graphledger_server.api.credentials import token_entry

TOKENS = {"agent": "agent-token", "operator": "operator-token"}
HASHES = ",".join(
    [token_entry("acme", TOKENS["agent"]), token_entry("acme", TOKENS["operator"], frozenset({"erase"}))]  # type: ignore[arg-type]
)


async def reached(scope: Scope, receive: Receive, send: Send) -> None:
    """The routes behind the middleware: answer who the caller was."""
    caller: Caller = scope["state"]["caller"]
    body = f"{caller.tenant.name}:{','.join(sorted(caller.permissions))}".encode()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body})


async def ask(settings: Settings, path: str, token: str | None = None) -> httpx.Response:
    app = TenantAuth(reached, AccessPolicy(settings))
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as client:
        return await client.post(path, headers=headers, json={})


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.8.0.1", True), ("::1", True), ("[::1]", True), ("localhost", True),
     ("0.0.0.0", False), ("::", False), ("10.0.0.7", False), ("api.internal", False), ("", False)],
)  # fmt: skip
def test_loopback_is_an_address_only_this_host_reaches(host: str, loopback: bool) -> None:
    assert listens_on_loopback(host) is loopback


@pytest.mark.parametrize("path", ["/v1/keys", "/v1/erase", "/v1/checkpoints/get"])
async def test_without_tokens_a_loopback_api_lets_every_call_through(path: str) -> None:
    response = await ask(Settings(api_host="127.0.0.1"), path)
    assert response.status_code == 200 and response.text == ":erase,keys,read"


@pytest.mark.parametrize("path", ["/v1/keys", "/v1/erase", "/v1/erase/"])
async def test_without_tokens_an_api_on_every_address_refuses_keys_and_erasure_saying_what_to_do(path: str) -> None:
    response = await ask(Settings(api_host="0.0.0.0"), path)
    assert response.status_code == 403
    body: dict[str, Any] = response.json()
    assert body["error"] == "token_required" and body["retryable"] is False
    for hint in ("'0.0.0.0'", "GRAPHLEDGER_API_HOST", "GRAPHLEDGER_API_TOKEN_HASHES", "graphledger token new"):
        assert hint in body["message"]
    # Reads stay open: that is what no token means.
    assert (await ask(Settings(api_host="0.0.0.0"), "/v1/checkpoints/get")).status_code == 200


async def test_an_agents_token_reads_and_fetches_keys_but_may_not_erase() -> None:
    settings = Settings(api_host="0.0.0.0", api_token_hashes=SecretStr(HASHES))
    for path in ("/v1/keys", "/v1/checkpoints/get", "/v1/whoami"):
        assert (await ask(settings, path, TOKENS["agent"])).text == "acme:keys,read"
    refused = await ask(settings, "/v1/erase", TOKENS["agent"])
    assert refused.status_code == 403 and refused.json()["error"] == "permission_denied"
    assert ":erase" in refused.json()["message"] and "--erase" in refused.json()["message"]
    erased = await ask(settings, "/v1/erase", TOKENS["operator"])
    assert erased.status_code == 200 and erased.text == "acme:erase,keys,read"


async def test_a_token_configured_binds_every_caller_to_it_even_on_loopback() -> None:
    """With tokens, loopback grants nothing: a missing or wrong token is a 401 everywhere under /v1."""
    settings = Settings(api_host="127.0.0.1", api_token=SecretStr("single"))
    for token in (None, "wrong"):
        response = await ask(settings, "/v1/keys", token)
        assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"
    assert (await ask(settings, "/v1/keys", "single")).text == ":keys,read"
    assert (await ask(settings, "/v1/erase", "single")).status_code == 403  # the single token is an agent's
