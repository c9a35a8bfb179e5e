"""Database client spans for the projector's statements: one span per statement, named by its summary.

`traced(conn)` wraps an asyncpg connection so that each statement sent through it (execute, fetch...,
COPY) gets a `SpanKind.CLIENT` span under the current one, per the database semantic conventions:
`db.system.name=postgresql`, `db.operation.name`, `db.collection.name` and `db.query.summary` (such as
`INSERT checkpoints`), all derived from the statement text, which is a constant with `$n`
placeholders. Parameter values are never looked at, so checkpoint and store content cannot reach a span.

Wrapping the connection (rather than editing every projection module) keeps the projections free of
tracing code and covers statements added later; the summary of each distinct statement text is
computed once.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import unquote, urlsplit

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from graphledger.telemetry import names

_tracer = trace.get_tracer(names.PROJECTOR_SCOPE)

_MAX_SUMMARY_CHARS = 255
_SUMMARY_CACHE_MAX = 1024
_IDENT = r"[a-z_][a-z0-9_$]*"
_CTE = re.compile(
    rf"(?:\bWITH(?:\s+RECURSIVE)?|,)\s*({_IDENT})\s*(?:\([^)]*\))?\s+AS\s*(?:NOT\s+)?(?:MATERIALIZED\s*)?\(", re.I
)
# The statement's targets in text order: INSERT INTO t, DELETE FROM t, UPDATE t, and the tables a
# SELECT reads (FROM t / JOIN t). After FROM or JOIN, a name followed by "(" is a function (unnest).
_TARGET = re.compile(
    rf"\b(INSERT\s+INTO|DELETE\s+FROM|UPDATE|MERGE\s+INTO|FROM|JOIN)\s+(?:ONLY\s+)?"
    rf"({_IDENT}(?:\.{_IDENT})?)(?![\w.$])(\s*\()?",
    re.I,
)
# Keywords that can follow the target keywords: `DO UPDATE SET`, `FOR UPDATE OF`, `JOIN LATERAL`.
_NOT_TABLES = frozenset({"set", "of", "nowait", "skip", "select", "lateral", "values", "only"})
_VERB = re.compile(rf"^\s*(?:--[^\n]*\n\s*)*([a-z]+)(?:\s+({_IDENT})\s*\()?", re.I)
_OPERATIONS = {"insert into": "INSERT", "delete from": "DELETE", "update": "UPDATE", "merge into": "MERGE"}


def summarize(sql: str) -> tuple[str, str, str | None]:
    """`(db.query.summary, db.operation.name, db.collection.name)` of a statement, from its text alone.

    The summary lists each operation with the tables it touches, in order (`INSERT checkpoints`,
    `DELETE checkpoints checkpoint_blobs checkpoint_writes graphledger_thread_partitions`), without the
    schema, which is the same for every statement of a deployment.
    """
    ctes = {m.group(1).lower() for m in _CTE.finditer(sql)}
    groups: list[tuple[str, list[str]]] = []
    first_collection: str | None = None
    for match in _TARGET.finditer(sql):
        keyword = re.sub(r"\s+", " ", match.group(1).lower())
        qualified = match.group(2).lower()
        table = qualified.rsplit(".", 1)[-1]
        operation = _OPERATIONS.get(keyword, "SELECT")
        function_call = operation == "SELECT" and match.group(3) is not None
        if function_call or table in _NOT_TABLES or qualified in ctes:
            continue
        if first_collection is None:
            first_collection = table
        if groups and groups[-1][0] == operation:
            if table not in groups[-1][1]:
                groups[-1][1].append(table)
        else:
            groups.append((operation, [table]))
    verb = _VERB.match(sql)
    leading = verb.group(1).upper() if verb else "SQL"
    if not groups:  # `SELECT pg_notify(...)`: the operation and the function it calls
        function = verb.group(2).lower() if verb and verb.group(2) else None
        return (f"{leading} {function}" if function else leading), leading, None
    summary = " ".join(f"{operation} {' '.join(tables)}" for operation, tables in groups)
    return summary[:_MAX_SUMMARY_CHARS], groups[0][0], first_collection


def db_namespace(dsn: str, schema: str) -> str:
    """`db.namespace` for PostgreSQL: `{database}|{schema}` (no host, user or password)."""
    database = ""
    if "://" in dsn:
        database = unquote(urlsplit(dsn).path.lstrip("/"))
    else:
        match = re.search(r"(?:^|\s)dbname\s*=\s*'?([^'\s]+)", dsn)
        database = match.group(1) if match else ""
    return f"{database}|{schema}" if database else schema


class TracedConnection:
    """An asyncpg connection whose statements each get a database client span.

    Everything else (transactions, listeners, attributes) passes through to the wrapped connection.
    """

    __slots__ = ("_conn", "_namespace")

    def __init__(self, conn: Any, namespace: str) -> None:
        self._conn = conn
        self._namespace = namespace

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    async def execute(self, query: str, *args: Any, **kwargs: Any) -> Any:
        with self._span(query):
            return await self._conn.execute(query, *args, **kwargs)

    async def executemany(self, command: str, args: Any, **kwargs: Any) -> Any:
        with self._span(command):
            return await self._conn.executemany(command, args, **kwargs)

    async def fetch(self, query: str, *args: Any, **kwargs: Any) -> Any:
        with self._span(query):
            return await self._conn.fetch(query, *args, **kwargs)

    async def fetchrow(self, query: str, *args: Any, **kwargs: Any) -> Any:
        with self._span(query):
            return await self._conn.fetchrow(query, *args, **kwargs)

    async def fetchval(self, query: str, *args: Any, **kwargs: Any) -> Any:
        with self._span(query):
            return await self._conn.fetchval(query, *args, **kwargs)

    async def copy_records_to_table(self, table_name: str, **kwargs: Any) -> Any:
        with self._copy_span(table_name):
            return await self._conn.copy_records_to_table(table_name, **kwargs)

    async def copy_to_table(self, table_name: str, **kwargs: Any) -> Any:
        with self._copy_span(table_name):
            return await self._conn.copy_to_table(table_name, **kwargs)

    @contextmanager
    def _span(self, sql: str) -> Iterator[None]:
        summary, operation, collection = _cached_summary(sql)
        attributes = {
            names.DB_SYSTEM_NAME: names.DB_SYSTEM_POSTGRESQL,
            names.DB_NAMESPACE: self._namespace,
            names.DB_OPERATION_NAME: operation,
            names.DB_QUERY_SUMMARY: summary,
        }
        if collection is not None:
            attributes[names.DB_COLLECTION_NAME] = collection
        with _statement_span(summary, attributes):
            yield

    @contextmanager
    def _copy_span(self, table: str) -> Iterator[None]:
        summary = f"COPY {table}"
        attributes = {
            names.DB_SYSTEM_NAME: names.DB_SYSTEM_POSTGRESQL,
            names.DB_NAMESPACE: self._namespace,
            names.DB_OPERATION_NAME: "COPY",
            names.DB_COLLECTION_NAME: table,
            names.DB_QUERY_SUMMARY: summary,
        }
        with _statement_span(summary, attributes):
            yield


@contextmanager
def _statement_span(name: str, attributes: dict[str, str]) -> Iterator[None]:
    # The exception's message is not recorded: Postgres quotes offending values in some messages.
    with _tracer.start_as_current_span(
        name, kind=SpanKind.CLIENT, attributes=attributes, record_exception=False, set_status_on_exception=False
    ) as span:
        try:
            yield
        except BaseException as exc:
            if span.is_recording():
                state = getattr(exc, "sqlstate", None)
                span.set_attribute(names.ERROR_TYPE, state or type(exc).__qualname__)
                span.set_status(Status(StatusCode.ERROR))
            raise


_summaries: dict[str, tuple[str, str, str | None]] = {}


def _cached_summary(sql: str) -> tuple[str, str, str | None]:
    found = _summaries.get(sql)
    if found is None:
        found = summarize(sql)
        if len(_summaries) < _SUMMARY_CACHE_MAX:
            _summaries[sql] = found
    return found
