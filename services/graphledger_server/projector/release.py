"""An operator's look at parked subjects, and their release or drop (`graphledger parked`).

A release runs the projector's own batch applier in this process (`projection/parked_release.py`): it takes the
subject's held records in one transaction that locks their partition's offset row, as a batch of that
partition does, and applies them with this process's code, so a release after an upgrade applies what an
older projector could not. A drop dead-letters the record that parked the subject (`graphledger dlq`
shows it) and releases the rest. Both need what a projector needs: Postgres, the key store (sealed
records), the broker (dead letters; where a copy barrier's copy's partition ends).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import asyncpg

from graphledger.errors import ParkedSubjectError
from graphledger.log.tail import LogTail
from graphledger.opening.records import DeadLetter
from graphledger.settings import Settings
from graphledger_server.keys.key_store import key_store_for
from graphledger_server.keys.lookup import DataKeyCache
from graphledger_server.log.clients import new_producer
from graphledger_server.log.ends import log_ends
from graphledger_server.log.parked import list_parked, parse_subject_name
from graphledger_server.log.topics import source_topics
from graphledger_server.projection.batch import BatchApplier
from graphledger_server.projection.dead_letters import produce_dead_letters
from graphledger_server.projection.parked_release import Released, release_parked
from graphledger_server.projector.worker import projections_for


@dataclass(frozen=True, slots=True)
class Outcome:
    """What releasing (or dropping) one named subject did."""

    name: str
    released: Released | None
    error: ParkedSubjectError | None = None


async def parked_subjects(settings: Settings, limit: int) -> list[dict[str, Any]]:
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        return await list_parked(conn, settings.postgres_schema, limit)
    finally:
        await conn.close()


async def release(settings: Settings, names: Sequence[str], *, drop: bool) -> list[Outcome]:
    """Release (`drop`: drop) each named subject in turn; a name that is not parked is reported, not raised."""
    positions = [(name, parse_subject_name(name)) for name in names]
    for name, (topic, _, _) in positions:
        if topic not in source_topics(settings):
            raise ParkedSubjectError(f"{name}: {topic} is not a topic the projector consumes")
    outcomes = []
    async with _applier(settings) as (applier, pool):
        for name, position in positions:
            try:
                async with pool.acquire() as conn:
                    outcomes.append(Outcome(name, await release_parked(applier, conn, position, drop=drop)))
            except ParkedSubjectError as exc:
                outcomes.append(Outcome(name, None, exc))
    return outcomes


@asynccontextmanager
async def _applier(settings: Settings) -> AsyncIterator[tuple[BatchApplier, asyncpg.Pool]]:
    """A batch applier as the projector's, with its own clients: a pool of two (the release's transaction
    and the key store), a producer of dead letters, whose client also tells where logs end."""
    pool = await asyncpg.create_pool(settings.postgres_dsn, min_size=1, max_size=2)
    producer = new_producer(settings)
    try:
        await producer.start()
        tail = LogTail(settings, producer.client)

        async def sink(letters: Sequence[DeadLetter]) -> None:
            await produce_dead_letters(producer, settings, letters)

        async def ends(partitions: set[tuple[str, int]]) -> dict[tuple[str, int], int]:
            return await log_ends(tail, partitions, settings.consistency_timeout_s)

        projections = projections_for(settings)
        async with pool.acquire() as conn:
            for projection in projections.values():
                await projection.prepare(conn)
        applier = BatchApplier(
            settings.postgres_schema,
            settings.projector_group_id,
            projections,
            sink,
            keys=DataKeyCache(key_store_for(settings, pool)),
            clear_refused=settings.clear_events_refused,
            log_ends=ends,
        )
        yield applier, pool
    finally:
        try:
            await producer.stop()
        finally:
            await pool.close()
