"""A request the read API has not answered within its bound is answered 503 (retryable), and the log
says where it was held.

Each step of a read has a bound of its own (the consistency wait `consistency_timeout_s`, a pooled
connection `api_pool_timeout_s`, a Kafka request the log client's timeout), but a statement Postgres
holds behind a lock, or a step without a bound, can still keep a request waiting. The client gives up
after `consistency_timeout_s + CLIENT_READ_SLACK_S` seconds without a byte (`client/reader.py`), and
then knows only that the API did not answer. This bound comes first: the client gets an answer
naming the cause, the operator a warning with the frames the request was waiting in, and cancelling the
request's work gives its connections back.

An erasure (`/v1/erase`) is not bounded here: it records, publishes and waits in stages that each have
a bound, and cutting it between them would leave a subject erased in the key store with its erasure not
published, and its caller without the answer that says to erase it again.
"""

from __future__ import annotations

import asyncio
import logging
import traceback

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from graphledger.wire import SERVER_REQUEST_SLACK_S
from graphledger_server.api.codec import respond
from graphledger_server.api.errors import unavailable

log = logging.getLogger(__name__)

UNBOUNDED_PATHS = frozenset({"/v1/erase"})


class RequestDeadline:
    """ASGI middleware: an HTTP request still running `limit_s` after it arrived is cancelled and
    answered 503 `request_deadline` (unless its answer began), with a warning naming where it waited."""

    def __init__(self, app: ASGIApp, limit_s: float) -> None:
        self.app = app
        self.limit_s = limit_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].rstrip("/") in UNBOUNDED_PATHS:
            await self.app(scope, receive, send)
            return
        answering = False

        async def sending(message: Message) -> None:
            nonlocal answering
            answering = answering or message["type"] == "http.response.start"
            await send(message)

        try:
            async with asyncio.timeout(self.limit_s):
                await self.app(scope, receive, sending)
        except TimeoutError as exc:
            held = exc.__cause__.__traceback__ if exc.__cause__ is not None else exc.__traceback__
            frames = "".join(traceback.format_tb(held))
            log.warning("%s was not answered within %gs; it waited in:\n%s", scope["path"], self.limit_s, frames)
            if answering:
                return  # its answer began: the connection closes short of it, and the client retries
            error = unavailable(
                "request_deadline",
                f"the read API did not answer within {self.limit_s:g}s (consistency_timeout_s plus "
                f"{SERVER_REQUEST_SLACK_S:g}s for its queries); retry. Its log names where the request waited",
            )
            await respond(Request(scope), error.body(), error.status, error.headers)(scope, receive, send)
