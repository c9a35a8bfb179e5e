"""The read API client honours HTTP_PROXY and NO_PROXY, read from the environment once per session."""

from __future__ import annotations

import asyncio
import socket

import ormsgpack
import pytest

from graphledger.client.reader import ReadApiClient
from graphledger.errors import ReadApiError
from graphledger.settings import Settings
from graphledger.wire import MSGPACK


class _Proxy:
    """A forward HTTP proxy stand-in on a free port: records request lines, answers whoami itself."""

    def __init__(self) -> None:
        self.request_lines: list[str] = []
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> _Proxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.sockets[0].getsockname()[:2]
        return f"http://{host}:{port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := (await reader.readline()).decode().strip():
            self.request_lines.append(line)
            while (await reader.readline()).strip():  # the headers; a GET has no body
                pass
            body = ormsgpack.packb({"tenant": "via-proxy"})
            head = f"HTTP/1.1 200 OK\r\nContent-Type: {MSGPACK}\r\nContent-Length: {len(body)}\r\n\r\n"
            writer.write(head.encode() + body)
            await writer.drain()
        writer.close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_requests_go_through_http_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    api_url = f"http://127.0.0.1:{_closed_port()}"  # nothing listens there: only the proxy can answer
    async with _Proxy() as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        client = ReadApiClient(Settings(api_url=api_url))
        try:
            assert await client.whoami() == "via-proxy"
            assert await client.whoami() == "via-proxy"
        finally:
            await client.close()
    assert proxy.request_lines == [f"GET {api_url}/v1/whoami HTTP/1.1"] * 2


async def test_no_proxy_exempts_the_api_host(monkeypatch: pytest.MonkeyPatch) -> None:
    api_url = f"http://127.0.0.1:{_closed_port()}"
    async with _Proxy() as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        client = ReadApiClient(Settings(api_url=api_url))
        try:
            with pytest.raises(ReadApiError) as caught:
                await client.whoami()
        finally:
            await client.close()
    assert caught.value.code == "unreachable" and caught.value.retryable
    assert proxy.request_lines == []
