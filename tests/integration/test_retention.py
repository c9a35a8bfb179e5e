"""Store TTL, thread TTL, keep-last-N and the sweeper (docs/retention.md) on real Postgres and Kafka.

Projection tests drive the store projection with records appended at chosen times (expiry is computed
from event times, so no test waits for a TTL to run out unless it says so). The live tests run a
projector, a read API and sweepers in this process on an isolated topic prefix and database, with
short sweep intervals, and wait on conditions with deadlines.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Annotated, Any

import asyncpg
import pytest
from aiokafka.admin import NewTopic
from aiokafka.structs import TopicPartition
from langgraph.channels import DeltaChannel
from langgraph.graph import START, StateGraph
from typing_extensions import TypedDict

import polling
from graphledger import KafkaSaver, KafkaStore
from graphledger.client.publisher import EventPublisher
from graphledger.errors import TimestampTypeError
from graphledger.events import Event, to_envelope
from graphledger.events.envelope import Envelope, decode
from graphledger.events.store import StoreExpire, StorePut, StoreRefresh
from graphledger.settings import Settings
from graphledger_server.api.main import server
from graphledger_server.devstack.ports import free_port, port_open
from graphledger_server.log.topics import (
    LOG_APPEND_TIME,
    TIMESTAMP_TYPE,
    described_configs,
    ensure_topics,
    source_topics,
)
from graphledger_server.projection.migrate import migrate
from graphledger_server.projector.main import run_projector
from graphledger_server.sweeper.main import SweeperRunner
from kafka_clients import raw_admin, raw_consumer
from projection_helpers import migrated
from sealed_events import unsealed
from store_helpers import Applier, dump, put, record

SCHEMA = "gl"
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z in ms
MINUTE = 60_000
DEADLINE_S = 90.0


# -- the store projection: expiry times from event times ------------------------------------------


@pytest.fixture
async def settings(fresh_database: str) -> Settings:
    """A projection without topics: the batches are applied by the test (`db` connects to it)."""
    return await migrated(Settings(postgres_dsn=fresh_database, postgres_schema=SCHEMA))


async def _expiry(conn: asyncpg.Connection, key: str, schema: str = SCHEMA) -> Any:
    return await conn.fetchval(f"SELECT expires_at FROM {schema}.store WHERE prefix = 'u' AND key = $1", key)


def _at(ms: int) -> Any:
    from datetime import UTC, datetime

    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)


async def test_refresh_restarts_the_exact_ttl_at_its_event_time_and_expire_is_conditional(
    db: asyncpg.Connection,
) -> None:
    applier = await Applier(SCHEMA).prepare(db)
    events = [
        (put(["u"], "frac", {"a": 1}, ttl=0.5), T0),  # 30 s: the INT ttl_minutes would round it to 0
        (put(["u"], "plain", {"a": 1}), T0),
        (StoreRefresh(("u",), "frac"), T0 + 20_000),
        (StoreRefresh(("u",), "plain"), T0 + 20_000),  # no TTL: nothing to refresh
        (put(["u"], "late", {"a": 1}, ttl=1), T0),
        (StoreRefresh(("u",), "late"), T0 + 2 * MINUTE),  # already expired then: not revived
    ]
    await applier.batch.apply(db, [record(e, ts, 0, i) for i, (e, ts) in enumerate(events)])
    assert await _expiry(db, "frac") == _at(T0 + 20_000 + 30_000)
    assert await _expiry(db, "plain") is None
    assert await _expiry(db, "late") == _at(T0 + MINUTE)

    expiries = [
        (StoreExpire(("u",), "frac", T0 + 40_000), T0 + 40_000),  # refreshed past it: kept
        (StoreExpire(("u",), "late", T0 + 90_000), T0 + 90_000),  # expired: deleted
        (StoreExpire(("u",), "plain", T0 + 90_000), T0 + 90_000),  # no TTL: kept
    ]
    await applier.batch.apply(db, [record(e, ts, 0, 6 + i) for i, (e, ts) in enumerate(expiries)])
    keys = {r["key"] for r in await db.fetch(f"SELECT key FROM {SCHEMA}.store")}
    assert keys == {"frac", "plain"}
    assert applier.dead == []


async def test_a_put_after_the_sweepers_decision_keeps_the_item(db: asyncpg.Connection) -> None:
    applier = await Applier(SCHEMA).prepare(db)
    log = [
        (put(["u"], "k", {"v": 1}, ttl=1), T0),
        (put(["u"], "k", {"v": 2}, ttl=1), T0 + 2 * MINUTE),  # landed before the expiry decided at +1.5 min
        (StoreExpire(("u",), "k", T0 + 90_000), T0 + 90_000),
    ]
    await applier.batch.apply(db, [record(e, ts, 0, i) for i, (e, ts) in enumerate(log)])
    assert await db.fetchval(f"SELECT value::text FROM {SCHEMA}.store WHERE key = 'k'") == '{"v": 2}'


async def test_a_replay_in_any_batching_computes_the_same_expiry_times(fresh_database: str) -> None:
    log: list[tuple[Any, int]] = []
    for i in range(6):
        key = f"k{i % 3}"
        log.append((put(["u"], key, {"i": i}, ttl=[0.5, 1, 2.25][i % 3]), T0 + i * 1_000))
        log.append((StoreRefresh(("u",), key), T0 + i * 1_000 + 500))
        log.append((StoreRefresh(("u",), key), T0 + i * 1_000 + 700))
    log.append((StoreExpire(("u",), "k0", T0 + 10 * MINUTE), T0 + 10 * MINUTE))
    log.append((put(["u"], "k0", {"back": True}, ttl=0.01), T0 + 11 * MINUTE))
    dumps = []
    for schema, batch_size in (("one", len(log)), ("each", 1), ("threes", 3)):
        await migrate(fresh_database, schema)
        conn = await asyncpg.connect(fresh_database)
        try:
            applier = await Applier(schema).prepare(conn)
            records = [record(e, ts, 0, i) for i, (e, ts) in enumerate(log)]
            for start in range(0, len(records), batch_size):
                await applier.batch.apply(conn, records[start : start + batch_size])
            dumps.append((await dump(conn, schema))["store"])
        finally:
            await conn.close()
    assert dumps[0] == dumps[1] == dumps[2]
    assert len(dumps[0]) == 3


# -- live: projector, read API and sweepers in this process ----------------------------------------


@dataclass
class Live:
    settings: Settings
    conn: asyncpg.Connection
    publisher: EventPublisher

    @property
    def schema(self) -> str:
        return self.settings.postgres_schema

    def configured(self, **overrides: Any) -> Settings:
        return self.settings.model_copy(update=overrides)

    async def publish_at(self, topic: str, event: Event, ts_ms: int) -> None:
        """Publish `event` as a copy of one first appended at `ts_ms`, in the past: its TTL and activity
        times come from that (`gl-appended-ms`)."""
        await self.publisher.publish(topic, event.key, dataclasses.replace(to_envelope(event), appended_ms=ts_ms))

    async def now_ms(self) -> int:
        return await self.conn.fetchval("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint")


wait_for = partial(polling.wait_for, timeout_s=DEADLINE_S)


@pytest.fixture
async def live(ready_settings: Callable[..., Awaitable[Settings]]) -> AsyncIterator[Live]:
    port = free_port()
    settings = await ready_settings(
        api_port=port,
        api_url=f"http://127.0.0.1:{port}",
        sweeper_interval_s=0.2,
        sweeper_batch_size=3,
        store_refresh_coalesce_s=0,
    )
    stop = asyncio.Event()
    projector = asyncio.create_task(run_projector(settings, stop, migrate_first=False))
    api = server(settings)
    api_task = asyncio.create_task(api.serve())
    publisher = EventPublisher(settings)
    await publisher.start()
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        await wait_for(lambda: asyncio.to_thread(port_open, "127.0.0.1", port), "the read API")
        yield Live(settings, conn, publisher)
    finally:
        stop.set()
        api.should_exit = True
        await asyncio.gather(projector, api_task)
        await publisher.stop()
        await conn.close()


async def _sweepers(live: Live, count: int, **overrides: Any) -> tuple[list[SweeperRunner], list[asyncio.Event], list]:
    runners = [SweeperRunner(live.configured(**overrides)) for _ in range(count)]
    stops = [asyncio.Event() for _ in runners]
    tasks = [asyncio.create_task(r.run(s)) for r, s in zip(runners, stops, strict=True)]
    return runners, stops, tasks


async def _topic_events(live: Live, topic: str) -> list[Envelope]:
    """Every event on `topic` below the projector's stored offsets (tansu's end offsets run low), opened."""
    rows = await live.conn.fetch(
        f"SELECT partition, next_offset FROM {live.schema}.graphledger_offsets WHERE topic = $1", topic
    )
    ends = {r["partition"]: r["next_offset"] for r in rows}
    consumer = raw_consumer(live.settings)
    await consumer.start()
    try:
        wanted = [TopicPartition(topic, p) for p, end in ends.items() if end > 0]
        consumer.assign(wanted)
        await consumer.seek_to_beginning(*wanted)
        out: list[Envelope] = []
        while [tp for tp in wanted if await consumer.position(tp) < ends[tp.partition]]:
            for tp, records in (await consumer.getmany(timeout_ms=1000)).items():
                out.extend(decode(r.value) for r in records if r.offset < ends[tp.partition])
    finally:
        await consumer.stop()
    return await unsealed(live.settings, out)


async def test_expired_items_vanish_from_reads_before_and_after_the_sweep_and_two_sweepers_expire_each_once(
    live: Live,
) -> None:
    root = f"r{uuid.uuid4().hex[:8]}"
    now = await live.now_ms()
    expired = [f"old{i}" for i in range(7)]  # more than two pages of sweeper_batch_size 3
    for key in expired:
        await live.publish_at(
            live.settings.store_topic, StorePut((root, "a"), key, b'{"text": "x"}', 1, None), now - 5 * MINUTE
        )
    async with KafkaStore(live.settings) as store:
        await store.aput((root, "b"), "alive", {"text": "x"}, ttl=60)
        await store.aput((root, "b"), "forever", {"text": "x"})
        rows = lambda: live.conn.fetchval(  # noqa: E731
            f"SELECT count(*) FROM {live.schema}.store WHERE prefix LIKE $1", f"{root}.%"
        )
        await wait_for(lambda: _eq(rows(), 9), "the puts to be projected")

        # Before any sweep: the rows are there, and no read returns them.
        assert await store.aget((root, "a"), "old0") is None
        assert await store.aget((root, "b"), "alive") is not None
        assert {i.key for i in await store.asearch((root,), limit=50)} == {"alive", "forever"}
        assert await store.alist_namespaces(prefix=(root,)) == [(root, "b")]

        runners, stops, tasks = await _sweepers(live, 2)
        await wait_for(lambda: _eq(rows(), 2), "the sweep to delete the expired items")
        active = [r for r in runners if r.active]
        target = active[0].sweeps + 2
        await wait_for(lambda: _ge(lambda: active[0].sweeps, target), "two more sweeps")
        assert len(active) == 1 and [r.sweeps for r in runners if r is not active[0]] == [0]
        # After the sweep: still not returned, and the live items stay.
        assert await store.aget((root, "a"), "old0") is None
        assert {i.key for i in await store.asearch((root,), limit=50)} == {"alive", "forever"}

        # The standby takes over when the active one goes (its session, and so its lock, ends).
        standby = next(r for r in runners if r is not active[0])
        stops[runners.index(active[0])].set()
        await wait_for(lambda: _ge(lambda: standby.sweeps, 1), "the standby to take over")
        for stop in stops:
            stop.set()
        await asyncio.gather(*tasks)

    expiries = [e for e in await _topic_events(live, live.settings.store_topic) if e.type == StoreExpire.TYPE]
    assert sorted(e.payload["key"] for e in expiries) == expired  # each expired item expired once
    assert sum(r.published["store_item"] for r in runners) == len(expired)


async def _eq(value: Any, expected: Any) -> bool:
    return await value == expected


async def _ge(get: Callable[[], int], at_least: int) -> bool:
    return get() >= at_least


async def test_refresh_on_read_extends_an_items_life_through_the_log(live: Live) -> None:
    root = f"r{uuid.uuid4().hex[:8]}"
    now = await live.now_ms()
    # Put 50 s ago with a 1-minute TTL: it expires about 10 s from now unless a read refreshes it.
    await live.publish_at(live.settings.store_topic, StorePut((root,), "hot", b'{"n": 1}', 1, None), now - 50_000)
    await live.publish_at(live.settings.store_topic, StorePut((root,), "cold", b'{"n": 1}', 1, None), now - 50_000)
    expiry = lambda key: live.conn.fetchval(  # noqa: E731
        f"SELECT expires_at FROM {live.schema}.store WHERE prefix = $1 AND key = $2", root, key
    )
    await wait_for(lambda: _not_none(expiry("cold")), "the puts to be projected")
    first = await expiry("hot")
    async with KafkaStore(live.settings, ttl={"default_ttl": 1, "refresh_on_read": True}) as store:
        assert (await store.aget((root,), "hot")) is not None  # refreshes
        assert (await store.aget((root,), "cold", refresh_ttl=False)) is not None  # does not
        await wait_for(lambda: _later(expiry("hot"), first + timedelta(seconds=40)), "the refresh to be projected")
        # Past the original expiry the refreshed item is still served; the other one is not.
        await wait_for(lambda: _past(live, first), "the original expiry time to pass")
        assert await store.aget((root,), "hot", refresh_ttl=False) is not None
        assert await store.aget((root,), "cold") is None
    refreshes = [e for e in await _topic_events(live, live.settings.store_topic) if e.type == StoreRefresh.TYPE]
    assert [e.payload["key"] for e in refreshes] == ["hot"]


async def _not_none(value: Any) -> bool:
    return await value is not None


async def _later(value: Any, than: Any) -> bool:
    return (await value) > than


async def _past(live: Live, moment: Any) -> bool:
    return await live.conn.fetchval("SELECT clock_timestamp() > $1", moment)


async def test_a_short_ttl_item_disappears_from_get_and_search_once_expired(live: Live) -> None:
    root = f"r{uuid.uuid4().hex[:8]}"
    async with KafkaStore(live.settings, ttl={"refresh_on_read": False}) as store:
        await store.aput((root,), "brief", {"text": "x"}, ttl=0.1)  # 6 seconds
        assert await store.aget((root,), "brief") is not None

        async def gone() -> bool:
            return await store.aget((root,), "brief") is None and await store.asearch((root,)) == []

        await wait_for(gone, "the item to expire")


class Counter(TypedDict):
    items: Annotated[
        list,
        DeltaChannel(lambda state, writes: [*(state or []), *(x for w in writes for x in w)], snapshot_frequency=3),
    ]


async def test_the_sweeper_applies_keep_last_n_and_thread_ttl(live: Live) -> None:
    def step(state: Counter) -> dict:
        return {"items": [len(state["items"])]}

    workflow = StateGraph(Counter)
    workflow.add_node(step)
    workflow.add_edge(START, "step")
    delta_thread = {"configurable": {"thread_id": f"delta-{uuid.uuid4().hex[:6]}"}}
    async with KafkaSaver(live.settings) as saver:
        graph = workflow.compile(checkpointer=saver)
        for _ in range(7):
            await graph.ainvoke({"items": []}, delta_thread)
        before = await graph.aget_state(delta_thread)
        history = [s async for s in graph.aget_state_history(delta_thread)]

        now = await live.now_ms()
        from projection_helpers import put as checkpoint_put

        for n in range(6):
            await live.publish_at(live.settings.checkpoint_topic, checkpoint_put("plain", n, n - 1 if n else None), now)
        await live.publish_at(live.settings.checkpoint_topic, checkpoint_put("idle", 0), now - 10 * MINUTE)
        count = lambda thread: live.conn.fetchval(  # noqa: E731
            f"SELECT count(*) FROM {live.schema}.checkpoints WHERE thread_id = $1", thread
        )
        await wait_for(lambda: _eq(count("idle"), 1), "the checkpoints to be projected")
        await wait_for(lambda: _eq(count("plain"), 6), "the checkpoints to be projected")

        runners, stops, tasks = await _sweepers(live, 1, checkpoint_keep_last=2, thread_ttl_minutes=5)
        await wait_for(lambda: _eq(count("plain"), 2), "keep-last-2 on the plain thread")
        await wait_for(lambda: _eq(count("idle"), 0), "the idle thread to expire")
        target = runners[0].sweeps + 2
        await wait_for(lambda: _ge(lambda: runners[0].sweeps, target), "two more sweeps")
        stops[0].set()
        await asyncio.gather(*tasks)

        assert await count(delta_thread["configurable"]["thread_id"]) < len(history)
        after = await graph.aget_state(delta_thread)
        assert after.values == before.values
        kept = [s async for s in graph.aget_state_history(delta_thread)]
        assert [(s.config, s.values) for s in kept[:2]] == [(s.config, s.values) for s in history[:2]]
        # Only threads with something to delete got a prune: a second sweep published none for them.
        assert runners[0].published["old_checkpoints"] == 2
        assert runners[0].published["idle_thread"] == 1


# -- the clock expiry follows: the broker's, not the writer's ---------------------------------------

HOUR = 60 * MINUTE
CLOCK_SLACK_MS = 1_000
"""Postgres' clock against the appending clock (tansu: the producing process's, on the same machine)."""


async def test_topics_ensure_stamps_the_source_topics_with_the_brokers_clock(
    make_settings: Callable[..., Settings],
) -> None:
    settings = make_settings()
    await ensure_topics(settings)
    admin = raw_admin(settings)
    await admin.start()
    try:
        for topic in source_topics(settings):
            assert await described_configs(admin, topic, (TIMESTAMP_TYPE,)) == {TIMESTAMP_TYPE: LOG_APPEND_TIME}
        assert await described_configs(admin, settings.dead_letter_topic, (TIMESTAMP_TYPE,)) == {}
        # A source topic someone made stamped with its writers' clocks is refused, naming the fix.
        stamped = make_settings()
        configs = {"retention.ms": "-1", TIMESTAMP_TYPE: "CreateTime"}
        await admin.create_topics([NewTopic(stamped.checkpoint_topic, 2, 1, topic_configs=configs)])
    finally:
        await admin.close()
    with pytest.raises(TimestampTypeError, match=rf"{stamped.checkpoint_topic} has {TIMESTAMP_TYPE}=CreateTime"):
        await ensure_topics(stamped)


async def _gone(live: Live, table: str, where: str, *args: Any) -> bool:
    return not await live.conn.fetchval(f"SELECT count(*) FROM {live.schema}.{table} WHERE {where}", *args)


async def test_a_writer_whose_clock_is_an_hour_off_expires_nothing_early_and_nothing_late(live: Live) -> None:
    """Two writers, one an hour ahead, one an hour behind: their events' `ts` says so, the records do not
    (tansu stamps them with the producing process's clock, which is right here; Kafka, with
    LogAppendTime, with its own whatever the writer's). Item TTLs and thread idle times run from the
    records' times: the ahead writer's 6-second item and idle thread go within seconds, not an hour
    late; the behind writer's 30-minute item and thread stay through sweeps, not expired at once."""
    root = f"r{uuid.uuid4().hex[:8]}"
    from projection_helpers import put as checkpoint_put

    async def publish(topic: str, event: Event, skew_ms: int) -> None:
        env = to_envelope(event)
        await live.publisher.publish(topic, event.key, dataclasses.replace(env, produced_ms=env.produced_ms + skew_ms))

    before = await live.now_ms()
    for name, skew, ttl in (("ahead", HOUR, 0.1), ("behind", -HOUR, 30)):
        await publish(live.settings.store_topic, StorePut((root,), name, b'{"n": 1}', ttl, None), skew)
        await publish(live.settings.checkpoint_topic, checkpoint_put(f"{root}-{name}", 1), skew)
    after = await live.now_ms()
    items = f"prefix = '{root}'"
    threads = f"starts_with(thread_id, '{root}-')"

    async def all_projected() -> bool:
        counts = [
            await live.conn.fetchval(f"SELECT count(*) FROM {live.schema}.{table} WHERE {where}")
            for table, where in (("store", items), ("graphledger_thread_partitions", threads))
        ]
        return counts == [2, 2]

    await wait_for(all_projected, "the writers' events to be projected")
    rows = await live.conn.fetch(
        f"SELECT key, (extract(epoch FROM updated_at) * 1000)::bigint AS at, "
        f"(extract(epoch FROM expires_at - updated_at) * 1000)::bigint AS ttl FROM {live.schema}.store WHERE {items}"
    )
    activity = await live.conn.fetch(
        f"SELECT thread_id, (extract(epoch FROM last_active_at) * 1000)::bigint AS at "
        f"FROM {live.schema}.graphledger_thread_partitions WHERE {threads}"
    )
    for at in [r["at"] for r in rows] + [r["at"] for r in activity]:
        assert before - CLOCK_SLACK_MS <= at <= after + CLOCK_SLACK_MS, (before, at, after)
    assert {r["key"]: r["ttl"] for r in rows} == {"ahead": 6_000, "behind": 30 * MINUTE}

    # Thread TTL 30 minutes: the ahead writer's item expires within seconds; nothing of the behind one does.
    runners, stops, tasks = await _sweepers(live, 1, thread_ttl_minutes=30)
    await wait_for(lambda: _gone(live, "store", f"{items} AND key = 'ahead'"), "the ahead writer's item to expire")
    target = runners[0].sweeps + 2
    await wait_for(lambda: _ge(lambda: runners[0].sweeps, target), "two more sweeps")
    stops[0].set()
    await asyncio.gather(*tasks)
    assert [r["key"] for r in await live.conn.fetch(f"SELECT key FROM {live.schema}.store WHERE {items}")] == ["behind"]
    assert not await _gone(live, "checkpoints", threads)
    assert runners[0].published["idle_thread"] == 0

    # Thread TTL 6 seconds: the ahead writer's thread goes once idle that long, not an hour late.
    runners, stops, tasks = await _sweepers(live, 1, thread_ttl_minutes=0.1)
    await wait_for(lambda: _gone(live, "checkpoints", f"thread_id = '{root}-ahead'"), "the ahead writer's thread")
    stops[0].set()
    await asyncio.gather(*tasks)
    assert not await _gone(live, "store", f"{items} AND key = 'behind'")
