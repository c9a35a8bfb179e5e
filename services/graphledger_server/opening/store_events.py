"""What the store projection accepts of a store envelope, as a typed event at its time: the one validation the
projector, a replay and the read API's read-through open store records with. A put whose vectors do not fit
the schema's vector table (other dims, or no table at all) is refused here, so it is dead-lettered with a
reason naming the dims instead of failing its batch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import assert_never

import asyncpg

from graphledger.errors import InvalidEventError
from graphledger.events import store_event
from graphledger.events.envelope import MAX_EPOCH_MS, Envelope
from graphledger.events.erasure import NamespaceErase, TenantErase
from graphledger.events.store import (
    MAX_TTL_MINUTES,
    StoreDelete,
    StoreEvent,
    StoreExpire,
    StorePut,
    StoreRefresh,
)
from graphledger_server.opening.vector_index import COMPONENT_MAX, VectorIndex, load_vector_index

MAX_KEY_BYTES = 2_600
"""prefix + key + field name: a btree index row (the primary keys) holds about 2,700 bytes."""


def prefix_of(namespace: Sequence[str]) -> str:
    """The `store.prefix` of a namespace, as the official store writes it."""
    return ".".join(namespace)


@dataclass(frozen=True, slots=True)
class TimedStoreEvent:
    """A store event with its time (ms, `envelope.append_time_ms`), which becomes the item's timestamps."""

    event: StoreEvent
    ts_ms: int

    @property
    def TYPE(self) -> str:
        return self.event.TYPE


class StoreEvents:
    """The store topic's validation for one schema. `prepare` must run once before events are classified: it
    reads the shape of the schema's vector table, which `to_event` checks every put against."""

    def __init__(self, schema: str) -> None:
        self.schema = schema
        self.index: VectorIndex | None = None
        self._prepared = False

    async def prepare(self, conn: asyncpg.Connection) -> None:
        """Read the vector table's shape (after `migrate`, before the first event)."""
        self.index = await load_vector_index(conn, self.schema)
        self._prepared = True

    @property
    def prepared(self) -> bool:
        return self._prepared

    def to_event(self, env: Envelope, appended_ms: int) -> TimedStoreEvent:
        """The typed event at its time, refusing what its batch's statements would fail on
        (`InvalidEventError`)."""
        if not self._prepared:
            raise RuntimeError("StoreEvents.prepare() was not awaited before the first event")
        event = store_event(env)
        match event:
            case NamespaceErase() | TenantErase():
                return TimedStoreEvent(event, appended_ms)
            case StorePut():
                if event.created_ms is not None and event.created_ms > MAX_EPOCH_MS:
                    raise InvalidEventError(f"created_ms {event.created_ms} is not a time between 1970 and 9999")
                if event.ttl_minutes is not None and abs(event.ttl_minutes) > MAX_TTL_MINUTES:
                    raise InvalidEventError(f"ttl_minutes {event.ttl_minutes} does not fit store.ttl_minutes (int4)")
                self._check_vectors(event)
                field_bytes = max((len(path.encode()) for path, _ in event.vectors or ()), default=0)
            case StoreDelete() | StoreRefresh() | StoreExpire():
                field_bytes = 0
            case _:
                assert_never(event)
        prefix_bytes = len(prefix_of(event.namespace).encode()) + len(event.item_key.encode()) + field_bytes
        if prefix_bytes > MAX_KEY_BYTES:
            raise InvalidEventError(
                f"namespace, key and field names take {prefix_bytes} bytes; at most {MAX_KEY_BYTES}"
            )
        return TimedStoreEvent(event, appended_ms)

    def _check_vectors(self, event: StorePut) -> None:
        if not event.vectors:
            return  # null keeps the item's vectors, [] removes them: both fit any schema
        dims = len(event.vectors[0][1])
        index = self.index
        if index is None:
            raise InvalidEventError(
                f"store.put carries {dims}-dim vectors, but schema {self.schema!r} has no vector table "
                "(set GRAPHLEDGER_STORE_VECTOR_DIMS and migrate, or write with a KafkaStore without an index)"
            )
        if dims != index.dims:
            raise InvalidEventError(
                f"store.put carries {dims}-dim vectors, but store_vectors.embedding is {index.column_type} "
                f"in schema {self.schema!r}: the writer's embedder does not match the projection's dims"
            )
        # Beyond the column's float width asyncpg cannot even send the batch.
        limit = COMPONENT_MAX[index.vector_type]
        for path, embedding in event.vectors:
            if any(abs(x) > limit for x in embedding):
                raise InvalidEventError(f"vector of {path!r} holds a value beyond {index.vector_type}'s ±{limit:g}")
