"""Store-topic events: what a `KafkaStore` write publishes and the projector applies.

Values travel as the JSON text of the item's dict (the projector hands it to jsonb as is). Vectors
are computed by the client before publishing, so replaying the topic never calls an embedding API
again. Every event is keyed by namespace + key, so one item's events keep their order on one
partition; the item's timestamps come from the envelope's producer time, so a replay writes the
same rows.

`from_payload` validates what Postgres would otherwise reject in the middle of a batch (bad JSON,
NUL characters, non-finite floats, duplicate vector rows), or what the read API could not return
(integers past 64 bits, deep nesting), so such an event is dead-lettered instead of failing every
event applied with it or every read of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from graphledger.errors import InvalidEventError
from graphledger.events.envelope import MAX_EPOCH_MS
from graphledger.events.erasure import NamespaceErase, TenantErase
from graphledger.pg_text import json_text_problem

MAX_TTL_MINUTES = 2**31 - 1
"""`store.ttl_minutes` is an INT (int4), as in the official layout."""

NAMESPACE_SEPARATOR = "\x1f"
KEY_SEPARATOR = "\x1e"

Vector = tuple[str, tuple[float, ...]]
"""One vector row of an item: `(field_path, embedding)`, as `store_vectors` stores it."""


def store_key(namespace: tuple[str, ...], item_key: str) -> str:
    """The Kafka key of an item's events: `"\\x1f".join(namespace) + "\\x1e" + key`."""
    return NAMESPACE_SEPARATOR.join(namespace) + KEY_SEPARATOR + item_key


@dataclass(frozen=True, slots=True)
class StorePut:
    """`put`: insert or replace one item.

    `vectors` None means the item is not indexed by this put; a tuple (maybe empty) replaces every
    vector row of the item. `item_key` is the item's key; `key` is the Kafka key.
    """

    TYPE: ClassVar[str] = "store.put"
    namespace: tuple[str, ...]
    item_key: str
    value_json: bytes
    """The item's value (a dict) as UTF-8 JSON text."""
    ttl_minutes: float | None
    vectors: tuple[Vector, ...] | None
    created_ms: int | None = None
    """The item's `created_at` (ms) when the put creates it; None: the envelope's producer time. Set
    by `graphledger import`, which carries an existing item's original creation time."""

    @property
    def key(self) -> str:
        return store_key(self.namespace, self.item_key)

    def to_payload(self) -> dict[str, Any]:
        payload = {
            "namespace": list(self.namespace),
            "key": self.item_key,
            "value": self.value_json,
            "ttl_minutes": self.ttl_minutes,
            "vectors": None if self.vectors is None else [[path, list(vec)] for path, vec in self.vectors],
        }
        if self.created_ms is not None:  # absent rather than null: a client's put encodes as at version 1
            payload["created_ms"] = self.created_ms
        return payload

    @classmethod
    def from_payload(cls, p: dict[str, Any]) -> StorePut:
        value = p.get("value")
        if not isinstance(value, bytes):
            raise InvalidEventError(f"value is a {type(value).__name__}, not bytes")
        _check_value_json(value)
        return cls(
            _namespace(p),
            _item_key(p),
            value,
            _ttl_minutes(p.get("ttl_minutes")),
            _vectors(p.get("vectors")),
            _created_ms(p.get("created_ms")),
        )


@dataclass(frozen=True, slots=True)
class StoreDelete:
    """`delete`: the item and all its vectors."""

    TYPE: ClassVar[str] = "store.delete"
    namespace: tuple[str, ...]
    item_key: str

    @property
    def key(self) -> str:
        return store_key(self.namespace, self.item_key)

    def to_payload(self) -> dict[str, Any]:
        return {"namespace": list(self.namespace), "key": self.item_key}

    @classmethod
    def from_payload(cls, p: dict[str, Any]) -> StoreDelete:
        return cls(_namespace(p), _item_key(p))


@dataclass(frozen=True, slots=True)
class StoreRefresh:
    """A read with `refresh_ttl`: the item's TTL restarts at the envelope's producer time.

    Applies only to an item that has a TTL and is still live at that time; it never shortens a
    lifetime. Published by the reading client, coalesced per item (`store_refresh_coalesce_s`).
    """

    TYPE: ClassVar[str] = "store.refresh"
    namespace: tuple[str, ...]
    item_key: str

    @property
    def key(self) -> str:
        return store_key(self.namespace, self.item_key)

    def to_payload(self) -> dict[str, Any]:
        return {"namespace": list(self.namespace), "key": self.item_key}

    @classmethod
    def from_payload(cls, p: dict[str, Any]) -> StoreRefresh:
        return cls(_namespace(p), _item_key(p))


@dataclass(frozen=True, slots=True)
class StoreExpire:
    """The sweeper's expiry of one item, conditional: it deletes the item only if the item's
    `expires_at` is still at or before `at_ms` when the event applies, so a put or refresh that
    landed after the sweeper's decision keeps the item.
    """

    TYPE: ClassVar[str] = "store.expire"
    namespace: tuple[str, ...]
    item_key: str
    at_ms: int
    """The sweeper's decision time (ms since the epoch): what counts as expired."""

    @property
    def key(self) -> str:
        return store_key(self.namespace, self.item_key)

    def to_payload(self) -> dict[str, Any]:
        return {"namespace": list(self.namespace), "key": self.item_key, "at_ms": self.at_ms}

    @classmethod
    def from_payload(cls, p: dict[str, Any]) -> StoreExpire:
        return cls(_namespace(p), _item_key(p), epoch_ms(p.get("at_ms"), "at_ms"))


StoreEvent = StorePut | StoreDelete | StoreRefresh | StoreExpire | NamespaceErase | TenantErase

STORE_EVENT_TYPES: dict[str, type[StoreEvent]] = {
    cls.TYPE: cls for cls in (StorePut, StoreDelete, StoreRefresh, StoreExpire, NamespaceErase, TenantErase)
}


def epoch_ms(value: Any, name: str) -> int:
    """A time carried in a payload, in ms since the epoch, within what a timestamptz holds."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_EPOCH_MS:
        raise InvalidEventError(f"{name} {value!r} is not a time in ms between 1970 and 9999")
    return value


# -- validation helpers: each names the field and the bad value ------------------------------------


def _namespace(p: dict[str, Any]) -> tuple[str, ...]:
    labels = p.get("namespace")
    if not isinstance(labels, list) or not labels:
        raise InvalidEventError(f"namespace {labels!r} is not a non-empty list")
    for label in labels:
        # The projection stores ".".join(namespace): a label with "." would address another namespace.
        if not isinstance(label, str) or not label or "." in label or "\x00" in label:
            raise InvalidEventError(f"namespace label {label!r} is not a non-empty string without '.' or NUL")
    return tuple(labels)


def _item_key(p: dict[str, Any]) -> str:
    key = p.get("key")
    if not isinstance(key, str) or "\x00" in key:
        raise InvalidEventError(f"key {key!r} is not a string without NUL")
    return key


def _ttl_minutes(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidEventError(f"ttl_minutes {value!r} is not a finite number or null")
    return float(value)


def _created_ms(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidEventError(f"created_ms {value!r} is not a non-negative integer or null")
    return value


def _vectors(rows: Any) -> tuple[Vector, ...] | None:
    if rows is None:
        return None
    if not isinstance(rows, list):
        raise InvalidEventError(f"vectors is a {type(rows).__name__}, not a list or null")
    vectors: list[Vector] = []
    seen: set[str] = set()
    dims: int | None = None
    for row in rows:
        if not isinstance(row, list) or len(row) != 2:
            # The row's shape, never its content (embeddings are derived from the item's value).
            shape = f"a list of {len(row)}" if isinstance(row, list) else f"a {type(row).__name__}"
            raise InvalidEventError(f"vectors row {len(vectors)} is {shape}, not a list of 2")
        path, embedding = row
        if not isinstance(path, str) or "\x00" in path:
            raise InvalidEventError(f"vector field path {path!r} is not a string without NUL")
        if path in seen:
            raise InvalidEventError(f"vector field path {path!r} appears twice")
        seen.add(path)
        if not isinstance(embedding, list) or not embedding:
            raise InvalidEventError(f"vector of {path!r} is not a non-empty list")
        for x in embedding:
            if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x):
                raise InvalidEventError(f"vector of {path!r} holds {x!r}, not a finite number")
        if dims is not None and len(embedding) != dims:
            raise InvalidEventError(f"vector of {path!r} has {len(embedding)} dims, the item's others {dims}")
        dims = len(embedding)
        vectors.append((path, tuple(float(x) for x in embedding)))
    return tuple(vectors)


def _check_value_json(value: bytes) -> None:
    if problem := json_text_problem(value, "value"):
        raise InvalidEventError(problem)
