"""A serde that leaves state opaque, so the official saver's read path can serve the wire format.

The read API answers with `AsyncPostgresSaver`'s own queries and row handling instead of a copy of
them: `aget_tuple`, `alist` and `aget_delta_channel_history` then keep the official semantics (which
blobs belong to a checkpoint, the `empty` sentinel, write ordering, delta-channel walks, the inline vs
blob precedence of snapshots) bit for bit, including whatever a future 3.2.x fixes. The saver only
calls `serde.loads_typed((type, bytes))` on the blobs it selected; this serde returns them untouched
as `Raw`, so the services never deserialize state (invariant 4) and the client gets back exactly the
bytes its own serde wrote.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from graphledger.errors import ReencodeRefusedError
from graphledger.wire import inline, typed


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
