"""What Postgres text and jsonb cannot hold, checked in one place for client, events and read API.

`json_problem` adds what the read API could not return from a jsonb column: its JSON and msgpack
encoders hold integers in [-2**63, 2**64) and stop at 255 levels of nesting (answers wrap a value a
few levels deep), so deeper or larger values must be refused before they are stored.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

MAX_JSON_DEPTH = 200
"""Deepest nesting of a checkpoint, its metadata, a store value or a filter."""
MIN_INT, MAX_INT = -(2**63), 2**64 - 1


def unstorable(text: str) -> str | None:
    """Why Postgres cannot store `text` (a NUL, or a lone surrogate that is not UTF-8), or None."""
    if "\x00" in text:
        return "contains a NUL character (\\u0000)"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone surrogate"
    return None


def json_problem(value: Any, path: str, depth: int = 0) -> str | None:
    """Why `value` (decoded JSON) cannot be stored in jsonb and read back, naming where; or None."""
    if depth > MAX_JSON_DEPTH:
        return f"{path} nests deeper than {MAX_JSON_DEPTH} levels"
    if isinstance(value, str):
        return f"{path} {reason}" if (reason := unstorable(value)) else None
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return None if MIN_INT <= value <= MAX_INT else f"{path} is {value}, outside the 64-bit integer range"
    if isinstance(value, float):
        if not math.isfinite(value):
            return f"{path} is {value!r}, which JSON cannot hold"
        # jsonb keeps a number as a decimal, and reads 1e16 and above back as integers.
        return f"{path} is {value!r}, an integer past 64 bits once in jsonb" if abs(value) >= 2**63 else None
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str | int | float | bool | None):  # json.dumps makes strings of these
                return f"{path} has a key {key!r} that is not a string"
            if isinstance(key, str) and (reason := unstorable(key)):
                return f"{path} key {key!r} {reason}"
            if problem := json_problem(item, f"{path}.{key}", depth + 1):
                return problem
        return None
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            if problem := json_problem(item, f"{path}[{i}]", depth + 1):
                return problem
        return None
    return f"{path} is a {type(value).__name__}, which is not JSON-serializable"


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def json_text_problem(raw: bytes, what: str) -> str | None:
    """Why the JSON text `raw` is no JSON object jsonb can hold and the read API return; or None."""
    try:
        value = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except RecursionError:
        return f"{what} nests too deep to parse"
    except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return f"{what} is not UTF-8 JSON text: {exc}"
    if not isinstance(value, dict):
        return f"{what} is a JSON {type(value).__name__}, not an object"
    return json_problem(value, what)


# A number token (after `:`, `,` or `[`) that may not fit: 19 digits or more (-(2**63) - 1 has 19),
# an exponent (Python prints floats of 1e16 and above with one), NaN or Infinity. Digit runs inside
# strings do not count: LangGraph's channel versions are 32-digit strings in every checkpoint.
_RISKY_NUMBER = re.compile(rb"[:\[,]\s*-?(?:\d{19}|\d[\d.]*[eE]|NaN|Infinity)")


def json_text_suspect(raw: bytes) -> bool:
    """Whether JSON text shows a sign `json_text_problem` may find (a surrogate escape, a risky number,
    more brackets than `MAX_JSON_DEPTH`): a cheap test that spares parsing the usual text."""
    return (
        b"\\ud" in raw
        or b"\\uD" in raw
        or bool(_RISKY_NUMBER.search(raw))
        or (raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH)
    )


MAX_INDEX_KEY_BYTES = 2400
"""Longest UTF-8 text one primary-key row may hold: Postgres caps a btree index row at 2704 bytes, and
an event whose key does not fit would be dead-lettered after the client was told it was written."""


def index_key_problem(what: str, *parts: str) -> str | None:
    """Why texts that share one primary-key row are too long for its btree index, or None."""
    size = sum(len(p.encode("utf-8", "surrogatepass")) for p in parts)
    if size > MAX_INDEX_KEY_BYTES:
        return f"{what} take {size} bytes together; Postgres indexes at most {MAX_INDEX_KEY_BYTES}"
    return None
