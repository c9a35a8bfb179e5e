"""Exactly one active sweeper among replicas: a Postgres session advisory lock.

The active replica holds the lock on its own connection for as long as it lives; when the process
dies, Postgres ends the session and releases the lock, and a standby's next try takes it. The lock
is keyed by the projection schema, so sweepers of different schemas do not exclude each other.
"""

from __future__ import annotations

import logging

import asyncpg

from graphledger_server.sql import lock_key

log = logging.getLogger(__name__)

TRY_LOCK_SQL = "SELECT pg_try_advisory_lock($1::bigint)"


class AdvisoryLeader:
    """Tries to become the active sweeper; `connection` is the lock-holding session while active."""

    def __init__(self, dsn: str, schema: str) -> None:
        self._dsn = dsn
        self.key = lock_key(f"graphledger:sweeper:{schema}")
        self.connection: asyncpg.Connection | None = None

    async def acquire(self) -> asyncpg.Connection | None:
        """The lock-holding connection, taking the lock if it is free; None while another holds it."""
        if self.connection is not None and not self.connection.is_closed():
            return self.connection
        await self.release()
        conn = await asyncpg.connect(self._dsn)
        try:
            if await conn.fetchval(TRY_LOCK_SQL, self.key):
                self.connection = conn
                return conn
        except BaseException:
            await conn.close()
            raise
        await conn.close()
        return None

    async def release(self) -> None:
        """Close the session, which releases the lock (also after a lost connection)."""
        conn, self.connection = self.connection, None
        if conn is not None and not conn.is_closed():
            await conn.close()
