"""`graphledger sweeper`: TTL and retention sweeping, one active replica among any number.

Every `sweeper_interval_s` a replica tries the advisory lock (`leader.py`); the one holding it
sweeps (`sweep.py`), the others stand by and take over when it dies. Whatever Postgres answers (an
outage, a schema not migrated yet) and a broker that is away or slow make the replica stand by and
retry at the next interval; it never exits on its own for them.
SIGTERM or SIGINT ends it with exit status 0.

Health (`/livez`, `/readyz` on `GRAPHLEDGER_HEALTH_PORT`): live while tries for the lock and sweep pages
keep completing; ready once a try reached Postgres, as the active replica or a standby (a standby is
useful: it takes over), and not ready while the tries fail.
"""

from __future__ import annotations

import asyncio
import logging

import asyncpg

from graphledger.client.publisher import EventPublisher
from graphledger.erasure.sealer import EventSealer
from graphledger.settings import Settings
from graphledger.tasks import set_within
from graphledger_server import telemetry
from graphledger_server.driver_errors import Verdict, is_database_error, verdict_of
from graphledger_server.health.server import serving
from graphledger_server.health.state import WorkerHealth
from graphledger_server.keys.key_store import check_key_settings, key_store_for
from graphledger_server.keys.source import StoreKeySource
from graphledger_server.signals import stop_on_signals
from graphledger_server.sweeper.leader import AdvisoryLeader
from graphledger_server.sweeper.sweep import Sweep, longest_step_s
from graphledger_server.telemetry import sweeper as sweeper_telemetry

log = logging.getLogger(__name__)

START_MESSAGE = "sweeper: started; sweeping whenever this replica holds the advisory lock"


class SweeperRunner:
    """One sweeper replica: standby or active, with counts of what it did (for logs and tests)."""

    def __init__(self, settings: Settings) -> None:
        check_key_settings(settings)
        self.settings = settings
        self.leader = AdvisoryLeader(settings.postgres_dsn, settings.postgres_schema)
        self.publisher: EventPublisher | None = None
        self.sealer: EventSealer | None = None
        self._keys_pool: asyncpg.Pool | None = None
        self.active = False
        self.sweeps = 0
        self.published: dict[str, int] = dict.fromkeys(sweeper_telemetry.KINDS, 0)
        self.health = WorkerHealth(
            settings.health_deadline_s,
            allowance_s=longest_step_s(settings),
            not_ready_reason="before the first try for the sweeper lock",
        )

    async def run(self, stop: asyncio.Event) -> None:
        """Sweep or stand by every interval until `stop` is set; then release the lock."""
        try:
            while not stop.is_set():
                await self.tick()
                await set_within(stop, self.settings.sweeper_interval_s)
        finally:
            await self.leader.release()
            if self.publisher is not None:
                await self.publisher.stop()
            if self._keys_pool is not None:
                await self._keys_pool.close()
            self._set_active(False)

    async def tick(self) -> None:
        """Take the lock if free; sweep once if held. Connection failures mean standing by for now."""
        try:
            conn = await self.leader.acquire()
            self._set_active(conn is not None)
            self.health.set_ready()  # Postgres answered: this replica sweeps, or stands by to take over
            if conn is None:
                return
            if self.publisher is None:
                publisher = EventPublisher(self.settings)
                await publisher.start()
                self.publisher = publisher
            if self.settings.encrypt_events and self.sealer is None:
                self._keys_pool = await asyncpg.create_pool(self.settings.postgres_dsn, min_size=0, max_size=1)
                key_store = key_store_for(self.settings, self._keys_pool)
                assert key_store is not None  # check_key_settings at start
                self.sealer = EventSealer(StoreKeySource(key_store, self.settings), self.settings.key_cache_ttl_s)
            with sweeper_telemetry.sweep() as span:
                report = await Sweep(self.settings, self.publisher, self.sealer, self.health.progressed).run(conn)
                for kind, count in report.published.items():
                    span.set_attribute(f"graphledger.sweep.{kind}", count)
                    self.published[kind] += count
            self.sweeps += 1
            if any(report.published.values()):
                log.info("sweeper: published %s", ", ".join(f"{n} {k}" for k, n in report.published.items() if n))
        except Exception as exc:
            if verdict_of(exc) is not Verdict.RETRY and not is_database_error(exc):
                raise
            log.warning("sweeper: %s: %s; standing by until the next try", type(exc).__name__, exc)
            await self.leader.release()
            self._set_active(False)
            self.health.set_not_ready(f"the last try failed: {type(exc).__name__}")
        finally:
            self.health.progressed()

    def _set_active(self, active: bool) -> None:
        if active != self.active:
            log.info("sweeper: %s", "active (holding the advisory lock)" if active else "standing by")
        self.active = active
        sweeper_telemetry.active(active)


async def run_sweeper(settings: Settings, stop: asyncio.Event) -> None:
    """Run one replica until `stop` is set (for the CLI and tests), its health served meanwhile."""
    runner = SweeperRunner(settings)
    with serving(settings, runner.health):
        await runner.run(stop)


def main(settings: Settings | None = None) -> None:
    """Run the sweeper until SIGTERM or SIGINT, then release the lock and return; without `settings`
    (`python -m graphledger_server.sweeper`), from `GRAPHLEDGER_*` variables."""
    settings = telemetry.setup("graphledger-sweeper", settings)
    sweeper_telemetry.started()

    async def _run() -> None:
        with stop_on_signals() as stop:
            with sweeper_telemetry.root_span("sweeper start"):
                log.info(START_MESSAGE)
            await run_sweeper(settings, stop)
        log.info("sweeper: stopped")

    asyncio.run(_run())
