"""`driver_errors.verdict_of`: the one table of retry, reject and fatal every service decides by."""

from __future__ import annotations

import asyncpg
import psycopg
import psycopg.errors
import psycopg_pool
import pytest
from aiokafka.errors import KafkaConnectionError, KafkaTimeoutError, MessageSizeTooLargeError

from graphledger.errors import GraphledgerError, InvalidEventError, PublishError, SchemaSwitchedError
from graphledger_server.driver_errors import Verdict, is_database_error, schema_missing, verdict_of

RETRY_DATABASE = [
    ConnectionRefusedError("refused"),
    TimeoutError(),
    asyncpg.exceptions.ConnectionDoesNotExistError("closed mid-statement"),  # 08003
    asyncpg.exceptions.CannotConnectNowError("starting up"),  # 57P03
    asyncpg.exceptions.AdminShutdownError("shutting down"),  # 57P01
    asyncpg.exceptions.SerializationError("lost a race"),  # 40001
    asyncpg.exceptions.DeadlockDetectedError("deadlock"),  # 40P01
    asyncpg.exceptions.TooManyConnectionsError("busy"),  # 53300
    asyncpg.exceptions.IdleInTransactionSessionTimeoutError("stopped inside its transaction"),  # 25P03
    asyncpg.InterfaceError("cannot perform operation: connection is closed"),
    asyncpg.InternalClientError("cannot switch to state 15"),
    psycopg.OperationalError("connection failed"),  # no SQLSTATE: connecting
    psycopg_pool.PoolTimeout("no connection in time"),
    psycopg.errors.SerializationFailure(),
    psycopg.errors.LockNotAvailable(),  # 55P03: an OperationalError psycopg names by class only
    psycopg.errors.IdleInTransactionSessionTimeout(),
]
RETRY = [
    *RETRY_DATABASE,
    KafkaConnectionError(),
    KafkaTimeoutError(),
    MessageSizeTooLargeError(),  # not retriable to aiokafka, but a batch is never skipped for Kafka
    PublishError("no acknowledgement"),
    SchemaSwitchedError(),
]

REJECT = [
    asyncpg.exceptions.CardinalityViolationError("twice in one statement"),  # 21000
    asyncpg.exceptions.InvalidTextRepresentationError("bad json"),  # 22P02
    asyncpg.exceptions.UntranslatableCharacterError("\\u0000"),  # 22P05
    asyncpg.exceptions.UniqueViolationError("duplicate"),  # 23505
    asyncpg.exceptions.ProgramLimitExceededError("index row too large"),  # 54000
    psycopg.errors.ProgramLimitExceeded(),  # an OperationalError by class, but the request's fault
    psycopg.errors.InvalidTextRepresentation(),
]

FATAL_DATABASE = [
    asyncpg.exceptions.UndefinedTableError("not migrated"),  # 42P01
    asyncpg.exceptions.UndefinedColumnError("older schema"),  # 42703
    asyncpg.exceptions.InvalidPasswordError("wrong password"),  # 28P01
    asyncpg.exceptions.InFailedSQLTransactionError("a statement after a failed one"),  # 25P02: a bug
    psycopg.errors.UndefinedTable(),
    psycopg.InterfaceError("the connection is closed"),
]
FATAL = [
    *FATAL_DATABASE,
    InvalidEventError("bad event"),
    GraphledgerError("refused"),
    KeyError("a bug"),
    ValueError("a bug"),
]


@pytest.mark.parametrize("exc", RETRY, ids=lambda e: type(e).__name__)
def test_retry(exc: BaseException) -> None:
    assert verdict_of(exc) is Verdict.RETRY


@pytest.mark.parametrize("exc", REJECT, ids=lambda e: type(e).__name__)
def test_reject(exc: BaseException) -> None:
    assert verdict_of(exc) is Verdict.REJECT


@pytest.mark.parametrize("exc", FATAL, ids=lambda e: type(e).__name__)
def test_fatal(exc: BaseException) -> None:
    assert verdict_of(exc) is Verdict.FATAL


def test_a_retryable_graphledger_error_is_retried_by_its_attribute() -> None:
    class Transient(GraphledgerError):
        retryable = True

    assert verdict_of(Transient()) is Verdict.RETRY
    assert verdict_of(GraphledgerError()) is Verdict.FATAL


def test_a_missing_table_is_the_schema_not_migrated_for_either_driver() -> None:
    assert schema_missing(asyncpg.exceptions.UndefinedTableError("x"))
    assert schema_missing(psycopg.errors.UndefinedTable())
    assert not schema_missing(asyncpg.exceptions.UndefinedColumnError("x"))
    assert not schema_missing(OSError("x"))


def test_database_errors_are_what_postgres_or_the_way_to_it_raises() -> None:
    for exc in [*RETRY_DATABASE, *REJECT, *FATAL_DATABASE]:
        assert is_database_error(exc), exc
    for exc in (KafkaConnectionError(), PublishError(), KeyError("a bug"), ValueError("a bug")):
        assert not is_database_error(exc), exc
