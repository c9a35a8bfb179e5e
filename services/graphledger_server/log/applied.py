"""A process's live view of `graphledger_offsets`: the next offset the projector will apply, per partition.

One `AppliedOffsets` per process keeps the projector's rows in memory. Its own asyncpg connection
`LISTEN`s on `graphledger_applied`, which the projector `NOTIFY`s after every batch commit, and re-reads
the (small) table on each notification for its schema, so a waiting caller wakes one round trip after
the commit that satisfies it. Waiters block on an `asyncio.Condition`; however many there are, the
database sees one reader, not one polling loop per waiter. In case a notification is missed
(reconnect, a projector that does not notify), the table is also re-read every `FALLBACK_REFRESH_S`
while anyone waits. A lost connection is noticed when it closes and re-made with a capped backoff;
until then `unreachable` says why. The read API waits on it for consistent reads, the eraser for its
erasure events.

With the offsets, in the same statement and so the same snapshot, it reads which record keys are parked
(`log/parked.py`): a read that finds a partition applied past a record sees the subject that record
parked, so a read of a parked subject fails instead of answering without the records it holds
(`api/consistency/read_barrier.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import asyncpg

from graphledger.retry import Backoff
from graphledger.tasks import cancel_and_wait, set_within
from graphledger.wire import Token
from graphledger_server.driver_errors import is_database_error
from graphledger_server.log import parked
from graphledger_server.log.offsets import APPLIED_CHANNEL, OffsetStatements, group_offsets
from graphledger_server.log.parked import ParkedStatements

log = logging.getLogger(__name__)

FALLBACK_REFRESH_S = 0.1
RECONNECT_MIN_S = 0.1
RECONNECT_MAX_S = 2.0
CLOSE_TIMEOUT_S = 1.0
APPLICATION_NAME = "graphledger-read-api-offsets"
"""The watcher's session in `pg_stat_activity`."""


class AppliedOffsets:
    """The next offset the projector will apply, per (topic, partition), kept current by LISTEN/NOTIFY."""

    def __init__(
        self, dsn: str, schema: str, consumer_group: str, *, fallback_refresh_s: float = FALLBACK_REFRESH_S
    ) -> None:
        self._dsn = dsn
        self._fallback_s = fallback_refresh_s
        self._schema = schema
        self._sql = OffsetStatements(schema)
        self._parked_sql = ParkedStatements(schema)
        self._view_sql = _view_sql(self._sql, self._parked_sql)
        self._group = consumer_group
        self._next: Token = {}
        self._parked: dict[tuple[tuple[str, int], bytes], str] = {}
        self._changed = asyncio.Condition()
        self._waiters = 0
        self._task: asyncio.Task[None] | None = None
        self._warned_no_table = False
        self.listening = asyncio.Event()
        """Set while the watcher holds its LISTEN connection and has read the table once."""
        self.unreachable: str | None = None
        """Why the watcher's last connection failed, until it connects again: no wait can end then."""
        self._retry_now = asyncio.Event()
        self._wake = asyncio.Event()
        """Set by a notification for this schema, or by the LISTEN connection closing."""

    async def start(self) -> None:
        self._task = asyncio.create_task(self._watch(), name="graphledger-applied-offsets")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None

    @property
    def waiting(self) -> int:
        """Reads waiting for the projection right now."""
        return self._waiters

    async def reachable(self, timeout_s: float) -> bool:
        """Whether the watcher is connected, asking it to reconnect now (not after its backoff) if not."""
        if self.unreachable is None:
            return True
        self._retry_now.set()
        await set_within(self.listening, timeout_s)
        return self.unreachable is None

    def applied(self, topic: str, partition: int) -> int:
        """The next offset the projector will apply on the partition, as last read (0: none applied)."""
        return self._next.get((topic, partition), 0)

    def parked(self, topic: str, partition: int, key: bytes) -> str | None:
        """The parked subject a record key of the partition belongs to, named with its cause, as last read
        (None: not parked)."""
        return self._parked.get(((topic, partition), key))

    def missing(self, token: Token) -> Token:
        """The parts of `token` not applied yet: those whose `next_offset` is not past the token's offset."""
        return {key: offset for key, offset in token.items() if self._next.get(key, 0) <= offset}

    async def wait(self, token: Token, timeout_s: float) -> Token:
        """Wait until `token` is applied; return what is still missing at the deadline (empty: reached)."""
        if not self.missing(token):
            return {}
        self._waiters += 1
        try:
            async with asyncio.timeout(timeout_s), self._changed:
                await self._changed.wait_for(lambda: not self.missing(token))
        except TimeoutError:
            pass
        finally:
            self._waiters -= 1
        return self.missing(token)

    async def _watch(self) -> None:
        backoff = Backoff(RECONNECT_MIN_S, RECONNECT_MAX_S)
        while True:
            try:
                conn = await asyncpg.connect(self._dsn, server_settings={"application_name": APPLICATION_NAME})
                try:
                    self._wake.clear()
                    conn.add_termination_listener(self._closed)
                    await conn.add_listener(APPLIED_CHANNEL, self._notified)
                    # Anything applied while we were not listening is in the table, not in a notification.
                    await self._refresh(conn)
                    self.listening.set()
                    self.unreachable = None
                    backoff.reset()
                    await self._listen(conn)
                finally:
                    with contextlib.suppress(Exception):
                        await conn.close(timeout=CLOSE_TIMEOUT_S)
            except Exception as exc:
                # Whatever Postgres answers, the watcher keeps trying: it is the process's only view
                # of the projection's progress.
                if not is_database_error(exc):
                    raise
                self.listening.clear()
                self.unreachable = type(exc).__name__
                delay = backoff.delay()
                log.warning("applied-offsets watcher failed (%s); reconnecting in %.1fs", exc, delay)
                self._retry_now.clear()
                await set_within(self._retry_now, delay)

    def _notified(self, conn: object, pid: int, channel: str, payload: str) -> None:
        # The payload is the schema the projector applied to; another schema's batch (a replay
        # building beside us) cannot satisfy our readers.
        if payload in ("", self._schema):
            self._wake.set()

    def _closed(self, conn: object) -> None:
        self._wake.set()

    async def _listen(self, conn: asyncpg.Connection) -> None:
        while True:
            await set_within(self._wake, self._fallback_s)
            if conn.is_closed():
                raise asyncpg.ConnectionDoesNotExistError("the LISTEN connection closed")
            notified = self._wake.is_set()
            self._wake.clear()  # before reading: a notification during the read wakes the next one
            if notified or self._waiters:
                await self._refresh(conn)

    async def _refresh(self, conn: asyncpg.Connection) -> None:
        try:
            rows = await conn.fetch(self._view_sql, self._group)
        except asyncpg.UndefinedTableError:
            await self._refresh_apart(conn)
            return
        offsets = {(r["topic"], r["partition"]): r["next_offset"] for r in rows if r["record_key"] is None}
        self._parked = parked.keyed_of_rows(r for r in rows if r["record_key"] is not None)
        await self._publish(offsets)

    async def _refresh_apart(self, conn: asyncpg.Connection) -> None:
        """The view from a schema missing one of the tables: each read on its own."""
        try:
            offsets = await group_offsets(conn, self._sql, self._group)
        except asyncpg.UndefinedTableError:
            if not self._warned_no_table:
                log.warning("no graphledger_offsets in schema %s yet; is it migrated?", self._schema)
                self._warned_no_table = True
            return
        try:
            # Read after the offsets: a subject parked at a record below them is seen with them.
            self._parked = await parked.keyed(conn, self._parked_sql)
        except asyncpg.UndefinedTableError:
            self._parked = {}  # a schema not migrated this far parks nothing
        await self._publish(offsets)

    async def _publish(self, offsets: Token) -> None:
        if offsets != self._next:
            async with self._changed:
                self._next = offsets
                self._changed.notify_all()


def _view_sql(offsets: OffsetStatements, parked_sql: ParkedStatements) -> str:
    """The group's offsets ($1) and the keyed parked subjects, each table's own statement, in one statement:
    one round trip per refresh, and one snapshot, so a subject parked with the offsets is seen with them.
    An offsets row is the one without a record key."""
    return f"""
WITH o AS ({offsets.group}), k AS ({parked_sql.keyed})
SELECT topic, partition, next_offset, NULL AS record_key, NULL AS first_offset, NULL AS cause FROM o
UNION ALL
SELECT topic, partition, NULL, record_key, first_offset, cause FROM k
"""
