"""JSON text as Postgres jsonb gives it back: what a read of the projection returns for checkpoint
and metadata JSON the client wrote, computed without the round trip.

The client answers some reads from its own not-yet-projected writes (`own_writes.py`); those answers
must be the ones the projection will give, which is the value after jsonb:
- object keys in jsonb's order: shorter keys first, keys of one length by their UTF-8 bytes; a key
  given twice keeps its last value;
- numbers as `numeric` prints them, read back as JSON: the digits after the decimal point that the
  text implies (`1e-05` prints `0.00001`), none for an exponent that leaves none (`1e+16` prints
  `10000000000000000`, an integer once read), and no negative zero.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import orjson


def jsonb_value(text: bytes | str) -> Any:
    """The value a jsonb column holding `text` reads back as (through `json.loads`)."""
    try:
        parsed = orjson.loads(text)
    except orjson.JSONDecodeError:  # what orjson refuses and json takes (a lone surrogate escape)
        return json.loads(text, object_pairs_hook=_object, parse_float=_number)
    return _normalized(parsed)


def _normalized(value: Any) -> Any:
    """A parsed value as jsonb gives it back (parsing with orjson and normalizing is the fast way)."""
    if isinstance(value, dict):
        if all(key.isascii() for key in value):
            return {key: _normalized(value[key]) for key in sorted(value, key=_ascii_order)}
        return {key: _normalized(value[key]) for key in sorted(value, key=_key_order)}
    if isinstance(value, list):
        return [_normalized(item) for item in value]
    if isinstance(value, float):
        return _number(repr(value))  # a float's shortest repr is the token json.dumps wrote
    return value


def _ascii_order(key: str) -> tuple[int, str]:
    return len(key), key


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    last = dict(pairs)
    return {key: last[key] for key in sorted(last, key=_key_order)}


def _key_order(key: str) -> tuple[int, bytes]:
    raw = key.encode("utf-8")
    return len(raw), raw


def _number(token: str) -> int | float:
    """A JSON number with a fraction or an exponent (integers come back as written)."""
    printed = format(Decimal(token), "f")
    if printed.startswith("-") and not Decimal(printed):  # numeric has no negative zero
        printed = printed[1:]
    number: int | float = json.loads(printed)
    return number
