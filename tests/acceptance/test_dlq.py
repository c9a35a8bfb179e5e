"""`graphledger dlq`: a dead-lettered event is listed, shown, fixed and re-published via the CLI, and
ends up applied exactly once, against the real broker, Postgres and an in-process projector."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from aiokafka import TopicPartition

from graphledger.events import envelope, to_envelope
from graphledger.settings import Settings
from graphledger.telemetry import names
from graphledger_server.dlq.editable import to_editable
from graphledger_server.dlq.republish import HEADER_REPLAY_OF
from graphledger_server.projection.dead_letters import outstanding
from graphledger_server.projector.main import run_projector
from graphledger_server.telemetry.projector import _observe_dead_letters
from kafka_clients import raw_consumer, raw_producer
from polling import wait_for
from projection_helpers import cid, protected
from projection_helpers import put as checkpoint_put
from store_helpers import put as store_put

DIMS = 4
WAIT_S = 60.0
COMMAND_TIMEOUT_S = 120


@pytest.fixture
async def settings(ready_settings: Callable[..., Awaitable[Settings]]) -> Settings:
    return await ready_settings(batch_max_wait_ms=20, store_vector_dims=DIMS)


@pytest.fixture
async def projector(settings: Settings) -> AsyncIterator[None]:
    stop = asyncio.Event()
    task = asyncio.create_task(run_projector(settings, stop, migrate_first=False))
    yield
    stop.set()
    await asyncio.wait_for(task, 30)


async def graphledger(settings: Settings, *args: str, **overrides: str) -> tuple[int, str, str]:
    """The CLI as an operator runs it: a subprocess configured by GRAPHLEDGER_* variables only (`overrides`:
    more of them, by setting name)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRAPHLEDGER_")}
    names = ("kafka_bootstrap_servers", "topic_prefix", "postgres_dsn", "postgres_schema", "store_vector_dims")
    for name in (*names, "projector_group_id"):
        env[f"GRAPHLEDGER_{name.upper()}"] = str(getattr(settings, name))
    env.update({f"GRAPHLEDGER_{name.upper()}": value for name, value in overrides.items()})
    env["GRAPHLEDGER_KAFKA_IDEMPOTENCE"] = "false"
    assert settings.key_encryption_keys is not None
    env["GRAPHLEDGER_KEY_ENCRYPTION_KEYS"] = settings.key_encryption_keys.get_secret_value()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "graphledger_server", *args, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), COMMAND_TIMEOUT_S)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def _replayed_records(settings: Settings, topic: str) -> list[Any]:
    """Every record of `topic` carrying the replay header (reads each partition to its high watermark)."""
    consumer = raw_consumer(settings)
    await consumer.start()
    try:
        partitions = [TopicPartition(topic, p) for p in range(settings.topic_partitions)]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        found = []
        while True:
            fetched = await consumer.getmany(timeout_ms=500)
            found += [m for ms in fetched.values() for m in ms if HEADER_REPLAY_OF in dict(m.headers)]
            positions = [(await consumer.position(tp), consumer.highwater(tp)) for tp in partitions]
            if not fetched and all(high is not None and pos >= high for pos, high in positions):
                return found
    finally:
        await consumer.stop()


async def test_dead_letters_are_listed_shown_fixed_and_replayed_once(
    settings: Settings, db: asyncpg.Connection, projector: None, tmp_path: Path
) -> None:
    schema = settings.postgres_schema
    producer = raw_producer(settings)
    await producer.start()
    try:
        wrong_dims = store_put(("docs",), "d1", {"text": "hello"}, {"text": [0.1, 0.2, 0.3]})
        env = to_envelope(wrong_dims)
        sent = await producer.send_and_wait(
            settings.store_topic, envelope.encode(env), key=wrong_dims.key.encode(), headers=envelope.headers_for(env)
        )
        await producer.send_and_wait(
            settings.checkpoint_topic, b"\xc1not msgpack", key=b"t-bad", headers=[("gl-type", b"checkpoint.put")]
        )
    finally:
        await producer.stop()

    async def two_dead_letters() -> bool:
        return await db.fetchval(f"SELECT count(*) FROM {schema}.graphledger_dead_letters") == 2

    await wait_for(two_dead_letters, "both records to be dead-lettered")

    def gauge() -> dict[str, float]:
        return {a[names.MESSAGING_DESTINATION_NAME]: v for v, a in _observe_dead_letters()}

    async def gauge_counts_both() -> bool:
        return gauge().get(settings.store_topic) == 1 and gauge().get(settings.checkpoint_topic) == 1

    await wait_for(gauge_counts_both, "the outstanding dead-letter gauge")

    # list: reason, source position, type, time
    code, out, err = await graphledger(settings, "dlq", "list", "--json")
    assert code == 0, err
    listed = {d["topic"]: d for d in json.loads(out)}
    store_letter, bad_letter = listed[settings.store_topic], listed[settings.checkpoint_topic]
    assert store_letter["event_type"] == "store.put" and "3-dim vectors" in store_letter["reason"]
    assert store_letter["source"].startswith(f"{settings.store_topic}:") and store_letter["recorded_at"]
    assert bad_letter["event_type"] == "checkpoint.put" and "not msgpack" in bad_letter["reason"]
    code, table, err = await graphledger(settings, "dlq", "list")
    assert code == 0 and str(store_letter["id"]) in table and "3-dim vectors" in table, err

    # show: the full record, decoded where possible, hex otherwise
    code, out, err = await graphledger(settings, "dlq", "show", str(bad_letter["id"]))
    assert code == 0, err
    shown_bad = json.loads(out)
    assert shown_bad["value_hex"] == b"\xc1not msgpack".hex() and shown_bad["key"] == {"$text": "t-bad"}
    code, out, err = await graphledger(settings, "dlq", "show", str(store_letter["id"]), "--payload")
    assert code == 0, err
    payload = json.loads(out)
    assert payload["vectors"] == [["text", [0.1, 0.2, 0.3]]] and payload["value"] == {"$text": '{"text": "hello"}'}

    # replay as it was: refused, it would fail again; nothing published
    code, _, err = await graphledger(settings, "dlq", "replay", str(store_letter["id"]))
    assert code == 1 and "would fail again" in err and "3-dim" in err

    # fix and replay
    payload["vectors"] = [["text", [0.1, 0.2, 0.3, 0.4]]]
    fixed = tmp_path / "fixed.json"
    fixed.write_text(json.dumps(payload))
    code, out, err = await graphledger(settings, "dlq", "replay", str(store_letter["id"]), "--payload-file", str(fixed))
    assert code == 0 and f"replayed {store_letter['id']} to {settings.store_topic}:" in out, err

    async def item_applied() -> bool:
        return bool(await db.fetchval(f"SELECT count(*) FROM {schema}.store_vectors WHERE key = 'd1'"))

    await wait_for(item_applied, "the fixed put to be applied")
    row = await db.fetchrow(f"SELECT value->>'text' AS text, created_at FROM {schema}.store WHERE key = 'd1'")
    assert row["text"] == "hello"
    # The fixed event keeps the original's time (its record's, carried in gl-appended-ms): the item's
    # timestamps are when it was written.
    assert int(row["created_at"].timestamp() * 1000) == sent.timestamp

    # replaying again publishes nothing
    code, _, err = await graphledger(settings, "dlq", "replay", str(store_letter["id"]), "--payload-file", str(fixed))
    assert code == 1 and "not publishing it twice" in err
    code, _, err = await graphledger(settings, "dlq", "replay", str(store_letter["id"]))
    assert code == 1 and "not publishing it twice" in err
    replays = await _replayed_records(settings, settings.store_topic)
    assert len(replays) == 1
    assert dict(replays[0].headers)[HEADER_REPLAY_OF] == store_letter["source"].replace("@", ":").encode()
    assert replays[0].key == wrong_dims.key.encode() and replays[0].partition == store_letter["partition"]

    # the malformed checkpoint record, replaced by a valid event of the type its header names
    replacement = tmp_path / "checkpoint.json"
    replacement.write_text(json.dumps(to_editable(checkpoint_put("t-bad", 1).to_payload())))
    code, out, err = await graphledger(
        settings, "dlq", "replay", str(bad_letter["id"]), "--payload-file", str(replacement)
    )
    # A put without an intent counts: the line says where it went, and nothing more.
    assert code == 0 and out.startswith(f"dlq: replayed {bad_letter['id']} to {settings.checkpoint_topic}:"), err
    assert ";" not in out

    async def checkpoint_applied() -> bool:
        return bool(await db.fetchval(f"SELECT count(*) FROM {schema}.checkpoints WHERE thread_id = 't-bad'"))

    await wait_for(checkpoint_applied, "the replacement checkpoint to be applied")

    # nothing outstanding; `list --all` still shows both, marked replayed
    topics = [settings.store_topic, settings.checkpoint_topic]
    assert await outstanding(db, schema, topics) == dict.fromkeys(topics, 0)
    code, out, err = await graphledger(settings, "dlq", "list")
    assert code == 0 and "no dead letters" in out, err
    code, out, err = await graphledger(settings, "dlq", "list", "--all", "--json")
    assert code == 0 and all(d["replayed_to"] for d in json.loads(out)) and len(json.loads(out)) == 2
    assert await db.fetchval(f"SELECT count(*) FROM {schema}.graphledger_dead_letters") == 2


async def test_a_replayed_checkpoint_record_is_decided_at_its_new_position(
    settings: Settings, db: asyncpg.Connection, projector: None, tmp_path: Path
) -> None:
    """A re-published dead letter lands after what its thread got since, and the one-writer rule judges it
    there: a put whose writer expected checkpoint 1 is refused once 2 leads, and the replay says so."""
    schema, topic, thread = settings.postgres_schema, settings.checkpoint_topic, "t-own"
    first = protected(checkpoint_put(thread, 1), expects=None)
    second = protected(checkpoint_put(thread, 2, parent=1), expects=1)
    # Two more writers' puts, dead-lettered below (their records unreadable), then replayed fixed: the third
    # read the thread when 1 led it, so 2 supersedes it; the fourth read it after 2.
    third = protected(checkpoint_put(thread, 3, parent=1), expects=1)
    fourth = protected(checkpoint_put(thread, 4, parent=2), expects=2)
    producer = raw_producer(settings)
    await producer.start()
    try:
        for event in (first, second):
            env = to_envelope(event)
            await producer.send_and_wait(
                topic, envelope.encode(env), key=thread.encode(), headers=envelope.headers_for(env)
            )
        for _ in range(2):
            await producer.send_and_wait(
                topic, b"\xc1not msgpack", key=thread.encode(), headers=[("gl-type", b"checkpoint.put")]
            )
    finally:
        await producer.stop()

    async def checkpoint_ids() -> set[str]:
        rows = await db.fetch(f"SELECT checkpoint_id FROM {schema}.checkpoints WHERE thread_id = $1", thread)
        return {r["checkpoint_id"] for r in rows}

    async def dead_letter_ids() -> list[int]:
        rows = await db.fetch(f'SELECT id FROM {schema}.graphledger_dead_letters ORDER BY "offset"')
        return [r["id"] for r in rows]

    async def two_applied_two_dead_lettered() -> bool:
        return await checkpoint_ids() == {cid(1), cid(2)} and len(await dead_letter_ids()) == 2

    await wait_for(two_applied_two_dead_lettered, "two puts applied and two records dead-lettered")
    refused_letter, late_letter = await dead_letter_ids()

    async def replay_with(dead_letter_id: int, fixed: Any, **overrides: str) -> tuple[int, str, str]:
        path = tmp_path / f"fixed-{dead_letter_id}.json"
        path.write_text(json.dumps(to_editable(fixed.to_payload())))
        return await graphledger(
            settings, "dlq", "replay", str(dead_letter_id), "--payload-file", str(path), **overrides
        )

    # The dead letter has no intent header; the fixed payload carries the third writer's intent, and so
    # does the record re-published.
    code, out, err = await replay_with(refused_letter, third)
    assert code == 0, err
    replayed_to = await db.fetchval(
        f"SELECT replayed_to FROM {schema}.graphledger_dead_letters WHERE id = $1", refused_letter
    )
    assert out == (
        f"dlq: replayed {refused_letter} to {replayed_to}; the one-writer rule refused it: another writer's "
        "checkpoint superseded the one its writer expected\n"
    )
    where, _, offset = replayed_to.rpartition("@")
    refusal = await db.fetchrow(
        f"SELECT thread_id, checkpoint_id, event_type FROM {schema}.graphledger_refusals "
        'WHERE topic = $1 AND partition = $2 AND "offset" = $3',
        topic, int(where.rpartition(":")[2]), int(offset),
    )  # fmt: skip
    assert dict(refusal) == {"thread_id": thread, "checkpoint_id": cid(3), "event_type": "checkpoint.put"}
    assert await checkpoint_ids() == {cid(1), cid(2)}
    (record,) = await _replayed_records(settings, topic)
    assert dict(record.headers)[envelope.HEADER_INTENT] == third.intent

    # A replay that waits for a consumer group no projector runs (a projector stopped, or far behind): it is
    # published, and says it was not decided within its wait. The projector applies it: the fourth counts.
    code, out, err = await replay_with(late_letter, fourth, consistency_timeout_s="1", projector_group_id="idle")
    assert code == 0, err
    assert out.startswith(f"dlq: replayed {late_letter} to {topic}:")
    assert out.endswith(f"; not applied within 1s: see graphledger forks list --thread {thread}\n"), out

    async def fourth_applied() -> bool:
        return cid(4) in await checkpoint_ids()

    await wait_for(fourth_applied, "the fourth writer's put, which expected 2, to count")
    assert await db.fetchval(f"SELECT count(*) FROM {schema}.graphledger_refusals") == 1


async def test_unknown_ids_and_bad_payload_files_fail_clearly(
    settings: Settings, projector: None, tmp_path: Path
) -> None:
    code, _, err = await graphledger(settings, "dlq", "show", "999")
    assert code == 1 and "no dead letter 999" in err
    code, _, err = await graphledger(settings, "dlq", "replay", "999")
    assert code == 1 and "no dead letter 999" in err
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2")
    code, _, err = await graphledger(settings, "dlq", "replay", "1", "--payload-file", str(bad))
    assert code == 1 and "cannot read --payload-file" in err
    code, _, err = await graphledger(settings, "dlq", "replay", "1", "2", "--payload-file", str(bad))
    assert code == 2 and "give one ID" in err
