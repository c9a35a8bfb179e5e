"""The read API's bound on a request (`api/deadline.py`), in front of stand-in routes: a request held
past it is answered 503 with its cause and cancelled, and the log names where it waited."""

from __future__ import annotations

import asyncio
import logging

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from graphledger_server.api.deadline import RequestDeadline

LIMIT_S = 0.2


class Routes:
    """`/v1/checkpoints/get` waits on a lock nobody releases (as a statement behind a stopped process's
    lock would); `/v1/erase` answers once the test lets it; anything else answers at once."""

    def __init__(self) -> None:
        self.never = asyncio.Event()
        self.erase_may_answer = asyncio.Event()
        self.cancelled = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["path"] == "/v1/checkpoints/get":
            await self.wait_for_a_lock_nobody_releases()
        elif scope["path"].startswith("/v1/erase"):
            await self.erase_may_answer.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"answered"})

    async def wait_for_a_lock_nobody_releases(self) -> None:
        try:
            await self.never.wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise


async def post(app: RequestDeadline, path: str) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as client:
        return await client.post(path, json={})


async def test_a_request_held_past_the_bound_is_answered_503_naming_the_cause_and_its_work_cancelled(
    caplog: pytest.LogCaptureFixture,
) -> None:
    routes = Routes()
    with caplog.at_level(logging.WARNING, logger="graphledger_server.api.deadline"):
        response = await post(RequestDeadline(routes, LIMIT_S), "/v1/checkpoints/get")
    assert response.status_code == 503 and response.headers["retry-after"] == "1"
    body = response.json()
    assert body["error"] == "request_deadline" and body["retryable"] is True
    assert f"within {LIMIT_S:g}s" in body["message"] and "consistency_timeout_s" in body["message"]
    assert routes.cancelled, "the request's work goes on after its answer"
    [warning] = caplog.records
    assert "/v1/checkpoints/get was not answered within" in warning.getMessage()
    assert "wait_for_a_lock_nobody_releases" in warning.getMessage(), "the log does not say where it waited"


async def test_a_request_answered_in_time_is_left_as_it_is() -> None:
    response = await post(RequestDeadline(Routes(), LIMIT_S), "/v1/store/get")
    assert response.status_code == 200 and response.text == "answered"


@pytest.mark.parametrize("path", ["/v1/erase", "/v1/erase/"])
async def test_an_erasure_is_never_cut_between_its_stages(path: str) -> None:
    routes = Routes()
    app = RequestDeadline(routes, LIMIT_S)
    asking = asyncio.create_task(post(app, path))
    read = await post(app, "/v1/checkpoints/get")  # sent after the erasure, and cut at the bound
    assert read.status_code == 503
    assert not asking.done(), "the erasure was cut with the read"
    routes.erase_may_answer.set()
    response = await asking
    assert response.status_code == 200 and response.text == "answered"
