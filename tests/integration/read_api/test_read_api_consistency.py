"""Consistency tokens: a read waits until the projection has applied what its token names, woken by the
projector's notification or the fallback refresh, whose watcher survives a cut connection; a token never
reached is a retryable 503, one naming what no write was acknowledged at, or malformed, a 400 at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import asyncpg
import psycopg
import pytest

from filled_log import FILLER_RECORDS
from graphledger.wire import CONSISTENCY_HEADER
from graphledger_server.log.applied import APPLICATION_NAME, AppliedOffsets
from polling import wait_for
from read_api_helpers import GET, LIST, SCHEMA, Api, answer, call, running, settings_for

UPSERT_OFFSET_SQL = """
INSERT INTO graphledger_offsets (consumer_group, topic, partition, next_offset) VALUES (%s, %s, %s, %s)
ON CONFLICT (consumer_group, topic, partition) DO UPDATE SET next_offset = EXCLUDED.next_offset
"""


async def set_applied(dsn: str, group: str, topic: str, partition: int, next_offset: int, *, notify: bool) -> None:
    """What the projector does at a batch commit: move the offset row, then NOTIFY (on commit)."""
    async with await psycopg.AsyncConnection.connect(dsn, options=f"-c search_path={SCHEMA}") as conn:
        async with conn.transaction():
            await conn.execute(UPSERT_OFFSET_SQL, (group, topic, partition, next_offset))
            if notify:
                await conn.execute("SELECT pg_notify('graphledger_applied', %s)", (SCHEMA,))


until = partial(wait_for, timeout_s=10, poll_s=0.005)


async def test_read_waits_for_its_token_and_answers_once_notified(projection: str, filled_log: dict[str, Any]) -> None:
    settings = settings_for(projection, **filled_log)
    group, topic = settings.projector_group_id, settings.checkpoint_topic
    await set_applied(projection, group, topic, 1, 5, notify=False)
    async with running(settings) as waiting:
        token = f"{topic}:1:7,{topic}:2:0"
        request = asyncio.create_task(
            call(waiting.client, GET, {"thread_id": "direct"}, headers={CONSISTENCY_HEADER: token})
        )
        await until(lambda: waiting.offsets.waiting == 1, "the read to wait for its token")

        await set_applied(projection, group, topic, 1, 8, notify=True)
        parsed = {(topic, 1): 7, (topic, 2): 0}
        await until(lambda: waiting.offsets.missing(parsed) == {(topic, 2): 0}, "partition 1 to be seen")
        assert not request.done(), "answered before every partition of the token was applied"

        await set_applied(projection, group, topic, 2, 1, notify=True)
        response = await asyncio.wait_for(request, 10)
        assert response.status_code == 200
        assert answer(response)["tuple"]["config"]["thread_id"] == "direct"

        # Reached already: no wait; an empty header is no token.
        for header in (token, ""):
            response = await call(waiting.client, GET, {"thread_id": "direct"}, headers={CONSISTENCY_HEADER: header})
            assert response.status_code == 200


async def test_notification_wakes_a_waiter_without_the_fallback(projection: str) -> None:
    group = f"g{uuid.uuid4().hex[:8]}"
    offsets = AppliedOffsets(projection, SCHEMA, group, fallback_refresh_s=300)
    await offsets.start()
    try:
        await asyncio.wait_for(offsets.listening.wait(), 10)
        waiter = asyncio.create_task(offsets.wait({("t.checkpoints", 0): 41}, timeout_s=60))
        await until(lambda: offsets.waiting == 1, "the waiter")
        await set_applied(projection, group, "t.checkpoints", 0, 42, notify=True)
        assert await asyncio.wait_for(waiter, 10) == {}
    finally:
        await offsets.stop()


async def test_a_missed_notification_is_caught_by_the_fallback_refresh(projection: str) -> None:
    group = f"g{uuid.uuid4().hex[:8]}"
    offsets = AppliedOffsets(projection, SCHEMA, group, fallback_refresh_s=0.05)
    await offsets.start()
    try:
        waiter = asyncio.create_task(offsets.wait({("t.checkpoints", 0): 0}, timeout_s=60))
        await until(lambda: offsets.waiting == 1, "the waiter")
        await set_applied(projection, group, "t.checkpoints", 0, 1, notify=False)
        assert await asyncio.wait_for(waiter, 10) == {}
    finally:
        await offsets.stop()


async def test_the_watcher_reads_offsets_and_parked_keys_together(projection: str) -> None:
    group, topic = f"g{uuid.uuid4().hex[:8]}", f"t{uuid.uuid4().hex[:8]}.checkpoints"
    await _execute(
        projection,
        f"INSERT INTO {SCHEMA}.graphledger_parked_subjects"
        " (topic, partition, first_offset, record_key, cause, reason, parked_by_version)"
        " VALUES ($1, 0, 3, 'k1', 'newer_version', 'from a newer producer', 1),"
        " ($1, 0, 4, NULL, 'beyond_log', 'keyless', 1)",
        topic,
    )
    await set_applied(projection, group, topic, 0, 5, notify=False)
    async with _listening(AppliedOffsets(projection, SCHEMA, group, fallback_refresh_s=300)) as offsets:
        assert offsets.applied(topic, 0) == 5
        assert offsets.parked(topic, 0, b"k1") == f"{topic}:0@3 (newer_version)"
        assert offsets.parked(topic, 0, b"k2") is None


async def test_a_schema_without_the_parking_tables_still_gives_its_offsets(projection: str) -> None:
    """A schema migrated before parking existed has no parked subjects; its offsets are read on their own."""
    schema, group = f"old{uuid.uuid4().hex[:8]}", f"g{uuid.uuid4().hex[:8]}"
    await _execute(
        projection,
        f"CREATE SCHEMA {schema};"
        f" CREATE TABLE {schema}.graphledger_offsets (LIKE {SCHEMA}.graphledger_offsets INCLUDING ALL);"
        f" INSERT INTO {schema}.graphledger_offsets (consumer_group, topic, partition, next_offset)"
        f" VALUES ('{group}', 't.checkpoints', 0, 42)",
    )
    async with _listening(AppliedOffsets(projection, schema, group, fallback_refresh_s=300)) as offsets:
        assert offsets.applied("t.checkpoints", 0) == 42
        assert offsets.parked("t.checkpoints", 0, b"k1") is None


async def _execute(dsn: str, sql: str, *args: object) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(sql, *args)
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def _listening(offsets: AppliedOffsets) -> AsyncIterator[AppliedOffsets]:
    """`offsets` started and listening, stopped after."""
    await offsets.start()
    try:
        await asyncio.wait_for(offsets.listening.wait(), 10)
        yield offsets
    finally:
        await offsets.stop()


async def watcher_backends(dsn: str) -> set[int]:
    """Server process ids of the sessions of applied-offsets watchers."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT pid FROM pg_stat_activity WHERE application_name = $1", APPLICATION_NAME)
    finally:
        await conn.close()
    return {r["pid"] for r in rows}


async def test_a_watcher_whose_connection_is_cut_listens_again_on_a_new_one(projection: str) -> None:
    """The server ending the LISTEN session is noticed with nobody waiting (no fallback refresh to
    trip over it), and notifications reach waiters through the new session."""
    group = f"g{uuid.uuid4().hex[:8]}"
    others = await watcher_backends(projection)  # the module's running read APIs have watchers too
    offsets = AppliedOffsets(projection, SCHEMA, group, fallback_refresh_s=300)
    await offsets.start()
    try:
        await asyncio.wait_for(offsets.listening.wait(), 10)
        (first,) = await watcher_backends(projection) - others
        conn = await asyncpg.connect(projection)
        try:
            assert await conn.fetchval("SELECT pg_terminate_backend($1::int)", first)
        finally:
            await conn.close()

        async def reconnected() -> bool:
            return bool(await watcher_backends(projection) - others - {first})

        await wait_for(reconnected, "the watcher to connect again", 10, poll_s=0.01)
        waiter = asyncio.create_task(offsets.wait({("t.checkpoints", 0): 41}, timeout_s=60))
        await until(lambda: offsets.waiting == 1, "the waiter")
        await set_applied(projection, group, "t.checkpoints", 0, 42, notify=True)
        assert await asyncio.wait_for(waiter, 10) == {}
        assert offsets.unreachable is None
    finally:
        await offsets.stop()


async def test_a_watcher_stopped_as_a_notification_arrives_stops(projection: str) -> None:
    """`stop` cancelling the watcher in the same step as a notification wakes it: on Python 3.11
    `asyncio.wait_for` returned the wake-up and swallowed the cancellation, so `stop` waited for ever
    (`graphledger erase tenant` hung after the projector announced its erasure)."""
    offsets = AppliedOffsets(projection, SCHEMA, f"g{uuid.uuid4().hex[:8]}", fallback_refresh_s=300)
    await offsets.start()
    try:
        await asyncio.wait_for(offsets.listening.wait(), 10)  # it waits for a notification from here on
    finally:
        offsets._wake.set()  # as `_notified` does
        stopping = asyncio.create_task(offsets.stop())
        done, _ = await asyncio.wait({stopping}, timeout=10)
    assert done, "the watcher did not stop"


async def test_a_token_never_reached_times_out_with_a_retryable_503(
    projection: str, filled_log: dict[str, Any]
) -> None:
    """The read API's first answer from Kafka (connection, metadata, the log's end) must fit in the
    deadline (2 s, for a loaded CI machine); a token the projection never reaches then times out as
    `consistency_timeout`, not `log_unavailable`."""
    settings = settings_for(projection, consistency_timeout_s=2, **filled_log)
    last = f"{settings.checkpoint_topic}:3:{FILLER_RECORDS - 1}"  # the partition's last record
    async with running(settings) as timing_out:
        response = await call(timing_out.client, GET, {"thread_id": "direct"}, headers={CONSISTENCY_HEADER: last})
        assert timing_out.offsets.waiting == 0
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    body = answer(response)
    assert body["error"] == "consistency_timeout" and body["retryable"] is True
    assert last in body["message"]


BAD_PARTS = {
    "elsewhere.checkpoints:0:0": "is not one of graphledger's",
    "{checkpoints}:4:0": "has no partition 4 (it has 4)",
    "{checkpoints}:0:{end}": f"beyond the log's end ({FILLER_RECORDS})",
    "{store}:2:999999999": f"beyond the log's end ({FILLER_RECORDS})",
}
TOKENED_READS = {
    "checkpoint get": (GET, {"thread_id": "direct"}),
    "checkpoint list": (LIST, {}),
    "store get": ("/v1/store/batch", {"ops": [{"op": "get", "namespace": ["docs"], "key": "k"}]}),
    "store search": ("/v1/store/batch", {"ops": [{"op": "search", "namespace_prefix": ["docs"]}]}),
}


@pytest.mark.parametrize("part", sorted(BAD_PARTS))
@pytest.mark.parametrize("read", sorted(TOKENED_READS))
async def test_a_token_naming_what_no_write_was_acknowledged_at_is_a_400_at_once(
    projection: str, filled_log: dict[str, Any], part: str, read: str
) -> None:
    """A topic not graphledger's, a partition its topic lacks, an offset at or past a partition's end:
    no client was ever acknowledged there, and waiting for it would only hold a wait slot. Reads of one
    thread or item and reads of a whole topic refuse alike, without waiting."""
    settings = settings_for(projection, consistency_timeout_s=30, **filled_log)
    token = part.format(checkpoints=settings.checkpoint_topic, store=settings.store_topic, end=FILLER_RECORDS)
    path, body = TOKENED_READS[read]
    async with running(settings) as guarded:
        started = time.monotonic()
        response = await call(guarded.client, path, body, headers={CONSISTENCY_HEADER: token})
        assert time.monotonic() - started < 10, "the read waited before it was refused"
    assert response.status_code == 400, answer(response)
    assert answer(response)["error"] == "invalid_consistency_token" and answer(response)["retryable"] is False
    assert BAD_PARTS[part] in answer(response)["message"]


@pytest.mark.parametrize("token", ["nonsense", "t:1", "t:x:1", "t:1:-1", ":1:1"])
async def test_a_malformed_token_is_a_400(api: Api, token: str) -> None:
    response = await call(api.client, GET, {"thread_id": "direct"}, headers={CONSISTENCY_HEADER: token})
    assert response.status_code == 400
    assert answer(response)["error"] == "invalid_consistency_token"
    assert answer(response)["retryable"] is False
