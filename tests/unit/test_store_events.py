"""Store events through the envelope alone: they round-trip, their Kafka key is namespace and key, and an
invalid payload is refused naming the field. What the client publishes is `test_store_client.py`."""

from __future__ import annotations

import json
import math
import uuid
from typing import Any

import pytest

from graphledger.embeddings import HashEmbedder
from graphledger.errors import InvalidEventError
from graphledger.events import store_event, to_envelope
from graphledger.events.envelope import decode, encode, new_envelope
from graphledger.events.store import StoreDelete, StorePut, store_key

DIMS = 64


def _put(**overrides: Any) -> StorePut:
    fields: dict[str, Any] = {
        "namespace": ("users", "u1", "memories"),
        "item_key": "k1",
        "value_json": json.dumps({"text": "I like pizza", "n": 1}).encode(),
        "ttl_minutes": 5.0,
        "vectors": (("text", (0.5, -0.25, 1.0)), ("tags[*].0", (1.0, 0.0, 0.0))),
    }
    return StorePut(**{**fields, **overrides})


@pytest.mark.parametrize(
    "event",
    [
        _put(),
        _put(vectors=None, ttl_minutes=None),
        _put(vectors=()),
        _put(item_key="", value_json=json.dumps({"é": "ü\u2028"}, ensure_ascii=False).encode()),
        StoreDelete(("a",), "k"),
    ],
)
def test_store_events_round_trip_through_the_envelope(event: StorePut | StoreDelete) -> None:
    decoded = store_event(decode(encode(to_envelope(event))))
    assert decoded == event
    assert decoded.key == event.key == store_key(event.namespace, event.item_key)


def test_the_kafka_key_is_namespace_and_key_with_separators() -> None:
    assert _put().key == "users\x1fu1\x1fmemories\x1ek1"
    assert StoreDelete(("a",), "b.c").key == "a\x1eb.c"
    assert _put().to_payload()["vectors"] == [["text", [0.5, -0.25, 1.0]], ["tags[*].0", [1.0, 0.0, 0.0]]]


_GOOD = _put().to_payload()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"namespace": []}, "namespace"),
        ({"namespace": "users"}, "namespace"),
        ({"namespace": ["a.b"]}, "namespace label 'a.b'"),
        ({"namespace": ["a", ""]}, "namespace label ''"),
        ({"namespace": ["a\x00"]}, "namespace label"),
        ({"namespace": ["a", 1]}, "namespace label 1"),
        ({"key": None}, "key None"),
        ({"key": "a\x00"}, "key"),
        ({"value": "{}"}, "value is a str, not bytes"),
        ({"value": b"{not json"}, "value is not UTF-8 JSON"),
        ({"value": b"\xff\xfe"}, "value is not UTF-8 JSON"),
        ({"value": b"[1, 2]"}, "value is a JSON list, not an object"),
        ({"value": b'{"a": "x\\u0000y"}'}, r"value\.a contains a NUL"),
        ({"value": b'{"a\\u0000": 1}'}, "value key .* contains a NUL"),
        ({"value": b'{"a": "\\ud800"}'}, "lone surrogate"),
        ({"value": b'{"a": NaN}'}, "NaN"),
        ({"value": b'{"a": [1, Infinity]}'}, "Infinity"),
        ({"ttl_minutes": float("nan")}, "ttl_minutes nan"),
        ({"ttl_minutes": True}, "ttl_minutes True"),
        ({"ttl_minutes": "5"}, "ttl_minutes '5'"),
        ({"vectors": {"text": [1.0]}}, "vectors is a dict"),
        ({"vectors": [["text"]]}, "vectors row"),
        ({"vectors": [[1, [1.0]]]}, "vector field path 1"),
        ({"vectors": [["text", [1.0, float("nan")]]]}, "holds nan"),
        ({"vectors": [["text", [float("inf")]]]}, "holds inf"),
        ({"vectors": [["text", [True]]]}, "holds True"),
        ({"vectors": [["text", []]]}, "not a non-empty list"),
        ({"vectors": [["text", [1.0]], ["text", [2.0]]]}, "'text' appears twice"),
        ({"vectors": [["a", [1.0]], ["b", [1.0, 2.0]]]}, "has 2 dims"),
    ],
)
def test_invalid_store_put_payloads_name_the_field(change: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidEventError, match=message):
        store_event(new_envelope(StorePut.TYPE, {**_GOOD, **change}))


def test_invalid_store_delete_and_unknown_type_are_refused() -> None:
    with pytest.raises(InvalidEventError, match="namespace"):
        store_event(new_envelope(StoreDelete.TYPE, {"key": "k"}))
    with pytest.raises(InvalidEventError, match=r"unknown store event type 'store\.nope'"):
        store_event(new_envelope("store.nope", {}))


def test_hash_embedder_vectors_in_events_are_finite_and_unit_length() -> None:
    vector = HashEmbedder(DIMS).embed_query(str(uuid.uuid4()))
    assert all(math.isfinite(x) for x in vector)
    assert math.isclose(sum(x * x for x in vector), 1.0, rel_tol=1e-9)
