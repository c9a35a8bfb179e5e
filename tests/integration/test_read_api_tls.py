"""The read API over HTTPS, end to end across the process boundary: `graphledger api` serves the
certificate its settings name (GRAPHLEDGER_API_TLS_CERTFILE/KEYFILE), and the client's read API session
verifies it against GRAPHLEDGER_API_CA_FILE: a client trusting the CA that signed it reads, one trusting
another CA is refused with an error naming the setting, and plain HTTP gets no answer."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from graphledger.client.reader import ReadApiClient
from graphledger.errors import ReadApiError
from graphledger.settings import Settings
from graphledger_server.devstack.ports import free_port, wait_until
from pki import Pki, make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def https_api(pki: Pki, pg: Any, empty_log: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """`python -m graphledger_server api` on a free loopback port, over HTTPS; its port."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRAPHLEDGER_")}
    env |= {f"GRAPHLEDGER_{name.upper()}": str(value) for name, value in empty_log.items()}
    env |= {
        "GRAPHLEDGER_POSTGRES_DSN": pg.create_database("tls"),
        "GRAPHLEDGER_API_PORT": str(port),
        "GRAPHLEDGER_API_TLS_CERTFILE": str(pki.server_cert),
        "GRAPHLEDGER_API_TLS_KEYFILE": str(pki.server_key),
        "GRAPHLEDGER_KEY_ENCRYPTION_KEYS": os.environ["GRAPHLEDGER_KEY_ENCRYPTION_KEYS"],
    }
    log = tmp_path_factory.mktemp("tls-api") / "api.log"
    with open(log, "wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "graphledger_server", "api"], env=env, stdout=out, stderr=out)
    trusting = ssl.create_default_context(cafile=pki.ca)

    def live() -> bool:
        assert process.poll() is None, Path(log).read_text()[-2000:]
        try:
            return httpx.get(f"https://127.0.0.1:{port}/healthz", verify=trusting, timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_until(live, 30, "the read API to answer over HTTPS")
        yield port
    finally:
        process.terminate()
        process.wait(15)


def client(port: int, scheme: str = "https", **settings: Any) -> ReadApiClient:
    return ReadApiClient(Settings(api_url=f"{scheme}://localhost:{port}", **settings))


async def test_a_client_trusting_the_ca_reads_over_https(https_api: int, pki: Pki) -> None:
    trusting = client(https_api, api_ca_file=str(pki.ca))
    try:
        assert await trusting.whoami() == ""
    finally:
        await trusting.close()


@pytest.mark.parametrize("trusted", ["other CA", "system CAs"])
async def test_a_client_trusting_another_ca_is_refused_naming_the_setting(
    https_api: int, pki: Pki, trusted: str
) -> None:
    ca_file = {"other CA": str(pki.other_ca), "system CAs": None}[trusted]
    refusing = client(https_api, api_ca_file=ca_file)
    try:
        with pytest.raises(ReadApiError) as refused:
            await refusing.whoami()
    finally:
        await refusing.close()
    assert refused.value.code == "untrusted_certificate" and refused.value.retryable is False
    assert "GRAPHLEDGER_API_CA_FILE" in str(refused.value) and "certificate verify failed" in str(refused.value)


async def test_plain_http_gets_no_answer_from_an_https_read_api(https_api: int) -> None:
    plain = client(https_api, scheme="http")
    try:
        with pytest.raises(ReadApiError) as refused:
            await plain.whoami()
    finally:
        await plain.close()
    assert refused.value.status != 200
