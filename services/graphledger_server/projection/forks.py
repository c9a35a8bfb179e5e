"""Reading `graphledger_forks`, the checkpoint puts the projector found forking their thread
(`checkpoints.py` records them as it applies a batch)."""

from __future__ import annotations

from typing import Any

import asyncpg

from graphledger_server.sql import render

# $1 thread id or null, $2 limit.
LIST_FORKS_SQL = """
SELECT id, thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, newest_checkpoint_id, source,
       topic, partition, "offset", recorded_at
FROM {schema}.graphledger_forks
WHERE $1::text IS NULL OR thread_id = $1::text
ORDER BY id DESC
LIMIT $2::int
"""


async def list_forks(
    conn: asyncpg.Connection, schema: str, thread_id: str | None = None, limit: int = 100
) -> list[dict[str, Any]]:
    """The forks recorded, newest first (of one thread when given), `recorded_at` in ISO 8601."""
    rows = await conn.fetch(render(LIST_FORKS_SQL, schema), thread_id, limit)
    return [{**dict(r), "recorded_at": r["recorded_at"].isoformat()} for r in rows]
