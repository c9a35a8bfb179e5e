"""Waiting, between measured runs, until the projector has applied everything in the log.

KafkaSaver's writes leave the projector a backlog that it applies after the run, on the stack's cores.
Started at once, the next run (often another saver's) would share those cores and Postgres with that
backlog. `Settle` waits until the projector group's applied offsets reach the broker's end offsets of
the checkpoint and store topics, so every run starts on a quiet stack; the projector's work during a
KafkaSaver run is still part of that run, as in a steady state.
"""

from __future__ import annotations

import asyncio
import time
from types import TracebackType

import asyncpg
from aiokafka import AIOKafkaConsumer, TopicPartition

from graphledger.settings import Settings
from graphledger_server.log.offsets import OffsetStatements, group_offsets

POLL_S = 0.02
TIMEOUT_S = 120.0


class Settle:
    """`await settle()` returns once the projector caught up with the log (or after `TIMEOUT_S`)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.topics = (settings.checkpoint_topic, settings.store_topic)
        self.timeouts = 0
        """Waits that ran out (the run after each started on a busy stack)."""
        self._conn: asyncpg.Connection | None = None
        self._consumer: AIOKafkaConsumer | None = None

    async def __aenter__(self) -> Settle:
        self._conn = await asyncpg.connect(self.settings.postgres_dsn)
        self._consumer = AIOKafkaConsumer(**self.settings.kafka_client_options())  # type: ignore[arg-type]
        await self._consumer.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._consumer is not None:
            await self._consumer.stop()
        if self._conn is not None:
            await self._conn.close()

    async def _ends(self) -> dict[tuple[str, int], int]:
        assert self._consumer is not None
        await self._consumer.topics()  # refreshes the metadata
        partitions = [
            TopicPartition(topic, p) for topic in self.topics for p in self._consumer.partitions_for_topic(topic) or ()
        ]
        ends = await self._consumer.end_offsets(partitions)
        return {(tp.topic, tp.partition): end for tp, end in ends.items() if end > 0}

    async def __call__(self) -> float:
        """Seconds waited."""
        assert self._conn is not None
        started = time.perf_counter()
        ends = await self._ends()
        sql = OffsetStatements(self.settings.postgres_schema)
        while True:
            applied = await group_offsets(self._conn, sql, self.settings.projector_group_id)
            if all(applied.get(tp, 0) >= end for tp, end in ends.items()):
                return time.perf_counter() - started
            if time.perf_counter() - started > TIMEOUT_S:
                self.timeouts += 1
                return time.perf_counter() - started
            await asyncio.sleep(POLL_S)
