"""A read API process on a stack's projection that knows tenants by their tokens' hashes: for the tests
of tenancy and of hostile producers, which need two tenants' clients."""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import ormsgpack
from pydantic import SecretStr

from graphledger.settings import Settings
from graphledger.tenancy import hash_token
from graphledger.wire import MSGPACK
from graphledger_server.devstack.ports import free_port, wait_until
from graphledger_server.devstack.stack import settings_to_env


@dataclass
class TenantApi:
    url: str
    tokens: dict[str, str]
    """Each tenant's agent token."""
    operator: str
    """The first tenant's operator token, granted erasure."""
    base: Settings

    def settings(self, tenant: str | None) -> Settings:
        token = SecretStr(self.tokens[tenant]) if tenant else None
        return self.base.model_copy(update={"api_url": self.url, "api_token": token})

    def post(self, path: str, body: Any, token: str | None) -> httpx.Response:
        headers = {"Content-Type": MSGPACK, "Accept": MSGPACK}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        return httpx.post(f"{self.url}{path}", content=ormsgpack.packb(body), headers=headers, timeout=30)


@contextlib.contextmanager
def tenant_api(settings: Settings, tenants: Sequence[str], log_dir: Path) -> Iterator[TenantApi]:
    """A second read API process on `settings`' projection, knowing `tenants` by their tokens' hashes
    (and an operator token of the first, granted erasure)."""
    tokens = {tenant: secrets.token_urlsafe(24) for tenant in tenants}
    operator = secrets.token_urlsafe(24)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("GRAPHLEDGER_")}
    env.update(settings_to_env(settings))
    env.pop("GRAPHLEDGER_METRICS_PORT", None)
    env.pop("GRAPHLEDGER_API_TOKEN", None)
    env["GRAPHLEDGER_API_PORT"] = str(port)
    entries = [f"{t}:{hash_token(tok)}" for t, tok in tokens.items()] + [f"{tenants[0]}:{hash_token(operator)}:erase"]
    env["GRAPHLEDGER_API_TOKEN_HASHES"] = ",".join(entries)
    log_path = log_dir / "api.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "graphledger_server", "api"], env=env, stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"the tenant API exited {process.returncode}: {log_path.read_text()[-2000:]}")
        try:
            return httpx.get(f"{url}/readyz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(ready, 60, "the tenant read API")
        yield TenantApi(url, tokens, operator, settings)
    finally:
        process.terminate()
        process.wait(30)
