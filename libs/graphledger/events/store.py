"""Store-topic events: what a `KafkaStore` write publishes and the projector applies.

Values travel as the JSON text of the item's dict (the projector hands it to jsonb as is). Vectors
are computed by the client before publishing, so replaying the topic never calls an embedding API
again. Every event is keyed by namespace + key, so one item's events keep their order on one
partition; the item's timestamps come from the envelope's producer time, so a replay writes the
same rows.

Each payload follows its event's fields (`codec.py`). Decoding refuses what Postgres would otherwise
reject in the middle of a batch (bad JSON, NUL characters, non-finite floats, duplicate vector rows),
or what the read API could not return (integers past 64 bits, deep nesting), so such an event is
dead-lettered instead of failing every event applied with it or every read of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from graphledger.errors import InvalidEventError
from graphledger.events.codec import (
    EPOCH_MS,
    Bytes,
    EventPayload,
    Integer,
    Kind,
    Nullable,
    Number,
    Text,
    payload_codec,
    wire,
)
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
class Namespace(Kind):
    """A namespace: a non-empty list of labels, each non-empty, without NUL, and without '.', since the
    projection stores `".".join(namespace)` and a label with "." would address another namespace."""

    def decode(self, value: Any, name: str) -> tuple[str, ...]:
        if not isinstance(value, list) or not value:
            raise InvalidEventError(f"{name} {value!r} is not a non-empty list")
        for label in value:
            if not isinstance(label, str) or not label or "." in label or "\x00" in label:
                raise InvalidEventError(f"{name} label {label!r} is not a non-empty string without '.' or NUL")
        return tuple(value)

    def encode(self, value: tuple[str, ...]) -> list[str]:
        return list(value)


_BYTES = Bytes()


@dataclass(frozen=True, slots=True)
class JsonObject(Kind):
    """A JSON object as UTF-8 text, with nothing jsonb or the read API cannot hold (`pg_text`)."""

    def decode(self, value: Any, name: str) -> bytes:
        text = _BYTES.decode(value, name)
        if problem := json_text_problem(text, name):
            raise InvalidEventError(problem)
        return text


@dataclass(frozen=True, slots=True)
class Vectors(Kind):
    """An item's vector rows, or None (not indexed): `[[field_path, [float, ...]], ...]`, each path once,
    every embedding finite, non-empty and of the item's one length."""

    def decode(self, value: Any, name: str) -> tuple[Vector, ...] | None:
        if value is None:
            return None
        if not isinstance(value, list):
            raise InvalidEventError(f"{name} is a {type(value).__name__}, not a list or null")
        vectors: list[Vector] = []
        seen: set[str] = set()
        dims: int | None = None
        for row in value:
            if not isinstance(row, list) or len(row) != 2:
                # The row's shape, never its content (embeddings are derived from the item's value).
                shape = f"a list of {len(row)}" if isinstance(row, list) else f"a {type(row).__name__}"
                raise InvalidEventError(f"{name} row {len(vectors)} is {shape}, not a list of 2")
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

    def encode(self, value: tuple[Vector, ...] | None) -> list[list[Any]] | None:
        return None if value is None else [[path, list(vec)] for path, vec in value]


@dataclass(frozen=True, slots=True)
class ItemEvent(EventPayload):
    """An event of one item, keyed by its namespace and key, so the item's events keep their order."""

    namespace: tuple[str, ...] = field(metadata=wire(kind=Namespace()))
    item_key: str = field(metadata=wire("key", kind=Text(nul_apart=False)))
    """The item's key; `key` is the Kafka key."""

    @property
    def key(self) -> str:
        return store_key(self.namespace, self.item_key)


@payload_codec
@dataclass(frozen=True, slots=True)
class StorePut(ItemEvent):
    """`put`: insert or replace one item.

    `vectors` None means the item is not indexed by this put; a tuple (maybe empty) replaces every
    vector row of the item.
    """

    TYPE: ClassVar[str] = "store.put"
    value_json: bytes = field(metadata=wire("value", kind=JsonObject()))
    """The item's value (a dict) as UTF-8 JSON text."""
    ttl_minutes: float | None = field(metadata=wire(kind=Nullable(Number("a finite number or null"))))
    vectors: tuple[Vector, ...] | None = field(metadata=wire(kind=Vectors()))
    created_ms: int | None = field(
        default=None, metadata=wire(kind=Nullable(Integer(0, expected="a non-negative integer or null")), omitted=True)
    )
    """The item's `created_at` (ms) when the put creates it; None: the envelope's producer time. Set
    by `graphledger import`, which carries an existing item's original creation time; left out of the
    payload when None, so a client's put encodes as at version 1."""


@payload_codec
@dataclass(frozen=True, slots=True)
class StoreDelete(ItemEvent):
    """`delete`: the item and all its vectors."""

    TYPE: ClassVar[str] = "store.delete"


@payload_codec
@dataclass(frozen=True, slots=True)
class StoreRefresh(ItemEvent):
    """A read with `refresh_ttl`: the item's TTL restarts at the envelope's producer time.

    Applies only to an item that has a TTL and is still live at that time; it never shortens a
    lifetime. Published by the reading client, coalesced per item (`store_refresh_coalesce_s`).
    """

    TYPE: ClassVar[str] = "store.refresh"


@payload_codec
@dataclass(frozen=True, slots=True)
class StoreExpire(ItemEvent):
    """The sweeper's expiry of one item, conditional: it deletes the item only if the item's
    `expires_at` is still at or before `at_ms` when the event applies, so a put or refresh that
    landed after the sweeper's decision keeps the item.
    """

    TYPE: ClassVar[str] = "store.expire"
    at_ms: int = field(metadata=wire(kind=EPOCH_MS))
    """The sweeper's decision time (ms since the epoch): what counts as expired."""


StoreEvent = StorePut | StoreDelete | StoreRefresh | StoreExpire | NamespaceErase | TenantErase

STORE_EVENT_TYPES: dict[str, type[StoreEvent]] = {
    cls.TYPE: cls for cls in (StorePut, StoreDelete, StoreRefresh, StoreExpire, NamespaceErase, TenantErase)
}
