"""The store's filter language, defined once: the client checks a search filter before sending it,
the read API when it arrives, and the read API's SQL builder takes its operators from here.

A filter maps field names to conditions, as LangGraph's stores read them:
- a JSON value matches an equal value; a dict without `$` keys matches field by field, a list
  element by element (each field or element is a condition again);
- a dict with any `$` key is an operator dict: every key must be an operator, and all must hold.
  `$eq` and `$ne` take any JSON value; `$gt`, `$gte`, `$lt` and `$lte` a number or a string.
How each condition matches a stored value: docs/architecture.md, "Store".

Refused besides: what Postgres jsonb or the read API's msgpack cannot carry (text with NUL or a lone
surrogate, non-finite numbers, integers outside 64 bits, keys that are not strings, other types),
and nesting deeper than `MAX_DEPTH`: each level of a field-by-field match is SQL the read API builds.
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

from graphledger.errors import InvalidFilterError
from graphledger.pg_text import MAX_INT, MIN_INT, unstorable

EQUALITY_OPERATORS: Final = ("$eq", "$ne")
RANGE_OPERATORS: Final[Mapping[str, str]] = MappingProxyType({"$gt": ">", "$gte": ">=", "$lt": "<", "$lte": "<="})
"""Each range operator with the order it tests: numbers numerically, strings by code point."""
OPERATORS: Final = (*EQUALITY_OPERATORS, *RANGE_OPERATORS)

MAX_DEPTH: Final = 32
"""Deepest nesting below a field, operands included."""

_shown = reprlib.Repr()
"""A refused value in a message: at most 3 levels, 6 items each and 60 characters of any one text."""
_shown.maxlevel, _shown.maxlist, _shown.maxtuple, _shown.maxdict = 3, 6, 6, 6
_shown.maxstring = _shown.maxother = _shown.maxlong = 60


def is_operator_dict(condition: Mapping[Any, Any]) -> bool:
    """Whether a dict condition holds operators (any `$` key) rather than fields to match."""
    return any(isinstance(k, str) and k.startswith("$") for k in condition)


def check_filter(filter: Any) -> dict[str, Any] | None:
    """`filter` itself when it is in the language; else `InvalidFilterError` naming where and what."""
    if filter is None:
        return None
    if not isinstance(filter, dict):
        raise _refused("filter", filter, "not a dict of field names to conditions")
    for field, condition in filter.items():
        _check_key(field, "filter")
        _check_condition(condition, f"filter.{field}", 0)
    return filter


def _check_condition(value: Any, path: str, depth: int, *, operand: bool = False) -> None:
    """A condition, or with `operand` the value an operator compares with: any JSON value, whose `$`
    keys are data, not operators."""
    _check_depth(value, path, depth)
    if isinstance(value, dict):
        if not operand and is_operator_dict(value):
            for operator, compared in value.items():
                _check_operator(operator, compared, path, depth)
            return
        for key, item in value.items():
            _check_key(key, path)
            _check_condition(item, f"{path}.{key}", depth + 1, operand=operand)
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _check_condition(item, f"{path}[{i}]", depth + 1, operand=operand)
    else:
        _check_scalar(value, path)


def _check_operator(operator: Any, operand: Any, path: str, depth: int) -> None:
    if operator not in OPERATORS:
        raise InvalidFilterError(
            path, operator, f"Unsupported operator: {operator!r} in {path}; supported: {', '.join(OPERATORS)}"
        )
    where = f"{path}.{operator}"
    if operator in RANGE_OPERATORS and (isinstance(operand, bool) or not isinstance(operand, int | float | str)):
        raise _refused(where, operand, "a range operator compares with a number or a string")
    _check_condition(operand, where, depth + 1, operand=True)


def _check_depth(value: Any, path: str, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise _refused(path, value, f"nests deeper than {MAX_DEPTH} levels")


def _check_key(key: Any, path: str) -> None:
    if not isinstance(key, str):
        raise InvalidFilterError(path, key, f"{path} has a key {_shown.repr(key)}: not a string")
    if reason := unstorable(key):
        raise InvalidFilterError(path, key, f"{path} has a key {_shown.repr(key)}: {reason}")


def _check_scalar(value: Any, path: str) -> None:
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, str):
        if reason := unstorable(value):
            raise _refused(path, value, reason)
    elif isinstance(value, int):
        if not MIN_INT <= value <= MAX_INT:
            raise _refused(path, value, "outside the 64-bit integer range")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise _refused(path, value, "not a finite number, which JSON cannot hold")
    else:
        raise _refused(path, value, f"a {type(value).__name__}, not a JSON value")


def _refused(path: str, value: Any, reason: str) -> InvalidFilterError:
    return InvalidFilterError(path, value, f"{path} is {_shown.repr(value)}: {reason}")
