"""Event schema evolution on real Postgres and Kafka: v1 records apply forever, and a record from a newer
graphledger parks its subject (metric) until an upgraded projector releases it.

Decoding the v1 fixtures and the upcasters are unit tests (`unit/test_event_versions.py`); the projector's
"newer version parks only its subject" behaviour (log line, offsets, the partition's other subjects going
on) is tested in `test_projector.py`, releases and drops in `test_parked.py`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import asyncpg
import pytest
from aiokafka import AIOKafkaProducer

from graphledger.events import envelope, to_envelope
from graphledger.events.envelope import Envelope
from graphledger.log.records import LogRecord
from graphledger.opening.records import DeadLetter
from graphledger.settings import Settings
from graphledger.telemetry import names
from graphledger_server.opening.vector_index import VectorIndex
from graphledger_server.projection.batch import BatchApplier
from graphledger_server.projection.checkpoints import CheckpointProjection
from graphledger_server.projection.migrate import migrate
from graphledger_server.projection.store import StoreProjection
from graphledger_server.projector.main import run_projector
from graphledger_server.telemetry.projector import _observe_parked
from kafka_clients import raw_producer
from polling import wait_for
from projection_helpers import cid, protected, put
from v1_events import CHECKPOINT_ID, CHECKPOINT_TOPIC, PRODUCED_MS, STORE_TOPIC, VECTOR_DIMS, fixture

SCHEMA = "v1"
WAIT_S = 60.0


async def test_v1_records_apply(fresh_database: str) -> None:
    await migrate(fresh_database, SCHEMA, vectors=VectorIndex(VECTOR_DIMS))
    projections: dict[str, Any] = {CHECKPOINT_TOPIC: CheckpointProjection(SCHEMA), STORE_TOPIC: StoreProjection(SCHEMA)}
    dead: list[DeadLetter] = []

    async def sink(letters: Any) -> None:
        dead.extend(letters)

    applier = BatchApplier(SCHEMA, "g", projections, sink)
    order = {
        CHECKPOINT_TOPIC: ["checkpoint.put", "checkpoint.writes", "thread.copy", "thread.prune", "runs.delete",
                           "thread.delete"],
        STORE_TOPIC: ["store.put", "store.put-imported", "store.delete"],
    }  # fmt: skip
    records = [
        LogRecord(topic, 0, offset, b"k", fixture(name), (), PRODUCED_MS)  # appended when v1 wrote it
        for topic, names_ in order.items()
        for offset, name in enumerate(names_)
    ]
    conn = await asyncpg.connect(fresh_database)
    try:
        await projections[STORE_TOPIC].prepare(conn)
        result = await applier.apply(conn, records)
        assert (result.applied, dead) == (len(records), [])

        async def rows(sql: str) -> list[tuple[Any, ...]]:
            return [tuple(r) for r in await conn.fetch(sql.replace("{s}", SCHEMA))]

        assert await rows("SELECT thread_id, checkpoint_id FROM {s}.checkpoints ORDER BY 1") == [
            ("thread-v1", CHECKPOINT_ID),
            ("thread-v1-copy", CHECKPOINT_ID),
        ]
        assert await rows("SELECT thread_id, channel, type FROM {s}.checkpoint_blobs ORDER BY 1, 2") == [
            ("thread-v1", "gone", "empty"),
            ("thread-v1", "messages", "msgpack"),
            ("thread-v1-copy", "gone", "empty"),
            ("thread-v1-copy", "messages", "msgpack"),
        ]
        assert await rows("SELECT thread_id, idx, channel FROM {s}.checkpoint_writes ORDER BY 1, 2") == [
            ("thread-v1", 0, "messages"),
            ("thread-v1", 1, "counter"),
            ("thread-v1-copy", 0, "messages"),
            ("thread-v1-copy", 1, "counter"),
        ]
        items = await rows(
            "SELECT key, value->>'text', (extract(epoch FROM created_at) * 1000)::bigint, "
            "(extract(epoch FROM updated_at) * 1000)::bigint, ttl_minutes FROM {s}.store ORDER BY 1"
        )
        assert items == [
            ("imported", "old", PRODUCED_MS - 86_400_000, PRODUCED_MS, 60),
            ("profile", "likes pizza", PRODUCED_MS, PRODUCED_MS, None),
        ]
        assert await rows("SELECT key, field_name, embedding::text FROM {s}.store_vectors") == [
            ("profile", "text", "[0.5,-0.25,1]")
        ]
    finally:
        await conn.close()


# -- a newer version in the log: the metric, and resuming after an upgrade ---------------------------


@pytest.fixture
async def settings(ready_settings: Callable[..., Awaitable[Settings]]) -> Settings:
    return await ready_settings(batch_max_wait_ms=20)


@pytest.fixture
async def producer(settings: Settings) -> AsyncIterator[AIOKafkaProducer]:
    p = raw_producer(settings)
    await p.start()
    yield p
    await p.stop()


async def test_a_newer_event_is_counted_parked_and_applied_by_an_upgraded_projector(
    settings: Settings, producer: AIOKafkaProducer, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def send(env: Envelope) -> int:
        meta = await producer.send_and_wait(
            settings.checkpoint_topic, envelope.encode(env), key=b"t", headers=envelope.headers_for(env), partition=0
        )
        return meta.offset

    newer = to_envelope(put("t", 2))
    await send(to_envelope(put("t", 1)))
    upgraded = envelope.SCHEMA_VERSION + 1
    await send(Envelope(newer.type, newer.event_id, newer.produced_ms, newer.payload, version=upgraded))
    last = await send(to_envelope(put("t", 3)))
    conn = await asyncpg.connect(settings.postgres_dsn)

    async def next_offset() -> int:
        return (
            await conn.fetchval(
                f"SELECT next_offset FROM {settings.postgres_schema}.graphledger_offsets "
                "WHERE topic = $1 AND partition = 0",
                settings.checkpoint_topic,
            )
            or 0
        )

    def parked_gauge() -> float:
        return sum(
            value
            for value, attributes in _observe_parked()
            if attributes[names.MESSAGING_DESTINATION_NAME] == settings.checkpoint_topic
            and attributes[names.GRAPHLEDGER_PARK_CAUSE] == "newer_version"
        )

    try:

        async def parked() -> bool:
            return await next_offset() == last + 1 and parked_gauge() == 1

        await project_until(
            settings, parked, "the thread to park at the newer event (the partition moving on), the gauge at 1"
        )
        checkpoints = f"SELECT count(*) FROM {settings.postgres_schema}.checkpoints"
        assert await conn.fetchval(checkpoints) == 1

        # The operator deploys a projector that knows the newer version; it releases the subject.
        monkeypatch.setattr(envelope, "SCHEMA_VERSION", upgraded)
        monkeypatch.setitem(envelope.UPCASTERS, upgraded - 1, lambda event_type, payload: payload)

        async def released() -> bool:
            return await conn.fetchval(checkpoints) == 3 and parked_gauge() == 0

        await project_until(settings, released, "the upgraded projector to release the thread and count it gone")
        assert await conn.fetchval(f"SELECT count(*) FROM {settings.postgres_schema}.graphledger_parked_subjects") == 0
        assert await conn.fetchval(f"SELECT count(*) FROM {settings.postgres_schema}.graphledger_dead_letters") == 0
    finally:
        await conn.close()


async def test_a_projector_before_the_rule_parks_what_carries_an_intent_and_an_upgraded_one_decides_it(
    settings: Settings, producer: AIOKafkaProducer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rolling upgrade: clients that protect their writes before every projector runs the rule. A projector
    of version 3 applies every event without an intent (version 3) and parks the threads of those with one
    (version 4), so it counts nothing the rule would refuse; an upgraded one releases them and decides them
    in log order: the writer that read the head counts, the one superseded is refused."""

    async def send(event: Any, key: bytes) -> int:
        env = to_envelope(event)
        meta = await producer.send_and_wait(
            settings.checkpoint_topic, envelope.encode(env), key=key, headers=envelope.headers_for(env), partition=0
        )
        return meta.offset

    await send(put("t", 1), b"t")  # no intent: version 3; it opens the namespace, one operation
    await send(protected(put("t", 2, parent=1), 1, operations=1), b"t")  # read the head: counts
    await send(protected(put("t", 3, parent=1), 1, operations=1), b"t")  # read the same head: refused
    last = await send(put("u", 1), b"u")
    schema = settings.postgres_schema
    conn = await asyncpg.connect(settings.postgres_dsn)

    async def ids() -> list[tuple[str, str]]:
        rows = await conn.fetch(f"SELECT thread_id, checkpoint_id FROM {schema}.checkpoints ORDER BY 1, 2")
        return [(r["thread_id"], r["checkpoint_id"]) for r in rows]

    try:
        with monkeypatch.context() as before_the_rule:
            before_the_rule.setattr(envelope, "SCHEMA_VERSION", envelope.PLAIN_VERSION)

            async def parked() -> bool:
                offset = await conn.fetchval(
                    f"SELECT next_offset FROM {schema}.graphledger_offsets WHERE topic = $1 AND partition = 0",
                    settings.checkpoint_topic,
                )
                return offset == last + 1

            await project_until(settings, parked, "the version-3 projector to pass the partition's records")
        assert await ids() == [("t", cid(1)), ("u", cid(1))]  # t waits at its first protected put
        assert await conn.fetchval(f"SELECT count(*) FROM {schema}.graphledger_parked_subjects") == 1
        assert await conn.fetchval(f"SELECT count(*) FROM {schema}.graphledger_refusals") == 0

        async def decided() -> bool:
            return await conn.fetchval(f"SELECT count(*) FROM {schema}.graphledger_refusals") == 1

        await project_until(settings, decided, "the upgraded projector to release the thread and decide its writes")
        assert await ids() == [("t", cid(1)), ("t", cid(2)), ("u", cid(1))]
        refused = await conn.fetchval(f"SELECT checkpoint_id FROM {schema}.graphledger_refusals")
        assert refused == cid(3)
        assert await conn.fetchval(f"SELECT count(*) FROM {schema}.graphledger_parked_subjects") == 0
    finally:
        await conn.close()


async def project_until(settings: Settings, condition: Callable[[], Awaitable[bool]], what: str) -> None:
    """Run a projector (the one this process imports: the version under test) until `condition` holds."""
    stop = asyncio.Event()
    task = asyncio.create_task(run_projector(settings, stop, migrate_first=False))
    try:
        await wait_for(condition, what, WAIT_S, poll_s=0.02)
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
