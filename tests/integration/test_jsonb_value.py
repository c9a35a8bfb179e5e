"""`jsonb_value` gives what a jsonb column gives back, checked against real Postgres."""

from __future__ import annotations

import json
from typing import Any

import psycopg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graphledger.jsonb import jsonb_value

_keys = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=6)
_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False, max_value=2**62, min_value=-(2**62))
    | st.sampled_from([0.0, -0.0, 1e-05, 1.5e-07, 1e16, 123.0, 1e-300, 5e-324, 0.1, 100000.0, 2.5e15])
    | _keys
)
_values = st.recursive(
    _scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_keys, inner, max_size=5), max_leaves=20
)


def _ordered(value: Any) -> Any:
    """The value with its dicts as item lists, so that key order takes part in the comparison."""
    if isinstance(value, dict):
        return [(k, _ordered(v)) for k, v in value.items()]
    if isinstance(value, list):
        return [_ordered(v) for v in value]
    return (type(value).__name__, value)


def test_values_read_back_as_jsonb_returns_them(fresh_database: str) -> None:
    with psycopg.connect(fresh_database, autocommit=True) as conn:

        @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
        @given(st.dictionaries(_keys, _values, max_size=6))
        def check(document: dict[str, Any]) -> None:
            text = json.dumps(document)
            stored = conn.execute("SELECT %s::jsonb", (text,)).fetchone()
            assert stored is not None
            assert _ordered(jsonb_value(text)) == _ordered(stored[0]), text

        check()


def test_duplicate_keys_keep_the_last_value_and_keys_sort_by_length_then_bytes(fresh_database: str) -> None:
    text = '{"bb": 1, "a": 2, "é": 3, "z": 4, "a": 5, "ab": 6}'
    with psycopg.connect(fresh_database, autocommit=True) as conn:
        stored = conn.execute("SELECT %s::jsonb", (text,)).fetchone()
    assert stored is not None
    assert list(jsonb_value(text).items()) == list(stored[0].items()) == [
        ("a", 5), ("z", 4), ("ab", 6), ("bb", 1), ("é", 3)
    ]  # fmt: skip
