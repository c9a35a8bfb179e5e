"""Hypothesis strategies of hostile input, shared by the hostile-input, store filter and API-fuzz tests."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

# Modest example counts keep the suite fast; deadline=None because the calls go through Kafka and Postgres.
HOSTILE = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
FEW = settings(HOSTILE, max_examples=25)

SPECIAL_TEXT = [
    "",
    "'",
    '"',
    "'; DROP TABLE store; --",
    "\\",
    "\\u0000",
    "%s",
    "$1",
    "*",
    "$eq",
    "a.b",
    "\x00",
    "a\x00b",
    "\ud800",
    "x\udfff",
    "\U0001f99c",
    "\u202e",
    "\x1f\x1e",
    "x" * 100_000,
]
SQL_LEAKS = (
    "asyncpg",
    "psycopg",
    "syntax error",
    "invalid input syntax",
    "SQLSTATE",
    'relation "',
    'column "',
    "LINE 1",
)


def assert_clear(exc: BaseException, *words: str) -> None:
    """A validation error that says what was wrong (naming one of `words`, if given), not a driver or SQL message."""
    message = str(exc)
    assert message and not any(leak in message for leak in SQL_LEAKS), message
    if words:
        assert any(w in message for w in words), message


"""Text of a Postgres or driver error: it must never reach a response."""

texts = st.one_of(st.sampled_from(SPECIAL_TEXT), st.text(st.characters(exclude_categories=()), max_size=40))
ints = st.one_of(st.integers(-(2**63), 2**64 - 1), st.sampled_from([2**64, -(2**63) - 1, 10**100]))
scalars = st.one_of(st.none(), st.booleans(), ints, st.floats(), texts)


def nest(depth: int, leaf: Any = 1) -> Any:
    """`leaf` inside `depth` alternating dicts and lists, built without recursion."""
    value = leaf
    for i in range(depth):
        value = {"a": value} if i % 2 else [value]
    return value


deep = st.sampled_from([150, 199, 200, 201, 300, 10_000]).map(nest)
json_values = st.one_of(
    deep,
    st.recursive(
        scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4), max_leaves=12
    ),
)
json_objects = st.dictionaries(texts, json_values, max_size=4)
