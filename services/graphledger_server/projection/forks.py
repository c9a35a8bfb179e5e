"""Reading `graphledger_forks` and `graphledger_refusals`: the checkpoint puts the projector found branching
or forking their thread, and the puts and writes the one-writer rule refused (`checkpoints.py` records both
as it applies a batch)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import asyncpg

from graphledger_server.sql import render

# $1 thread id or null, $2 limit.
LIST_FORKS_SQL = """
SELECT id, kind, thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, newest_checkpoint_id, source,
       topic, partition, "offset", recorded_at
FROM {schema}.graphledger_forks
WHERE $1::text IS NULL OR thread_id = $1::text
ORDER BY id DESC
LIMIT $2::int
"""

# $1 thread id or null, $2 limit.
LIST_REFUSALS_SQL = """
SELECT thread_id, checkpoint_ns, checkpoint_id, event_type, reason, topic, partition, "offset", recorded_at
FROM {schema}.graphledger_refusals
WHERE $1::text IS NULL OR thread_id = $1::text
ORDER BY recorded_at DESC, topic, partition, "offset" DESC
LIMIT $2::int
"""

# $1..$3 -> unnest(topic, partition, offset): the refusals recorded at those positions.
REFUSALS_AT_SQL = """
SELECT r.topic, r.partition, r."offset", r.reason FROM {schema}.graphledger_refusals r
JOIN unnest($1::text[], $2::int[], $3::bigint[]) AS u(topic, partition, off)
  ON r.topic = u.topic AND r.partition = u.partition AND r."offset" = u.off
"""


async def list_forks(
    conn: asyncpg.Connection, schema: str, thread_id: str | None = None, limit: int = 100
) -> list[dict[str, Any]]:
    """The forks and branches recorded, newest first (of one thread when given), `recorded_at` in ISO 8601."""
    rows = await conn.fetch(render(LIST_FORKS_SQL, schema), thread_id, limit)
    return [{**dict(r), "recorded_at": r["recorded_at"].isoformat()} for r in rows]


async def list_refusals(
    conn: asyncpg.Connection, schema: str, thread_id: str | None = None, limit: int = 100
) -> list[dict[str, Any]]:
    """The refused puts and writes recorded, newest first (of one thread when given)."""
    rows = await conn.fetch(render(LIST_REFUSALS_SQL, schema), thread_id, limit)
    return [{**dict(r), "recorded_at": r["recorded_at"].isoformat()} for r in rows]


async def refusals_at(
    conn: asyncpg.Connection, schema: str, positions: Collection[tuple[str, int, int]]
) -> dict[tuple[str, int, int], str]:
    """The reason of the refusal recorded at each of `positions` the rule refused."""
    if not positions:
        return {}
    topics, partitions, offsets = (list(column) for column in zip(*positions, strict=True))
    rows = await conn.fetch(render(REFUSALS_AT_SQL, schema), topics, partitions, offsets)
    return {(r["topic"], r["partition"], r["offset"]): r["reason"] for r in rows}
