"""Event schema evolution: v1 records decode and apply forever, upcasters lift old versions, and a
record from a newer graphledger stops its partition (log, metric) until an upgraded projector resumes it.

The projector's "newer version stops only its partition" behaviour (log line, offsets, other
partitions going on) is tested in test_projector.py; here, the metric and the resumption.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from aiokafka import AIOKafkaProducer

from graphledger.errors import UnknownEventVersionError
from graphledger.events import checkpoint_event, envelope, store_event, to_envelope
from graphledger.events.checkpoint import CHECKPOINT_EVENT_TYPES, ThreadPrune
from graphledger.events.envelope import Envelope
from graphledger.events.erasure import NamespaceErase, TenantErase, ThreadErase
from graphledger.events.store import STORE_EVENT_TYPES
from graphledger.settings import Settings
from graphledger.telemetry import names
from graphledger_server.commands.topics import ensure_topics
from graphledger_server.projection.batch import BatchApplier
from graphledger_server.projection.checkpoints import CheckpointProjection, TimedCheckpointEvent
from graphledger_server.projection.migrate import migrate
from graphledger_server.projection.records import DeadLetter, Decoded, SourceRecord, TooNew, classify
from graphledger_server.projection.store import StoreProjection
from graphledger_server.projection.vector_index import VectorIndex
from graphledger_server.projector.main import run_projector
from graphledger_server.telemetry.projector import _observe_stopped
from projection_helpers import put
from v1_events import CHECKPOINT_ID, EVENTS, PRODUCED_MS, VECTOR_DIMS

FIXTURES = Path(__file__).parent / "fixtures" / "events_v1"
SCHEMA = "v1"
CHECKPOINT_TOPIC, STORE_TOPIC = "v1.checkpoints", "v1.store"
WAIT_S = 60.0


def fixture(name: str) -> bytes:
    return (FIXTURES / f"{name}.msgpack").read_bytes()


SINCE_V2 = {ThreadErase.TYPE, NamespaceErase.TYPE, TenantErase.TYPE}
"""The event types version 2 added: no version-1 record of them exists."""


def test_every_event_type_of_v1_has_a_v1_fixture() -> None:
    kept = {path.stem for path in FIXTURES.glob("*.msgpack")}
    assert kept == set(EVENTS)
    every = set(CHECKPOINT_EVENT_TYPES) | set(STORE_EVENT_TYPES)
    assert SINCE_V2 <= every
    assert {e.TYPE for e in EVENTS.values()} == every - SINCE_V2


@pytest.mark.parametrize("name", sorted(EVENTS))
def test_a_v1_record_decodes_to_its_event(name: str) -> None:
    env = envelope.decode(fixture(name))
    assert (env.version, env.produced_ms) == (envelope.SCHEMA_VERSION, PRODUCED_MS)
    typed = store_event(env) if env.type.startswith("store.") else checkpoint_event(env)
    assert typed == EVENTS[name]


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
        SourceRecord(topic, 0, offset, b"k", fixture(name))
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


# -- upcasters ---------------------------------------------------------------------------------------


def _keep_last_record(version: int) -> SourceRecord:
    """A prune as a fictional older graphledger spelled it: strategy "keep_last"."""
    payload = {"thread_id": "t", "strategy": "keep_last"}
    env = Envelope(ThreadPrune.TYPE, str(uuid.uuid4()), PRODUCED_MS, payload, version)
    return SourceRecord(CHECKPOINT_TOPIC, 0, 0, b"t", envelope.encode(env))


def _rename_keep_last(event_type: str, payload: dict[str, Any]) -> dict[str, Any]:
    if event_type == ThreadPrune.TYPE and payload.get("strategy") == "keep_last":
        return {**payload, "strategy": "keep_latest"}
    return payload


def test_an_upcaster_lifts_an_old_version_before_validation(monkeypatch: pytest.MonkeyPatch) -> None:
    to_event = CheckpointProjection(SCHEMA).to_event
    current = envelope.SCHEMA_VERSION
    # Without a version bump the old spelling is simply invalid: a dead letter.
    assert isinstance(classify(_keep_last_record(current), to_event), DeadLetter)

    # This code as the next version, whose upcaster from the current one renames the strategy.
    monkeypatch.setattr(envelope, "SCHEMA_VERSION", current + 1)
    monkeypatch.setitem(envelope.UPCASTERS, current, _rename_keep_last)
    decoded = classify(_keep_last_record(current), to_event)
    assert isinstance(decoded, Decoded)
    assert decoded.event == TimedCheckpointEvent(ThreadPrune("t", "keep_latest"), PRODUCED_MS)
    assert envelope.decode(_keep_last_record(current).value).version == current + 1
    # The v1 fixtures go through the whole chain of upcasters and still mean what they meant.
    assert checkpoint_event(envelope.decode(fixture("thread.prune"))) == EVENTS["thread.prune"]
    # Records of the new version are not upcast; the one after it is from the future.
    assert isinstance(classify(_keep_last_record(current + 1), to_event), DeadLetter)
    assert isinstance(classify(_keep_last_record(current + 2), to_event), TooNew)


def test_a_missing_upcaster_stops_rather_than_dead_letters(monkeypatch: pytest.MonkeyPatch) -> None:
    current = envelope.SCHEMA_VERSION
    monkeypatch.setattr(envelope, "SCHEMA_VERSION", current + 2)
    monkeypatch.setitem(envelope.UPCASTERS, current, _rename_keep_last)
    with pytest.raises(
        UnknownEventVersionError, match=f"no upcaster from event version {current + 1} to {current + 2}"
    ):
        envelope.decode(fixture("thread.delete"))
    assert isinstance(classify(_keep_last_record(current), CheckpointProjection(SCHEMA).to_event), TooNew)


# -- a newer version in the log: the metric, and resuming after an upgrade ---------------------------


@pytest.fixture
async def settings(make_settings: Callable[..., Settings]) -> Settings:
    s = make_settings(batch_max_wait_ms=20)
    await ensure_topics(s)
    await migrate(s.postgres_dsn, s.postgres_schema)
    return s


@pytest.fixture
async def producer(settings: Settings) -> AsyncIterator[AIOKafkaProducer]:
    p = AIOKafkaProducer(**settings.kafka_client_options(), enable_idempotence=False, acks="all")  # type: ignore[arg-type]
    await p.start()
    yield p
    await p.stop()


async def _wait(condition: Callable[[], Any], what: str) -> None:
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while not await condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {WAIT_S:.0f}s waiting for {what}")
        await asyncio.sleep(0.02)


async def test_a_newer_event_is_counted_stopped_on_and_applied_after_an_upgrade(
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
    stop_at = await send(Envelope(newer.type, newer.event_id, newer.produced_ms, newer.payload, version=upgraded))
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

    def stopped_gauge() -> float:
        return sum(
            value
            for value, attributes in _observe_stopped()
            if attributes[names.MESSAGING_CONSUMER_GROUP_NAME] == settings.projector_group_id
            and attributes[names.GRAPHLEDGER_STOP_REASON] == "newer_version"
        )

    async def run_until(condition: Callable[[], Any], what: str) -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(run_projector(settings, stop, migrate_first=False))
        try:
            await _wait(condition, what)
        finally:
            stop.set()
            await asyncio.wait_for(task, 30)

    try:

        async def stopped() -> bool:
            return await next_offset() == stop_at and stopped_gauge() == 1

        await run_until(stopped, "the partition to stop at the newer event, with the gauge at 1")
        checkpoints = f"SELECT count(*) FROM {settings.postgres_schema}.checkpoints"
        assert await conn.fetchval(checkpoints) == 1

        # The operator deploys a projector that knows the newer version; it resumes at the stored offset.
        monkeypatch.setattr(envelope, "SCHEMA_VERSION", upgraded)
        monkeypatch.setitem(envelope.UPCASTERS, upgraded - 1, lambda event_type, payload: payload)

        async def resumed() -> bool:
            return await next_offset() == last + 1

        await run_until(resumed, "the upgraded projector to apply the rest")
        assert await conn.fetchval(checkpoints) == 3
        assert await conn.fetchval(f"SELECT count(*) FROM {settings.postgres_schema}.graphledger_dead_letters") == 0
    finally:
        await conn.close()
