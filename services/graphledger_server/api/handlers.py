"""Exception handlers: every failure becomes `{"error", "message", "retryable"}` in the negotiated format.

A body names the failure, never a driver's or the broker's message, which can name internal hosts and
addresses: those go to the log.

Database failures of either driver are answered here, as `driver_errors` classifies them, so a route
never returns SQL text or a bare 500 for an outage: a schema that is not migrated yet and an
unreachable Postgres (`RETRY`, which includes the pool's `PoolTimeout`) are 503s the client retries;
a request Postgres refuses (`REJECT`: over one of its limits, a value it cannot take) is a 400.
"""

from __future__ import annotations

import logging

import asyncpg
import psycopg
from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException

from graphledger.errors import LogUnavailableError, PartitionCountChangedError, ReencodeRefusedError
from graphledger_server.api.codec import describe, respond
from graphledger_server.api.errors import ApiError, unavailable
from graphledger_server.api.state import api_state
from graphledger_server.driver_errors import Verdict, schema_missing, verdict_of

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


async def _database_error(request: Request, exc: Exception) -> Response:
    if schema_missing(exc):
        log.warning("projection not migrated for %s: %s", request.url.path, exc)
        return _send(request, unavailable("not_ready", "the projection schema is not migrated yet; retry"))
    verdict = verdict_of(exc)
    if verdict is Verdict.RETRY:
        log.warning("postgres unavailable for %s: %s", request.url.path, exc)
        # Idle connections broken by an outage fail only when used: have the pool test and replace
        # them all now, so one read after Postgres returns is answered 503, not one per stale connection.
        await api_state(request).pool.check()
        return _send(request, unavailable("postgres_unavailable", "the projection database is unreachable; retry"))
    if verdict is Verdict.REJECT:
        # The request's fault (a read too large for one statement), not an outage: a retry would fail forever.
        log.warning("Postgres refused the request to %s: %s", request.url.path, exc)
        return _send(request, ApiError(400, "over_a_limit", "the request exceeds a database limit; ask for less"))
    raise exc  # a bug: on to `_unexpected`, whose 500 is followed by the traceback in the log


async def _reencode_refused(request: Request, exc: Exception) -> Response:
    return _send(request, ApiError(501, "legacy_checkpoint", str(exc)))


async def _log_unavailable(request: Request, exc: Exception) -> Response:
    # Kafka's error names brokers' addresses: the log gets it, the caller only the failure.
    log.warning("cannot learn the log's end for %s: %s", request.url.path, exc)
    return _send(request, unavailable("log_unavailable", "Kafka did not tell where the log ends in time; retry"))


async def _partition_count_changed(request: Request, exc: Exception) -> Response:
    # Names topics and counts only; a thread's partition cannot be told until an operator acts.
    log.error("%s", exc)
    return _send(request, ApiError(503, "partition_count_changed", str(exc)))


async def _unexpected(request: Request, exc: Exception) -> Response:
    # Starlette re-raises after this answer, so the server logs the traceback; the body says nothing
    # about SQL or internals.
    return _send(request, ApiError(500, "internal", "internal error; see the read API's log"))


def install(app: FastAPI) -> None:
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    # Checkpoint reads run on psycopg, store reads on asyncpg (whose outages StoreReader answers itself).
    app.add_exception_handler(psycopg.Error, _database_error)
    app.add_exception_handler(asyncpg.PostgresError, _database_error)
    app.add_exception_handler(ReencodeRefusedError, _reencode_refused)
    app.add_exception_handler(PartitionCountChangedError, _partition_count_changed)
    app.add_exception_handler(LogUnavailableError, _log_unavailable)
    app.add_exception_handler(Exception, _unexpected)
