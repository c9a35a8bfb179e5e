"""Fresh keys bound to the subjects of the records that open with them, by a reader of the log.

A record names its fresh key in its `gl-key` header (and in its seal): anyone who reads the log sees the
id, and anyone who can produce can name it beside another subject. Only a holder of the key can make a
record that opens with it, since the seal's associated data binds the subject and the key id. So a
reader binds a fresh key (`DataKeyCache.bind`) only to the subject of a record that opened with it
(`graphledger.opening.records.opened_with`), once the records are decoded and outside any transaction (the key store may
share the reader's connection pool), and decodes again the records whose key turned out not to be
theirs (bound meanwhile to another subject, or destroyed with an erased one): dead letters or erased
records after all. The key store's first binding wins, so every reader (projector, replay, read API)
decides the same. A chunked event opens only once reassembled, inside the projector's transaction:
`BatchApplier` cuts its partition at such an event, and `BatchOpener` binds its key before the next batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from graphledger.opening.records import Classified, opened_with
from graphledger_server.keys.lookup import DataKeyCache

Item = TypeVar("Item", bound=Classified)


def unbound(item: Classified, keys: DataKeyCache) -> tuple[str, str] | None:
    """The name of the fresh key `item` opened with while it is bound to no subject yet, else None."""
    name = opened_with(item)
    return name if name is not None and keys.is_candidate(name) else None


async def bind_opened(classified: Sequence[Item], keys: DataKeyCache, again: Callable[[int], Item]) -> list[Item]:
    """`classified`, once the fresh keys its records opened with are bound to their subjects; the records
    whose key is another subject's after all are classified `again` (by position). Raises what the key
    store raises."""
    opened = {name for item in classified if (name := unbound(item, keys)) is not None}
    if not opened:
        return list(classified)
    lost = await keys.bind(opened)
    return [again(i) if opened_with(item) in lost else item for i, item in enumerate(classified)]
