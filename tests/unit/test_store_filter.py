"""The store filter language (`graphledger.store_filter`): the client and the read API accept and
refuse the same filters, and a refusal names the path and the bad value."""

from __future__ import annotations

from typing import Any

import ormsgpack
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from langgraph.store.base import SearchOp as LangGraphSearchOp
from pydantic import ValidationError

from graphledger.client.store_values import prepare
from graphledger.errors import InvalidFilterError, InvalidInputError
from graphledger.store_filter import MAX_DEPTH, OPERATORS, check_filter
from graphledger_server.api.store_models import SearchOp
from hostile import SPECIAL_TEXT, ints, nest

# Hostile text short enough for hypothesis to show in a report (SPECIAL_TEXT's 100 kB one is not).
texts = st.one_of(
    st.sampled_from([t for t in SPECIAL_TEXT if len(t) < 100]),
    st.text(st.characters(exclude_categories=()), max_size=8),
)
scalars = st.one_of(st.none(), st.booleans(), ints, st.floats(), texts)
keys = st.one_of(texts, st.sampled_from([*OPERATORS, "$in", "$"]), st.integers(0, 2))
operands = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=3), max_leaves=6
)
operator_keys = st.sampled_from([*OPERATORS, "$in", "$regex", "b", 1])
operator_dicts = st.dictionaries(operator_keys, operands, min_size=1, max_size=3)
conditions = st.recursive(
    st.one_of(operands, operator_dicts),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=3),
    max_leaves=8,
)
filters = st.one_of(st.dictionaries(keys, conditions, max_size=3), scalars, st.lists(scalars, max_size=2))


def client_accepts(filter: Any) -> bool:
    try:
        prepare(LangGraphSearchOp(("ns",), filter), index_fields=None)
    except InvalidInputError:
        return False
    return True


def server_accepts(filter: Any) -> bool:
    """Whether the read API's request model takes the filter as it arrives: through msgpack, as the
    client sends it, or as it is where msgpack cannot carry it (a JSON body could)."""
    try:
        filter = ormsgpack.unpackb(ormsgpack.packb(filter))
    except TypeError:
        pass
    try:
        SearchOp.model_validate({"op": "search", "namespace_prefix": ["ns"], "filter": filter})
    except ValidationError:
        return False
    return True


@settings(max_examples=400, deadline=None)
@given(filter=filters)
@example(filter={"a": {"$gt": [1]}})
@example(filter={"a": {"$lte": True}})
@example(filter={"a": {"$gte": None}})
@example(filter={"a": {"$eq": {1: "x"}}})
@example(filter={"a": {"$ne": 2**64}})
@example(filter={"a": {"b": {"$eq": nest(MAX_DEPTH - 3)}}})
@example(filter={"a": {"b": {"$eq": nest(MAX_DEPTH - 2)}}})
@example(filter={"a": nest(MAX_DEPTH)})
@example(filter={"a": nest(MAX_DEPTH + 1)})
@example(filter={"a": nest(10_000)})
@example(filter={"a": ("x", {"$lt": "y"})})
def test_client_and_read_api_accept_and_refuse_the_same_filters(filter: Any) -> None:
    accepted = client_accepts(filter)
    assert accepted == server_accepts(filter)
    if accepted:
        ormsgpack.packb(filter)  # what the client accepts it can send


@pytest.mark.parametrize(
    ("filter", "path", "value", "message"),
    [
        ({"a": {"$gt": [1]}}, "filter.a.$gt", [1], r"filter\.a\.\$gt is \[1\]: .* a number or a string"),
        ({"a": {"$lt": True}}, "filter.a.$lt", True, r"filter\.a\.\$lt is True"),
        ({"a": {"$in": [1]}}, "filter.a", "$in", r"Unsupported operator: '\$in' in filter\.a; supported: \$eq, "),
        ({"a": {"$gt": 1, "b": 2}}, "filter.a", "b", r"Unsupported operator: 'b' in filter\.a"),
        ({"a": [{"b": "x\x00"}]}, "filter.a[0].b", "x\x00", r"filter\.a\[0\]\.b is 'x\\x00': contains a NUL"),
        ({"a": {"$eq": float("nan")}}, "filter.a.$eq", None, r"filter\.a\.\$eq is nan"),
        ({"a": {"b\ud800": 1}}, "filter.a", "b\ud800", r"filter\.a has a key 'b\\ud800': contains a lone surrogate"),
        ({"a": {"$ne": {2: 1}}}, "filter.a.$ne", 2, r"filter\.a\.\$ne has a key 2: not a string"),
        ({"a": 2**64}, "filter.a", 2**64, r"filter\.a is 18446744073709551616: outside the 64-bit"),
        ({"a": nest(MAX_DEPTH + 1)}, "filter.a", None, rf"nests deeper than {MAX_DEPTH} levels"),
        ({1: "a"}, "filter", 1, r"filter has a key 1: not a string"),
        ("a=1", "filter", "a=1", r"filter is 'a=1': not a dict"),
    ],
)
def test_a_refusal_names_the_path_and_the_bad_value(filter: Any, path: str, value: Any, message: str) -> None:
    with pytest.raises(InvalidFilterError, match=message) as refused:
        check_filter(filter)
    assert refused.value.path.startswith(path)
    if value is not None:
        assert refused.value.value == value


def test_the_client_refuses_a_range_operator_on_a_list_before_sending() -> None:
    with pytest.raises(InvalidInputError, match=r"filter\.a\.\$gt is \[1\]"):
        prepare(LangGraphSearchOp(("ns",), {"a": {"$gt": [1]}}), index_fields=None)


def test_the_read_api_refuses_it_too() -> None:
    with pytest.raises(ValidationError, match=r"filter\.a\.\$gt is \[1\]"):
        SearchOp.model_validate({"op": "search", "namespace_prefix": ["ns"], "filter": {"a": {"$gt": [1]}}})


def test_a_valid_filter_is_returned_as_it_is() -> None:
    filter = {"a": {"$gte": 1, "$lt": "z"}, "b": [1, {"c": None}], "d": {"e": {"$ne": [1, {"f": 2}]}}}
    assert check_filter(filter) is filter
    assert check_filter(None) is None
