"""The import's progress, in `graphledger_imports` beside the target projection (migration 0005).

A stream's cursor advances only after every event up to it was acknowledged by Kafka, so a crash
at any moment re-publishes at most the chunk in flight, and every event is idempotent to apply.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import asyncpg

from graphledger_server.sql import render

LOAD_SQL = "SELECT cursor, done, events FROM {schema}.graphledger_imports WHERE source = $1 AND stream = $2"
SAVE_SQL = """
INSERT INTO {schema}.graphledger_imports AS i (source, stream, cursor, done, events)
VALUES ($1, $2, $3::text[], $4, $5)
ON CONFLICT (source, stream) DO UPDATE
SET cursor = EXCLUDED.cursor, done = EXCLUDED.done, events = i.events + EXCLUDED.events, updated_at = now()
"""
RESET_SQL = "DELETE FROM {schema}.graphledger_imports WHERE source = $1"


@dataclass(slots=True)
class StreamProgress:
    cursor: list[str] | None = None
    done: bool = False
    events: int = 0
    """Events published by every run of this import so far."""


class Progress:
    def __init__(self, conn: asyncpg.Connection, schema: str, source: str) -> None:
        self.conn = conn
        self.source = source
        self._load = render(LOAD_SQL, schema)
        self._save = render(SAVE_SQL, schema)
        self._reset = render(RESET_SQL, schema)

    async def load(self, stream: str) -> StreamProgress:
        row = await self.conn.fetchrow(self._load, self.source, stream)
        if row is None:
            return StreamProgress()
        return StreamProgress(list(row["cursor"]) if row["cursor"] is not None else None, row["done"], row["events"])

    async def advance(self, stream: str, cursor: Sequence[str] | None, done: bool, events: int) -> None:
        await self.conn.execute(self._save, self.source, stream, list(cursor) if cursor else None, done, events)

    async def reset(self) -> None:
        await self.conn.execute(self._reset, self.source)
