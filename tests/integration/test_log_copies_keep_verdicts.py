"""A copy of a log counts what its original counted (docs/architecture.md, "One writer per thread").

The original is `one_writer_log` (every branch of the rule, refusals on every thread) and two puts whose
`gl-intent` header disagrees with their payload, which the projector dead-letters. It is
projected, copied by each copier, and the copy projected into a schema of its own: the two projections
hold the same checkpoints, blobs and writes, so the refused and the dead-lettered writes are in neither.
`encrypt-log` and `repartition` copy each record's intent (its header and its payload's) and each thread's
order, so the copy's projection refuses the same writes for the same reasons (its refusals' positions are
the copy's). `import` publishes the original's projected rows, which hold nothing the rule refused, as
puts without an intent: its projection refuses nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import pytest
from aiokafka import TopicPartition

from graphledger.events.envelope import HEADER_INTENT
from graphledger.log.tail import LogTail
from graphledger.ownership import Intent
from graphledger.settings import Settings
from graphledger_server.importer.run import import_postgres
from graphledger_server.log.topics import ensure_topics
from graphledger_server.log_copy.run import encrypt_log, repartition
from polling import wait_applied
from projection_helpers import (
    ONE_WRITER_LOG_IDS,
    ONE_WRITER_LOG_REFUSED,
    cid,
    dump,
    migrated,
    one_writer_log,
    protected,
    put,
    record,
)
from worker_helpers import producer_for, running_projector

USER_TABLES = ("checkpoints", "checkpoint_blobs", "checkpoint_writes")
REFUSALS_SQL = """
SELECT thread_id, checkpoint_ns, checkpoint_id, event_type, reason, superseded_by
FROM {schema}.graphledger_refusals ORDER BY 1, 2, 3, 4, 5
"""
FORGED = ("h", "g")
"""Threads of a put whose header disagrees with its payload: the original dead-letters it, no copy applies it."""


async def _publish(settings: Settings) -> None:
    """`one_writer_log` at its partitions and offsets (its barrier names its copy's), then the two puts whose
    header lies: a protected one whose header was lost, and one without an intent carrying another's."""
    topic = settings.checkpoint_topic
    stripped = record(protected(put("h", 1, blobs={"m": b"h1"}), None), 0, 0)
    claimed = record(put("g", 1, blobs={"m": b"g1"}), 0, 0)
    intent = Intent(b"-", cid(1).encode(), b"", 0).header()
    forged = [
        (stripped, [h for h in stripped.headers if h[0] != HEADER_INTENT]),
        (claimed, [*claimed.headers, (HEADER_INTENT, intent)]),
    ]
    async with producer_for(settings) as producer:
        for _, partition, offset, event in one_writer_log():
            r = record(event, partition, offset)
            sent = await producer.send_and_wait(topic, r.value, key=r.key, headers=list(r.headers), partition=partition)
            assert sent.offset == offset, "a fresh topic holds the log at the offsets it names"
        for r, headers in forged:
            await producer.send_and_wait(topic, r.value, key=r.key, headers=headers, partition=0)


async def _projected(settings: Settings) -> None:
    """Run a projector of `settings` until it has applied the checkpoint topic to its end."""
    tail = LogTail(settings)
    await tail.start()
    try:
        topic = settings.checkpoint_topic
        count = await tail.partition_count(topic)
        ends = await tail.ends({TopicPartition(topic, p): 0 for p in range(count)}, 30)
    finally:
        await tail.stop()
    positions = {(tp.topic, tp.partition): end for tp, end in ends.items()}
    async with running_projector(settings):
        await wait_applied(settings, positions, f"the projection {settings.postgres_schema} to reach the log's end")


async def _verdicts(conn: asyncpg.Connection, schema: str) -> tuple[dict[str, list[tuple[Any, ...]]], list[Any]]:
    """The threads' rows and the rule's refusals (without their positions, which are the copy's own)."""
    rows = await dump(conn, schema)
    refusals = [tuple(r) for r in await conn.fetch(REFUSALS_SQL.format(schema=schema))]
    return {t: rows[t] for t in USER_TABLES}, refusals


@pytest.mark.parametrize("copier", ["encrypt-log", "repartition", "import"])
async def test_a_copy_refuses_what_its_original_refused(
    copier: str,
    ready_settings: Callable[..., Awaitable[Settings]],
    make_settings: Callable[..., Settings],
) -> None:
    original = await ready_settings(topic_partitions=2, batch_max_wait_ms=20)
    await _publish(original)
    await _projected(original)

    partitions = 3 if copier == "repartition" else 2
    copy = make_settings(
        postgres_dsn=original.postgres_dsn, postgres_schema="copy", topic_partitions=partitions, batch_max_wait_ms=20
    )
    if copier == "encrypt-log":
        checkpoints, _ = await encrypt_log(original, copy.topic_prefix)
        assert checkpoints.sealed > 0 and len(checkpoints.left_out) == len(FORGED), checkpoints.describe()
        await migrated(copy)
    elif copier == "repartition":
        checkpoints, _ = await repartition(original, copy.topic_prefix, partitions)
        assert len(checkpoints.left_out) == len(FORGED), checkpoints.describe()
        await migrated(copy)
    else:
        await ensure_topics(copy)
        report = await import_postgres(copy, original.postgres_dsn, source_schema=original.postgres_schema)
        assert report.threads == len(ONE_WRITER_LOG_IDS), report
    await _projected(copy)

    conn = await asyncpg.connect(original.postgres_dsn)
    try:
        rows, refusals = await _verdicts(conn, original.postgres_schema)
        ids: dict[str, set[str]] = {}
        for row in rows["checkpoints"]:
            ids.setdefault(row[0], set()).add(row[2])
        assert ids == {t: {cid(n) for n in ns} for t, ns in ONE_WRITER_LOG_IDS.items()}  # refused and forged: absent
        assert Counter(r[0] for r in refusals) == ONE_WRITER_LOG_REFUSED
        dead = await conn.fetchval(f"SELECT count(*) FROM {original.postgres_schema}.graphledger_dead_letters")
        assert dead == len(FORGED)

        copied_rows, copied_refusals = await _verdicts(conn, copy.postgres_schema)
        assert copied_rows == rows
        # An import publishes rows, where no refused write is: each of its puts counts.
        assert copied_refusals == ([] if copier == "import" else refusals)
    finally:
        await conn.close()
