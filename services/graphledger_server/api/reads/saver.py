"""The official saver as the read API runs it: state left opaque, every list narrowed to one tenant, answers
in the wire format of `graphledger.wire`.

The read API answers with `AsyncPostgresSaver`'s own queries and row handling instead of a copy of
them: `aget_tuple`, `alist` and `aget_delta_channel_history` then keep the official semantics (which
blobs belong to a checkpoint, the `empty` sentinel, write ordering, delta-channel walks, the inline vs
blob precedence of snapshots) bit for bit, including whatever a future 3.2.x fixes. The saver only
calls `serde.loads_typed((type, bytes))` on the blobs it selected; this serde returns them untouched
as `Raw`, so the services never deserialize state (invariant 4) and the client gets back exactly the
bytes its own serde wrote.

Each request gets its own saver over the shared pool: constructing one is cheap, and a shared instance
would serialize every request on the saver's per-instance lock. Thread ids are the request tenant's
(`api/tenant.py`): prefixed on the way in, unprefixed on the way out, and a list without a thread only ever
sees the tenant's threads.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from langgraph.checkpoint.base import CheckpointTuple, writes_sort_key
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from graphledger.errors import ReencodeRefusedError
from graphledger.wire import inline, typed
from graphledger_server.api.tenant import Tenant


class Raw(NamedTuple):
    """A value as the agent's serde wrote it; never decoded here."""

    type: str
    data: bytes


class PassThroughSerde:
    """`SerializerProtocol` for reads only: `loads_typed` wraps, `dumps_typed` refuses."""

    def loads_typed(self, data: tuple[str, bytes]) -> Raw:
        return Raw(data[0], data[1])

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        raise ReencodeRefusedError()


def to_wire(value: Any) -> dict[str, Any]:
    """`{"t", "b"}` for a blob the saver loaded, `{"v"}` for a primitive inline in the checkpoint jsonb."""
    if isinstance(value, Raw):
        return typed(value.type, value.data)
    return inline(value)


class SavedWrite(NamedTuple):
    """One of the pending writes the official saver's statements select with a checkpoint, each column as
    bytes (`AsyncPostgresSaver.SELECT_SQL`)."""

    task_id: bytes
    channel: bytes
    type: bytes
    blob: bytes
    task_path: bytes
    idx: bytes


class TenantSaver(AsyncPostgresSaver):
    """The official saver, with every list narrowed to the threads of one tenant."""

    def __init__(self, *args: Any, thread_prefix: str | None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.thread_prefix = thread_prefix

    def _load_writes(self, writes: Any) -> list[Any]:
        """The official order and values, keeping each write's task path and index: a client adding its
        own writes to an answer merges them by `(task_id, idx)` and sorts them as the saver does."""
        saved = [SavedWrite(*write) for write in writes or []]
        saved.sort(key=lambda w: writes_sort_key(w.task_path.decode(), w.task_id.decode(), int(w.idx)))
        return [
            (w.task_id.decode(), w.channel.decode(), self.serde.loads_typed((w.type.decode(), w.blob)),
             w.task_path.decode(), int(w.idx))
            for w in saved
        ]  # fmt: skip

    def _search_where(self, config: Any, filter: Any, before: Any = None) -> tuple[str, list[Any]]:
        where, params = super()._search_where(config, filter, before)
        if self.thread_prefix is None:
            return where, params
        # starts_with, not LIKE: a tenant name may hold `_`, a LIKE wildcard.
        narrowed = "starts_with(thread_id, %s)"
        return (f"{where} AND {narrowed}" if where else f"WHERE {narrowed}"), [*params, self.thread_prefix]


def saver_for(tenant: Tenant, on: AsyncConnectionPool[Any] | AsyncConnection[Any]) -> TenantSaver:
    """The official saver of `tenant` on the pool, or on one connection (a snapshot's)."""
    return TenantSaver(conn=on, serde=PassThroughSerde(), thread_prefix=tenant.thread_prefix)


def _config(config: Any, tenant: Tenant) -> dict[str, Any]:
    configurable = dict(config["configurable"])
    configurable["thread_id"] = tenant.unthread(configurable["thread_id"])
    return configurable


def wire_tuple(found: CheckpointTuple, tenant: Tenant) -> dict[str, Any]:
    """The read API's `Tuple` of what the saver found, its thread id as the tenant names it."""
    writes: list[Any] = found.pending_writes or []  # five-tuples: `TenantSaver._load_writes`
    checkpoint: dict[str, Any] = dict(found.checkpoint)
    checkpoint["channel_values"] = {k: to_wire(v) for k, v in found.checkpoint["channel_values"].items()}
    return {
        "config": _config(found.config, tenant),
        "checkpoint": checkpoint,
        "metadata": found.metadata,
        "parent_config": _config(found.parent_config, tenant) if found.parent_config else None,
        "pending_writes": [[task_id, channel, to_wire(v), path, idx] for task_id, channel, v, path, idx in writes],
    }
