"""Hostile store values, namespaces and keys through the event codec alone: each put either round-trips
through the envelope exactly or is refused with a clear validation error. The same input through the
client, the projector and the read API is `acceptance/test_hostile_input.py`."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from graphledger.errors import InvalidEventError
from graphledger.events import envelope, to_envelope
from graphledger.events.store import StorePut
from hostile import HOSTILE, assert_clear, json_values, texts


@HOSTILE
@given(namespace=st.lists(texts, min_size=1, max_size=3), key=texts, value=json_values, ttl=st.floats() | st.none())
def test_store_events_round_trip_or_are_invalid(namespace: list[str], key: str, value: Any, ttl: float | None) -> None:
    try:
        raw = json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")
    except (RecursionError, ValueError):
        raw = b"[" * 10_000
    event = StorePut(tuple(namespace), key, raw, ttl, None)
    try:
        record = envelope.encode(to_envelope(event))
    except TypeError as exc:  # what msgpack cannot carry (lone surrogates) never leaves the producer
        assert "surrogates" in str(exc)
        return
    try:
        back = StorePut.from_payload(envelope.decode(record).payload)
    except InvalidEventError as exc:
        assert_clear(exc)
        return
    assert back == event
    assert isinstance(json.loads(back.value_json), dict)
