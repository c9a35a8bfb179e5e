"""What a failure means, decided in one place: retry the operation, reject its input, or stop.

Every service asks `verdict_of(exc)` rather than listing exception classes of its own:
- `RETRY`: the same operation can succeed later. The network or the server is away, busy or
  restarting, or the transaction lost a race: SQLSTATE classes 08 (connection), 40 (serialization,
  deadlock), 53 (insufficient resources) and 57 (operator intervention, such as a shutdown), and
  25P03 (the session was ended because its transaction sat idle: the process was stopped inside it); an
  `OSError` or a timeout; asyncpg's interface and protocol errors (a connection that broke under an
  operation); psycopg's `OperationalError` without one of those classes (connecting, a pool timeout);
  every Kafka error (the projector never skips a batch for one); a graphledger error whose
  `retryable` is set.
- `REJECT`: Postgres refuses a value of the input, so no retry can succeed: SQLSTATE classes 21
  (cardinality), 22 (data exception), 23 (integrity constraint) and 54 (program limit exceeded).
  The projector dead-letters the event; the read API answers 400.
- `FATAL`: anything else: a bug, or a schema or setting only an operator can fix.

Two facts beside the verdict: `schema_missing` (the projection is not migrated yet, which the read API
answers as a retryable 503 and the sweeper waits out) and `is_database_error` (raised by Postgres or
the way to it rather than by this process, which the long-running watchers outlast whatever it says).
"""

from __future__ import annotations

import enum

import asyncpg
import psycopg
from aiokafka.errors import KafkaError

from graphledger.errors import GraphledgerError

RETRY_SQLSTATE_CLASSES = frozenset({"08", "40", "53", "57"})
IDLE_IN_TRANSACTION_TIMEOUT = "25P03"
REJECT_SQLSTATE_CLASSES = frozenset({"21", "22", "23", "54"})
UNDEFINED_TABLE = "42P01"

_DATABASE_ERRORS = (
    OSError,
    TimeoutError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    psycopg.Error,
)


class Verdict(enum.Enum):
    RETRY = "retry"
    REJECT = "reject"
    FATAL = "fatal"


def verdict_of(exc: BaseException) -> Verdict:
    """What to do about `exc`: retry the same operation, reject its input, or stop (module docstring)."""
    if isinstance(exc, GraphledgerError):
        return Verdict.RETRY if exc.retryable else Verdict.FATAL
    # InternalClientError: asyncpg's protocol state broke when the server went away mid-operation
    # (seen as "cannot switch to state 15" when Postgres stops under a batch).
    if isinstance(exc, OSError | TimeoutError | asyncpg.InterfaceError | asyncpg.InternalClientError | KafkaError):
        return Verdict.RETRY
    if isinstance(exc, asyncpg.PostgresError | psycopg.Error):
        state = _sqlstate(exc) or ""
        state_class = state[:2]
        if state_class in RETRY_SQLSTATE_CLASSES or state == IDLE_IN_TRANSACTION_TIMEOUT:
            return Verdict.RETRY
        if state_class in REJECT_SQLSTATE_CLASSES:
            return Verdict.REJECT
        if isinstance(exc, psycopg.OperationalError):
            return Verdict.RETRY
    return Verdict.FATAL


def schema_missing(exc: BaseException) -> bool:
    """Whether `exc` says a projection table does not exist: the schema is not migrated (yet)."""
    return isinstance(exc, asyncpg.PostgresError | psycopg.Error) and _sqlstate(exc) == UNDEFINED_TABLE


def is_database_error(exc: BaseException) -> bool:
    """Whether `exc` came from Postgres or the way to it (either driver, the network), not from this process."""
    return isinstance(exc, _DATABASE_ERRORS)


def _sqlstate(exc: BaseException) -> str | None:
    state = getattr(exc, "sqlstate", None)
    return state if isinstance(state, str) else None
