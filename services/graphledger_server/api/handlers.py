"""Exception handlers: every failure becomes `{"error", "message", "retryable"}` in the negotiated format.

Database failures are translated here, in one place, so a route never returns SQL text or a bare 500
for an outage: an unreachable Postgres (`OperationalError`, which includes the pool's `PoolTimeout`)
and a schema that is not migrated yet are 503s the client retries.
"""

from __future__ import annotations

import logging

import asyncpg
import psycopg
import psycopg.errors
from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException

from graphledger.errors import LogUnavailableError
from graphledger_server.api.codec import describe, respond
from graphledger_server.api.errors import ApiError, unavailable
from graphledger_server.api.passthrough import ReencodeRefusedError
from graphledger_server.api.state import api_state

log = logging.getLogger(__name__)

_HTTP_CODES = {404: "not_found", 405: "method_not_allowed"}


def _send(request: Request, error: ApiError) -> Response:
    return respond(request, error.body(), error.status, error.headers)


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return _send(request, exc)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = _HTTP_CODES.get(exc.status_code, "http_error")
    return _send(request, ApiError(exc.status_code, code, str(exc.detail), headers=dict(exc.headers or {})))


async def _validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    return _send(request, ApiError(422, "invalid_request", describe(exc.errors())))


async def _postgres_unreachable(request: Request, exc: Exception) -> Response:
    log.warning("postgres unavailable for %s: %s", request.url.path, exc)
    # Idle connections broken by an outage fail only when used: have the pool test and replace them
    # all now, so one read after Postgres returns is answered 503, not one per stale connection.
    await api_state(request).pool.check()
    return _send(request, unavailable("postgres_unavailable", "the projection database is unreachable; retry"))


async def _over_a_limit(request: Request, exc: Exception) -> Response:
    # An OperationalError by class, but the request's fault (a read too large for one statement), not
    # an outage: retrying it would fail forever.
    log.warning("request to %s exceeds a Postgres limit: %s", request.url.path, exc)
    return _send(request, ApiError(400, "over_a_limit", "the request exceeds a database limit; ask for less"))


async def _not_migrated(request: Request, exc: Exception) -> Response:
    log.warning("projection not migrated for %s: %s", request.url.path, exc)
    return _send(request, unavailable("not_ready", "the projection schema is not migrated yet; retry"))


async def _reencode_refused(request: Request, exc: Exception) -> Response:
    return _send(request, ApiError(501, "legacy_checkpoint", str(exc)))


async def _log_unavailable(request: Request, exc: Exception) -> Response:
    log.warning("cannot learn the log's end for %s: %s", request.url.path, exc)
    return _send(request, unavailable("log_unavailable", f"{exc}"))


async def _unexpected(request: Request, exc: Exception) -> Response:
    # Starlette re-raises after this answer, so the server logs the traceback; the body says nothing
    # about SQL or internals.
    return _send(request, ApiError(500, "internal", "internal error; see the read API's log"))


def install(app: FastAPI) -> None:
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(psycopg.OperationalError, _postgres_unreachable)
    app.add_exception_handler(psycopg.errors.ProgramLimitExceeded, _over_a_limit)
    app.add_exception_handler(psycopg.errors.UndefinedTable, _not_migrated)
    # The same two from the store reads, which run on asyncpg (its outages are 503s in StoreReader).
    app.add_exception_handler(asyncpg.exceptions.ProgramLimitExceededError, _over_a_limit)
    app.add_exception_handler(asyncpg.exceptions.UndefinedTableError, _not_migrated)
    app.add_exception_handler(ReencodeRefusedError, _reencode_refused)
    app.add_exception_handler(LogUnavailableError, _log_unavailable)
    app.add_exception_handler(Exception, _unexpected)
