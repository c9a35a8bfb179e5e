"""One sweep: find what is due in bounded batches, publish conditional expiry events, wait for them.

Three kinds, each paged by an index in batches of `sweeper_batch_size`, never one unbounded DELETE:
- store items whose `expires_at` has passed: `store.expire` (deletes only what is still expired at
  the sweep's time, so a put or refresh that lands first keeps the item);
- threads idle longer than `thread_ttl_minutes`: `thread.expire` (deletes only a thread with no
  activity after the cutoff, so a write that lands first keeps it);
- threads with a namespace over `checkpoint_keep_last` checkpoints: `thread.prune` keep N (which
  keeps whatever a DeltaChannel needs, so a thread whose extra checkpoints are all needed gets none).
Times come from Postgres' clock (`now()`), the one the read API hides expired items by.

After each page the sweeper waits until the projector has applied its events, so the next page (and
the next sweep) does not find the same rows again; if the projector is slower than
`sweep_wait_s`, a later sweep may publish an event twice, which applies as a no-op.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import assert_never

import asyncpg

from graphledger.client.publisher import EventPublisher
from graphledger.erasure.sealer import EventSealer
from graphledger.erasure.subjects import LABEL_SEPARATOR
from graphledger.errors import SubjectErasedError
from graphledger.events import to_envelope
from graphledger.events.checkpoint import ThreadExpire, ThreadPrune
from graphledger.events.envelope import Envelope
from graphledger.events.store import StoreExpire
from graphledger.settings import Settings
from graphledger_server.log.offsets import OffsetStatements, all_applied
from graphledger_server.projection import erasure, prune
from graphledger_server.sql import render
from graphledger_server.telemetry import sweeper as telemetry

log = logging.getLogger(__name__)

SweepEvent = ThreadExpire | ThreadPrune | StoreExpire
"""What the sweeper publishes: thread TTL and keep-last-N retention, store item expiry."""

NOW_MS_SQL = "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint"

# Expired items after the cursor (expires_at, prefix, key; null: from the start), oldest first, by
# idx_store_expires_at.
# $1 now ms, $2..$4 cursor, $5 page size.
EXPIRED_ITEMS_SQL = """
SELECT prefix, key, expires_at FROM {schema}.store
WHERE expires_at IS NOT NULL
  AND expires_at <= 'epoch'::timestamptz + $1::bigint * interval '1 millisecond'
  AND ($2::timestamptz IS NULL OR (expires_at, prefix, key) > ($2::timestamptz, $3::text, $4::text))
ORDER BY expires_at, prefix, key
LIMIT $5::int
"""

# Idle threads after the cursor (last_active_at, thread_id; null: from the start), by their last
# activity's index.
# $1 cutoff ms, $2/$3 cursor, $4 page size.
IDLE_THREADS_SQL = """
SELECT thread_id, last_active_at FROM {schema}.graphledger_thread_partitions
WHERE last_active_at <= 'epoch'::timestamptz + $1::bigint * interval '1 millisecond'
  AND ($2::timestamptz IS NULL OR (last_active_at, thread_id) > ($2::timestamptz, $3::text))
ORDER BY last_active_at, thread_id
LIMIT $4::int
"""

# A page of threads after the cursor, and which of their namespaces hold more than $3 checkpoints.
# $1 cursor, $2 page size, $3 keep.
THREAD_PAGE_SQL = """
SELECT thread_id FROM {schema}.graphledger_thread_partitions
WHERE thread_id > $1::text ORDER BY thread_id LIMIT $2::int
"""
OVER_KEEP_SQL = """
SELECT thread_id, checkpoint_ns, count(*) AS checkpoints FROM {schema}.checkpoints
WHERE thread_id = ANY($1::text[])
GROUP BY thread_id, checkpoint_ns
HAVING count(*) > $2::int
"""

MIN_SWEEP_WAIT_S = 30.0


def longest_step_s(settings: Settings) -> float:
    """The longest the sweeper legitimately goes between two completed steps: one page (publishing, then
    waiting for the projector) or the wait between two sweeps."""
    return settings.produce_timeout_s + max(MIN_SWEEP_WAIT_S, settings.sweeper_interval_s)


@dataclass(slots=True)
class SweepReport:
    """What one sweep published, by kind."""

    published: dict[str, int] = field(default_factory=lambda: dict.fromkeys(telemetry.KINDS, 0))


class Sweep:
    """The sweep queries of one schema and the publishing of their events."""

    def __init__(
        self,
        settings: Settings,
        publisher: EventPublisher,
        sealer: EventSealer | None = None,
        progressed: Callable[[], None] = lambda: None,
    ) -> None:
        self.settings = settings
        self.publisher = publisher
        self.sealer = sealer
        """Seals the events of subjects the projection knows as sealed (None: every event in the clear)."""
        self._progressed = progressed  # told after each page, so a long sweep is not taken for a frozen one
        schema = settings.postgres_schema
        self._erasure = erasure.ErasureStatements(schema)
        self._expired_items = render(EXPIRED_ITEMS_SQL, schema)
        self._idle_threads = render(IDLE_THREADS_SQL, schema)
        self._thread_page = render(THREAD_PAGE_SQL, schema)
        self._over_keep = render(OVER_KEEP_SQL, schema)
        self._offsets = OffsetStatements(schema)
        self._prune = prune.PruneStatements(schema)
        # A page's events are waited for up to this long before the sweep moves on.
        self.sweep_wait_s = max(MIN_SWEEP_WAIT_S, settings.sweeper_interval_s)

    async def run(self, conn: asyncpg.Connection) -> SweepReport:
        """One sweep on `conn` (the lock-holding session)."""
        report = SweepReport()
        now_ms = await conn.fetchval(NOW_MS_SQL)
        await self._store_items(conn, now_ms, report)
        if self.settings.thread_ttl_minutes is not None:
            cutoff_ms = now_ms - int(self.settings.thread_ttl_minutes * 60_000)
            await self._idle(conn, cutoff_ms, report)
        if self.settings.checkpoint_keep_last is not None:
            await self._keep_last(conn, self.settings.checkpoint_keep_last, report)
        return report

    async def _store_items(self, conn: asyncpg.Connection, now_ms: int, report: SweepReport) -> None:
        cursor: tuple[object, str, str] = (None, "", "")
        batch = self.settings.sweeper_batch_size
        while True:
            rows = await conn.fetch(self._expired_items, now_ms, *cursor, batch)
            if not rows:
                return
            events = [StoreExpire(tuple(r["prefix"].split(".")), r["key"], now_ms) for r in rows]
            await self._publish(conn, self.settings.store_topic, events, telemetry.STORE_ITEM, report)
            last = rows[-1]
            cursor = (last["expires_at"], last["prefix"], last["key"])
            self._progressed()
            if len(rows) < batch:
                return

    async def _idle(self, conn: asyncpg.Connection, cutoff_ms: int, report: SweepReport) -> None:
        cursor: tuple[object, str] = (None, "")
        batch = self.settings.sweeper_batch_size
        while True:
            rows = await conn.fetch(self._idle_threads, cutoff_ms, *cursor, batch)
            if not rows:
                return
            events = [ThreadExpire(r["thread_id"], cutoff_ms) for r in rows]
            await self._publish(conn, self.settings.checkpoint_topic, events, telemetry.IDLE_THREAD, report)
            cursor = (rows[-1]["last_active_at"], rows[-1]["thread_id"])
            self._progressed()
            if len(rows) < batch:
                return

    async def _keep_last(self, conn: asyncpg.Connection, keep: int, report: SweepReport) -> None:
        cursor = ""
        batch = self.settings.sweeper_batch_size
        while True:
            page = [r["thread_id"] for r in await conn.fetch(self._thread_page, cursor, batch)]
            if not page:
                return
            over: dict[str, dict[str, int]] = {}
            for r in await conn.fetch(self._over_keep, page, keep):
                over.setdefault(r["thread_id"], {})[r["checkpoint_ns"]] = r["checkpoints"]
            due = [thread_id for thread_id, counts in over.items() if await self._prunes(conn, thread_id, keep, counts)]
            if due:
                events = [ThreadPrune(thread_id, "keep_latest", keep) for thread_id in due]
                await self._publish(conn, self.settings.checkpoint_topic, events, telemetry.OLD_CHECKPOINTS, report)
            cursor = page[-1]
            self._progressed()
            if len(page) < batch:
                return

    async def _prunes(self, conn: asyncpg.Connection, thread_id: str, keep: int, counts: dict[str, int]) -> bool:
        """Whether a keep-`keep` prune would delete anything (DeltaChannel ancestors may all be needed)."""
        kept, calls = await prune.plan_keep(conn, self._prune, thread_id, keep)
        return bool(calls) or any(n > len(kept.get(ns, ())) for ns, n in counts.items())

    async def _publish(
        self, conn: asyncpg.Connection, topic: str, events: Sequence[SweepEvent], kind: str, report: SweepReport
    ) -> None:
        """Publish a page's events together, count them, and wait until the projector applied them."""
        ready = await self._envelopes(conn, events)
        acked = await asyncio.gather(*(self.publisher.publish(topic, key, env) for key, env in ready))
        telemetry.expired(kind, len(events))
        report.published[kind] += len(events)
        positions = [p for positions in acked for p in positions]
        if not await self._wait_applied(conn, positions):
            log.warning(
                "sweeper: the projector did not apply %d %s events within %.0fs; moving on (a later sweep may "
                "repeat some, which applies as a no-op)", len(events), kind, self.sweep_wait_s,
            )  # fmt: skip

    async def _envelopes(
        self, conn: asyncpg.Connection, events: Sequence[SweepEvent]
    ) -> list[tuple[str | None, Envelope]]:
        """Each event's record key and envelope: sealed like its subject's events, in its tenant (the
        projection recorded both), or in the clear for a subject written in the clear; an erased one
        is left out (its rows are gone, or going)."""
        if self.sealer is None:
            return [(e.key, to_envelope(e)) for e in events]
        depth = self.settings.erasure_namespace_depth
        names: dict[int, list[str]] = {}  # candidate subject names per event: with a tenant label, then without
        kind: dict[int, str] = {}
        for i, e in enumerate(events):
            match e:
                case StoreExpire():
                    kind[i] = "namespace"
                    names[i] = [
                        LABEL_SEPARATOR.join(e.namespace[: depth + 1]),
                        LABEL_SEPARATOR.join(e.namespace[:depth]),
                    ]
                case ThreadExpire() | ThreadPrune():
                    kind[i], names[i] = "thread", [e.thread_id]
                case _:
                    assert_never(e)
        tenants: dict[tuple[str, str], str] = {}
        for k in ("thread", "namespace"):
            wanted = [n for i, candidates in names.items() if kind[i] == k for n in candidates]
            if wanted:
                tenants |= {(k, n): t for n, t in (await erasure.tenants_of(conn, self._erasure, k, wanted)).items()}
        ready: list[tuple[str | None, Envelope]] = []
        for i, e in enumerate(events):
            found = [tenants[(kind[i], n)] for n in names[i] if (kind[i], n) in tenants]
            if not found:
                ready.append((e.key, to_envelope(e)))
                continue
            try:
                ready.append(await self.sealer.seal(e, found[0]))
            except SubjectErasedError:
                log.info("sweeper: not expiring an erased subject")
        return ready

    async def _wait_applied(self, conn: asyncpg.Connection, positions: list[tuple[str, int, int]]) -> bool:
        deadline = time.monotonic() + self.sweep_wait_s
        while not await all_applied(conn, self._offsets, self.settings.projector_group_id, positions):
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.05)
        return True
