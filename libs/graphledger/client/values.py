"""Pure helpers of the client: input checks, the split of channel values, and wire decoding."""

from __future__ import annotations

import json
import math
import re
import uuid
from typing import Any

from langgraph.checkpoint.base import CheckpointTuple, DeltaChannelHistory
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.types import _DeltaSnapshot

from graphledger.errors import InvalidInputError


def require_id(value: Any, what: str, *, allow_empty: bool = False) -> str:
    """An identifier as the string Postgres stores: ints and UUIDs become their string form.

    NUL cannot be stored in a Postgres text column, so it is refused here, before anything is published.
    """
    if value is None:
        raise InvalidInputError(f"{what} is required, got None")
    if isinstance(value, bool) or not isinstance(value, str | int | uuid.UUID):
        raise InvalidInputError(f"{what} must be a str, int or UUID, got {type(value).__name__}")
    text = str(value)
    if not text and not allow_empty:
        raise InvalidInputError(f"{what} must not be empty")
    if "\x00" in text:
        raise InvalidInputError(f"{what} {text!r} contains a NUL character (\\u0000), which Postgres cannot store")
    return text


def _inlinable(value: Any) -> bool:
    # What PostgresSaver keeps inline in the checkpoint jsonb, less what jsonb cannot hold: strings
    # with NUL and non-finite floats go to blobs instead, where they are opaque bytes.
    if value is None or isinstance(value, bool | int):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, str) and "\x00" not in value


def split_channel_values(values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(inline values for the checkpoint jsonb, values stored as blobs), as PostgresSaver splits them."""
    inline: dict[str, Any] = {}
    blobs: dict[str, Any] = {}
    for channel, value in values.items():
        if isinstance(value, _DeltaSnapshot):
            blobs[channel] = value
            inline[channel] = True  # the marker PostgresSaver leaves for a snapshot blob
        elif _inlinable(value):
            inline[channel] = value
        else:
            blobs[channel] = value
    return inline, blobs


# msgpack, the read API's wire format, holds integers in [-2**63, 2**64); jsonb would store larger
# ones, but no read could then return them.
_MIN_INT, _MAX_INT = -(2**63), 2**64 - 1
_LONG_DIGITS = re.compile(r"\d{20}")


def check_int_range(value: int, path: str) -> None:
    if not _MIN_INT <= value <= _MAX_INT:
        raise InvalidInputError(f"{path} is {value}, outside the 64-bit range the read API can return")


def _refuse_huge_ints(value: Any, path: str) -> None:
    if isinstance(value, int) and not isinstance(value, bool):
        check_int_range(value, path)
    elif isinstance(value, dict):
        for key, item in value.items():
            _refuse_huge_ints(item, f"{path}.{key}")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _refuse_huge_ints(item, f"{path}[{i}]")


def dump_json(value: Any, what: str) -> bytes:
    """JSON text as PostgresSaver's `Jsonb` writes it; refuses what Postgres jsonb would reject."""
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"{what} is not JSON-serializable: {exc}") from None
    if "\\u0000" in text:  # rare: walk the value to name where the NUL is (or find an escaped "\\u0000")
        _refuse_nul(value, what)
    if _LONG_DIGITS.search(text):  # rare: a 20-digit run may be an integer past 64 bits
        _refuse_huge_ints(value, what)
    return text.encode()


def _refuse_nul(value: Any, path: str) -> None:
    if isinstance(value, str):
        if "\x00" in value:
            raise InvalidInputError(f"{path} contains a NUL character (\\u0000), which Postgres jsonb rejects")
    elif isinstance(value, dict):
        for key, item in value.items():
            _refuse_nul(key, f"{path} key")
            _refuse_nul(item, f"{path}.{key}")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _refuse_nul(item, f"{path}[{i}]")


def _value(wire: dict[str, Any], serde: SerializerProtocol) -> Any:
    return serde.loads_typed((wire["t"], wire["b"])) if "t" in wire else wire["v"]


def decode_tuple(raw: dict[str, Any] | None, serde: SerializerProtocol) -> CheckpointTuple | None:
    if raw is None:
        return None
    checkpoint = raw["checkpoint"]
    channel_values = {k: _value(v, serde) for k, v in checkpoint.get("channel_values", {}).items()}
    return CheckpointTuple(
        raw["config"] if "configurable" in raw["config"] else {"configurable": raw["config"]},
        {**checkpoint, "channel_values": channel_values},
        raw["metadata"],
        _parent(raw.get("parent_config")),
        [(task_id, channel, _value(v, serde)) for task_id, channel, v in raw.get("pending_writes") or []],
    )


def _parent(config: dict[str, Any] | None) -> dict[str, Any] | None:
    if not config:
        return None
    return config if "configurable" in config else {"configurable": config}


def decode_delta_history(raw: dict[str, Any], serde: SerializerProtocol) -> dict[str, DeltaChannelHistory]:
    history: dict[str, DeltaChannelHistory] = {}
    for channel, entry in raw.items():
        decoded: DeltaChannelHistory = {
            "writes": [(task_id, ch, _value(v, serde)) for task_id, ch, v in entry.get("writes", [])]
        }
        if "seed" in entry:
            decoded["seed"] = _value(entry["seed"], serde)
        history[channel] = decoded
    return history
