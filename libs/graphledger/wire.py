"""The read API's wire format for opaque values, shared by the API (encoder) and the client (decoder).

A channel value or pending write is either typed bytes made by the agent's serde, `{"t": type, "b":
bytes}`, or a primitive the checkpoint stores inline in its jsonb, `{"v": value}`. Bodies are msgpack
(`application/msgpack`, bytes native) or JSON (`application/json`, bytes as base64 strings). The answers
that carry them are the types of `answers.py`.
"""

from __future__ import annotations

from typing import Any

MSGPACK = "application/msgpack"
JSON = "application/json"
CONSISTENCY_HEADER = "X-Graphledger-Consistency"
SEARCH_CONSISTENCY_HEADER = "X-Graphledger-Search-Consistency"
"""On a store batch: `own_writes` lets its searches and listings skip the wait for every store write
acknowledged before them (they still see the caller's own, from its consistency token)."""
OWN_WRITES = "own_writes"
OWN_WRITES_HEADER = "X-Graphledger-Own-Writes"
"""On a checkpoint get: `<partition>:<offset>,...`, the reading client's own acknowledged records of the
thread that it can add to the answer itself (docs/architecture.md, "Consistency")."""
CACHED_THROUGH_HEADER = "X-Graphledger-Cached-Through"
"""On a get of the newest checkpoint, with `OWN_WRITES_HEADER`: the caller holds that answer as of this
offset of the thread's partition (`client/threads.py`)."""
THREAD_KEY_HEADER = "X-Graphledger-Thread-Key"
"""On a get, from a client that seals and holds no key of the thread: `want`, to be answered the thread's own
data key beside an existing thread's checkpoint (a token with the `keys` permission), which saves the
`/v1/keys` call that would follow (`erasure/sealer.py`, `EventSealer.share`)."""
THREAD_KEY_WANTED = "want"

Token = dict[tuple[str, int], int]
"""Offsets by `(topic, partition)`: per partition the newest acknowledged offset a read must reflect (a
consistency token, `CONSISTENCY_HEADER`), or where a reader of the partitions stands."""


def format_token(token: Token) -> str:
    """`topic:partition:offset,...`: the newest acknowledged offset per partition a reader must see."""
    return ",".join(f"{topic}:{partition}:{offset}" for (topic, partition), offset in sorted(token.items()))


def parse_token(value: str) -> dict[tuple[str, int], int]:
    """Inverse of `format_token`; raises ValueError naming the malformed part."""
    token: dict[tuple[str, int], int] = {}
    for part in filter(None, (p.strip() for p in value.split(","))):
        try:
            topic, partition, offset = part.rsplit(":", 2)
            key, at = (topic, int(partition)), int(offset)
        except ValueError:
            raise ValueError(f"consistency token part {part!r} is not topic:partition:offset") from None
        if not topic or key[1] < 0 or at < 0:
            raise ValueError(f"consistency token part {part!r} is out of range")
        token[key] = max(token.get(key, -1), at)
    return token


def typed(type_: str, data: bytes) -> dict[str, Any]:
    return {"t": type_, "b": data}


def inline(value: Any) -> dict[str, Any]:
    return {"v": value}


CLIENT_KEEPALIVE_S = 30.0
SERVER_KEEPALIVE_S = 75
"""How long an idle HTTP connection to the read API is kept by the client and by the server: the
server's is longer, so that a client never sends on a connection the server is closing."""

CLIENT_READ_SLACK_S = 30.0
SERVER_REQUEST_SLACK_S = 20.0
"""Beyond `consistency_timeout_s` (the longest a read waits for the projection), how long the client waits
for an answer and how long the read API lets a request run before it answers 503 itself: the server's is
shorter, so a read it holds too long is answered with its cause, never left to the client's timeout."""
