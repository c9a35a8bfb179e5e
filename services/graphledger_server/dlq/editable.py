"""The editable JSON form of msgpack values: each bytes value is `{"$text": "..."}` when it is UTF-8
(JSON text, ids) and `{"$hex": "..."}` otherwise, so `dlq show --payload > fix.json`, an edit, and
`dlq replay --payload-file fix.json` round-trip exactly."""

from __future__ import annotations

from typing import Any


def to_editable(value: Any) -> Any:
    """A msgpack value as JSON: bytes as `{"$text": ...}` (UTF-8) or `{"$hex": ...}`."""
    if isinstance(value, bytes):
        try:
            return {"$text": value.decode("utf-8")}
        except UnicodeDecodeError:
            return {"$hex": value.hex()}
    if isinstance(value, dict):
        return {str(k): to_editable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_editable(v) for v in value]
    return value


def from_editable(value: Any) -> Any:
    """The inverse of `to_editable`."""
    if isinstance(value, dict):
        if len(value) == 1 and "$text" in value and isinstance(value["$text"], str):
            return value["$text"].encode("utf-8")
        if len(value) == 1 and "$hex" in value and isinstance(value["$hex"], str):
            return bytes.fromhex(value["$hex"])
        return {k: from_editable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_editable(v) for v in value]
    return value
