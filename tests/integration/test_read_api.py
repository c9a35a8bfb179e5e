"""The read API on real Postgres: parity with AsyncPostgresSaver, codecs, consistency, auth, errors.

The projection is filled by the official `AsyncPostgresSaver` (real serde) running real graphs, then
every API answer, decoded client-side, must equal what that saver returns for the same arguments.
"""

from __future__ import annotations

import asyncio
import base64
import operator
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import Annotated, Any

import asyncpg
import httpx
import orjson
import ormsgpack
import psycopg
import pytest
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import CheckpointTuple, empty_checkpoint
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.checkpoint.serde.types import TASKS
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import Command, Send, interrupt
from psycopg.rows import dict_row
from typing_extensions import TypedDict

from filled_log import FILLER_RECORDS
from graphledger.log.key_filter import KeyFilter
from graphledger.settings import Settings
from graphledger.wire import CONSISTENCY_HEADER, JSON, MSGPACK
from graphledger_server.api.app import create_app
from graphledger_server.api.db import open_pool
from graphledger_server.api.models import DeltaHistoryResponse, GetResponse, ListResponse
from graphledger_server.devstack.ports import free_port, wait_until
from graphledger_server.log.applied import APPLICATION_NAME, AppliedOffsets
from graphledger_server.log.key_filter import record as record_keys
from graphledger_server.log.key_filter import render_record
from graphledger_server.projection.migrate import migrate
from polling import wait_for

SCHEMA = "proj"  # not the default, so a query that ignored search_path would find nothing
OPAQUE = "x-test-opaque"  # a type no JsonPlusSerializer knows: the API must pass it through untouched
GET, LIST, DELTA = "/v1/checkpoints/get", "/v1/checkpoints/list", "/v1/checkpoints/delta-history"


# -- serde, decoding, HTTP --------------------------------------------------------------------------


class Opaque(bytes):
    """A value the agent's serde writes as `(OPAQUE, raw bytes)`, e.g. what an encrypting serde makes."""


class AgentSerde(JsonPlusSerializer):
    """The agent's serde: JsonPlus, plus `Opaque` values kept as raw bytes."""

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        return (OPAQUE, bytes(obj)) if isinstance(obj, Opaque) else super().dumps_typed(obj)

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        return Opaque(data[1]) if data[0] == OPAQUE else super().loads_typed(data)


SERDE = AgentSerde()


def _value(wire: dict[str, Any]) -> Any:
    if "t" not in wire:
        return wire["v"]
    data = wire["b"] if isinstance(wire["b"], bytes) else base64.b64decode(wire["b"])
    return SERDE.loads_typed((wire["t"], data))


def decode_tuple(raw: dict[str, Any] | None) -> CheckpointTuple | None:
    if raw is None:
        return None
    checkpoint = raw["checkpoint"]
    return CheckpointTuple(
        {"configurable": raw["config"]},
        {**checkpoint, "channel_values": {k: _value(v) for k, v in checkpoint["channel_values"].items()}},
        raw["metadata"],
        {"configurable": raw["parent_config"]} if raw["parent_config"] else None,
        [(task_id, channel, _value(v)) for task_id, channel, v, *_ in raw["pending_writes"]],
    )


def decode_history(raw: dict[str, Any]) -> dict[str, Any]:
    history: dict[str, Any] = {}
    for channel, entry in raw.items():
        history[channel] = {"writes": [(t, c, _value(v)) for t, c, v in entry["writes"]]}
        if "seed" in entry:
            history[channel]["seed"] = _value(entry["seed"])
    return history


async def call(
    client: httpx.AsyncClient, path: str, body: Any, fmt: str = "msgpack", headers: dict[str, str] | None = None
) -> httpx.Response:
    if fmt == "msgpack":
        content, sent = ormsgpack.packb(body), {"Content-Type": MSGPACK, "Accept": MSGPACK}
    else:
        content, sent = orjson.dumps(body), {"Content-Type": JSON, "Accept": JSON}
    return await client.post(path, content=content, headers={**sent, **(headers or {})})


def answer(response: httpx.Response) -> Any:
    if response.headers["content-type"].startswith(MSGPACK):
        return ormsgpack.unpackb(response.content)
    return response.json()


async def ok(client: httpx.AsyncClient, path: str, body: Any, fmt: str = "msgpack") -> Any:
    response = await call(client, path, body, fmt)
    assert response.status_code == 200, response.text
    return answer(response)


@dataclass
class Api:
    app: Any
    client: httpx.AsyncClient

    @property
    def offsets(self) -> AppliedOffsets:
        return self.app.state.api.offsets


@asynccontextmanager
async def running(settings: Settings) -> AsyncIterator[Api]:
    """The app in-process, lifespan included (ASGITransport alone does not run it)."""
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://read-api") as client:
            yield Api(app, client)


LOG: dict[str, Any] = {}
"""The session's empty topics (`empty_log`): the read API learns from them that nothing is unprojected."""


@pytest.fixture(autouse=True, scope="module")
def _empty_log(empty_log: dict[str, Any]) -> None:
    LOG.update(empty_log)


def settings_for(dsn: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        **LOG,
        "postgres_dsn": dsn,
        "postgres_schema": SCHEMA,
        "projector_group_id": f"g{uuid.uuid4().hex[:8]}",
        "api_pool_size": 4,
    }
    return Settings(**{**values, **overrides})


@asynccontextmanager
async def official_saver(dsn: str) -> AsyncIterator[AsyncPostgresSaver]:
    """The official saver on the projection schema, set up as `from_conn_string` sets it up."""
    async with await psycopg.AsyncConnection.connect(
        dsn, autocommit=True, prepare_threshold=0, row_factory=dict_row, options=f"-c search_path={SCHEMA}"
    ) as conn:
        yield AsyncPostgresSaver(conn, serde=SERDE)


# -- graphs that leave every kind of row behind ------------------------------------------------------


class Parent(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    results: Annotated[list[str], operator.add]


class Child(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


class WorkItem(TypedDict):
    item: int


def _reply(state: Child) -> dict:
    return {"messages": [AIMessage("from the subgraph")]}


def _fan_out(state: Parent) -> list[Send]:
    return [Send("worker", {"item": i}) for i in range(3)]


def _worker(arg: WorkItem) -> dict:
    return {"results": [f"done {arg['item']}"]}


def _ask(state: Parent) -> dict:
    return {"messages": [HumanMessage(interrupt("approve?"))]}


def agent_graph() -> StateGraph:
    """A subgraph (namespaces), Send fan-out (task writes) and an interrupt (pending writes)."""
    child = StateGraph(Child)
    child.add_node("reply", _reply)
    child.add_edge(START, "reply")
    graph = StateGraph(Parent)
    graph.add_node("child", child.compile())
    graph.add_node("worker", _worker)
    graph.add_node("ask", _ask)
    graph.add_edge(START, "child")
    graph.add_conditional_edges("child", _fan_out, ["worker"])
    graph.add_edge("worker", "ask")
    graph.add_edge("ask", END)
    return graph


class Failing(TypedDict):
    results: Annotated[list[str], operator.add]


def _fine(state: Failing) -> dict:
    return {"results": ["fine"]}


def _boom(state: Failing) -> dict:
    raise ValueError("boom")


def failing_graph() -> StateGraph:
    """Two parallel nodes, one raising: the other's writes and the error stay as pending writes."""
    graph = StateGraph(Failing)
    graph.add_node("fine", _fine)
    graph.add_node("boom", _boom)
    graph.add_edge(START, "fine")
    graph.add_edge(START, "boom")
    return graph


def _extend(state: list | None, writes: list[list]) -> list:
    return [*(state or []), *(x for w in writes for x in w)]


class Delta(TypedDict):
    items: Annotated[list, DeltaChannel(_extend, snapshot_frequency=3)]
    n: int


def _count(state: Delta) -> dict:
    return {"items": [f"x{state.get('n', 0)}"], "n": state.get("n", 0) + 1}


def delta_graph() -> StateGraph:
    graph = StateGraph(Delta)
    graph.add_node("count", _count)
    graph.add_edge(START, "count")
    return graph


def thread(thread_id: str, ns: str | None = None, checkpoint_id: str | None = None) -> dict[str, Any]:
    configurable: dict[str, Any] = {"thread_id": thread_id}
    if ns is not None:
        configurable["checkpoint_ns"] = ns
    if checkpoint_id is not None:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


EMPTY_BLOB_SQL = "INSERT INTO checkpoint_blobs VALUES (%s, %s, %s, %s, 'empty', NULL)"


async def populate(saver: AsyncPostgresSaver) -> None:
    agent = agent_graph().compile(checkpointer=saver)
    await agent.ainvoke({"messages": [HumanMessage("hi")]}, thread("agent"))
    await agent.ainvoke(Command(resume="yes"), thread("agent"))
    await agent.ainvoke({"messages": [HumanMessage("again")]}, thread("agent-waiting"))  # left interrupted

    with pytest.raises(ValueError, match="boom"):
        await failing_graph().compile(checkpointer=saver).ainvoke({"results": []}, thread("failing"))

    delta = delta_graph().compile(checkpointer=saver)
    for i in range(7):
        await delta.ainvoke({"items": [f"in{i}"]}, thread("delta"))

    # Written directly: every inline primitive, an opaque blob, a channel whose blob is the "empty"
    # sentinel (older savers wrote those), nested metadata to filter on, and writes whose order comes
    # from task_path, not from insertion.
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {
        "text": "plain",
        "count": 3,
        "ratio": 0.5,
        "flag": True,
        "nothing": None,
        "opaque": Opaque(b"\x00\xffraw bytes\x00"),
        "listed": [1, "two"],
    }
    checkpoint["channel_versions"] = {k: "1" for k in [*checkpoint["channel_values"], "gone"]}
    metadata = {"source": "import", "step": -1, "tags": ["a", "b"], "nested": {"k": 1}, "user": "alice"}
    config = await saver.aput(thread("direct", ""), checkpoint, metadata, checkpoint["channel_versions"])
    await saver.aput_writes(config, [("listed", Opaque(b"\x01late")), ("text", "w2")], "task-b", "~1")
    await saver.aput_writes(config, [("text", "w1")], "task-a", "~0")
    await saver.conn.execute(EMPTY_BLOB_SQL, ("direct", "", "gone", "1"))


@pytest.fixture(scope="module")
async def projection(pg: Any) -> str:
    """DSN of a migrated database whose projection the official saver filled; shared by the module."""
    dsn = pg.create_database(f"t_{uuid.uuid4().hex[:12]}")
    await migrate(dsn, SCHEMA)
    async with official_saver(dsn) as saver:
        await populate(saver)
    return dsn


@pytest.fixture(scope="module")
async def api(projection: str) -> AsyncIterator[Api]:
    async with running(settings_for(projection)) as running_api:
        yield running_api


@pytest.fixture(scope="module")
async def saver(projection: str) -> AsyncIterator[AsyncPostgresSaver]:
    async with official_saver(projection) as official:
        yield official


# -- parity with the official saver -----------------------------------------------------------------


async def every_checkpoint(saver: AsyncPostgresSaver) -> list[CheckpointTuple]:
    return [t async for t in saver.alist(None)]


def ids(found: CheckpointTuple) -> dict[str, Any]:
    return found.config["configurable"]


@pytest.mark.parametrize("fmt", ["msgpack", "json"])
async def test_get_matches_official_for_every_checkpoint_and_namespace(
    api: Api, saver: AsyncPostgresSaver, fmt: str
) -> None:
    everything = await every_checkpoint(saver)
    namespaces = {(ids(t)["thread_id"], ids(t)["checkpoint_ns"]) for t in everything}
    assert any(ns for _, ns in namespaces), "the subgraph wrote no namespaced checkpoint"
    assert any(t.pending_writes for t in everything)
    configs = [t.config for t in everything] + [thread(tid, ns) for tid, ns in namespaces]
    configs += [thread("agent", "", "no-such-id"), thread("no-such-thread", "")]
    for config in configs:
        configurable = config["configurable"]
        body = {k: configurable[k] for k in ("thread_id", "checkpoint_ns", "checkpoint_id") if k in configurable}
        got = await ok(api.client, GET, body, fmt)
        GetResponse.model_validate(got)
        assert decode_tuple(got["tuple"]) == await saver.aget_tuple(config), config


def _list_cases(everything: list[CheckpointTuple]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(request body, alist kwargs) pairs covering config, namespace, filter, before and limit."""
    agent = [t for t in everything if ids(t)["thread_id"] == "agent"]
    middle = ids(agent[len(agent) // 2])["checkpoint_id"]
    child_ns = next(ids(t)["checkpoint_ns"] for t in agent if ids(t)["checkpoint_ns"])
    return [
        ({}, {"config": None}),
        ({"limit": 3}, {"config": None, "limit": 3}),
        ({"filter": {"source": "loop"}}, {"config": None, "filter": {"source": "loop"}}),
        ({"filter": {"nested": {"k": 1}}}, {"config": None, "filter": {"nested": {"k": 1}}}),
        ({"filter": {"tags": ["b"]}}, {"config": None, "filter": {"tags": ["b"]}}),
        ({"filter": {"source": "nowhere"}}, {"config": None, "filter": {"source": "nowhere"}}),
        ({"filter": {}}, {"config": None, "filter": {}}),
        ({"thread_id": "agent"}, {"config": thread("agent")}),
        ({"thread_id": "agent", "checkpoint_ns": ""}, {"config": thread("agent", "")}),
        ({"thread_id": "agent", "checkpoint_ns": child_ns}, {"config": thread("agent", child_ns)}),
        ({"thread_id": "agent", "checkpoint_id": middle}, {"config": thread("agent", None, middle)}),
        (
            {"thread_id": "agent", "before_checkpoint_id": middle},
            {"config": thread("agent"), "before": thread("", None, middle)},
        ),
        (
            {"thread_id": "agent", "checkpoint_ns": "", "before_checkpoint_id": middle, "limit": 2},
            {"config": thread("agent", ""), "before": thread("", None, middle), "limit": 2},
        ),
        ({"before_checkpoint_id": middle}, {"config": None, "before": thread("", None, middle)}),
        ({"thread_id": "agent", "filter": {"step": 1}}, {"config": thread("agent"), "filter": {"step": 1}}),
        ({"thread_id": "agent", "limit": 0}, {"config": thread("agent"), "limit": 0}),
        (
            {"thread_id": "delta", "filter": {"source": "input"}},
            {"config": thread("delta"), "filter": {"source": "input"}},
        ),
        ({"thread_id": "no-such-thread"}, {"config": thread("no-such-thread")}),
    ]


@pytest.mark.parametrize("fmt", ["msgpack", "json"])
async def test_list_matches_official(api: Api, saver: AsyncPostgresSaver, fmt: str) -> None:
    for body, kwargs in _list_cases(await every_checkpoint(saver)):
        config = kwargs.pop("config")
        got = await ok(api.client, LIST, body, fmt)
        ListResponse.model_validate(got)
        expected = [t async for t in saver.alist(config, **kwargs)]
        assert [decode_tuple(t) for t in got["tuples"]] == expected, body


@pytest.mark.parametrize("fmt", ["msgpack", "json"])
async def test_delta_history_matches_official(api: Api, saver: AsyncPostgresSaver, fmt: str) -> None:
    delta = [t async for t in saver.alist(thread("delta"))]
    channels = ["items", "n", "no-such-channel"]
    configs = [t.config for t in delta] + [thread("delta", ""), thread("no-such-thread", "")]
    seeded = 0
    for config in configs:
        body = {**config["configurable"], "channels": channels}
        got = await ok(api.client, DELTA, body, fmt)
        DeltaHistoryResponse.model_validate(got)
        expected = await saver.aget_delta_channel_history(config=config, channels=channels)
        assert decode_history(got["history"]) == expected, config
        seeded += "seed" in expected["items"]
    assert seeded, "no checkpoint of the DeltaChannel thread has a snapshot seed"
    assert await ok(api.client, DELTA, {"thread_id": "delta", "channels": []}) == {"history": {}}


async def test_values_come_back_as_the_agent_wrote_them(api: Api) -> None:
    """Opaque bytes pass through untouched (a type no service could decode); primitives stay inline."""
    got = await ok(api.client, GET, {"thread_id": "direct"})
    values = got["tuple"]["checkpoint"]["channel_values"]
    assert values["opaque"] == {"t": OPAQUE, "b": b"\x00\xffraw bytes\x00"}
    assert values["listed"]["t"] == "msgpack"
    assert {k: values[k] for k in ("text", "count", "ratio", "flag", "nothing")} == {
        "text": {"v": "plain"},
        "count": {"v": 3},
        "ratio": {"v": 0.5},
        "flag": {"v": True},
        "nothing": {"v": None},
    }
    assert "gone" not in values  # its blob is the "empty" sentinel
    writes = got["tuple"]["pending_writes"]
    assert [(w[0], w[1]) for w in writes] == [("task-a", "text"), ("task-b", "listed"), ("task-b", "text")]
    assert writes[1][2] == {"t": OPAQUE, "b": b"\x01late"}

    as_json = await ok(api.client, GET, {"thread_id": "direct"}, "json")
    opaque = as_json["tuple"]["checkpoint"]["channel_values"]["opaque"]
    assert base64.b64decode(opaque["b"]) == b"\x00\xffraw bytes\x00"


async def test_request_codecs_are_independent_of_the_response_codec(api: Api) -> None:
    json_in = await api.client.post(GET, content=orjson.dumps({"thread_id": "direct"}), headers={"Accept": MSGPACK})
    assert json_in.headers["content-type"] == MSGPACK
    msgpack_in = await api.client.post(
        GET, content=ormsgpack.packb({"thread_id": "direct"}), headers={"Content-Type": MSGPACK}
    )
    assert msgpack_in.headers["content-type"] == JSON
    assert answer(json_in)["tuple"]["config"] == answer(msgpack_in)["tuple"]["config"]


async def test_legacy_pending_sends_are_refused_clearly(fresh_database: str) -> None:
    """A checkpoint older than format v4 needs its parent's sends re-encoded, which the API cannot do."""
    await migrate(fresh_database, SCHEMA)
    async with official_saver(fresh_database) as saver:
        parent = {**empty_checkpoint(), "v": 3}
        parent_config = await saver.aput(thread("legacy", ""), parent, {}, {})
        await saver.aput_writes(parent_config, [(TASKS, Send("node", 1))], "task")
        child = {**empty_checkpoint(), "v": 3}
        await saver.aput(parent_config, child, {}, {})
        assert (await saver.aget_tuple(thread("legacy", ""))).checkpoint["channel_values"][TASKS]
    async with running(settings_for(fresh_database)) as legacy:
        response = await call(legacy.client, GET, {"thread_id": "legacy"})
    assert response.status_code == 501
    assert answer(response) | {"message": ""} == {"error": "legacy_checkpoint", "message": "", "retryable": False}


# -- consistency tokens -----------------------------------------------------------------------------


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


# -- bad input --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        (GET, {}, "thread_id"),
        (GET, {"thread_id": ""}, "thread_id"),
        (GET, {"thread_id": "a\x00b"}, "thread_id"),
        (GET, {"thread_id": 7}, "thread_id"),
        (GET, {"thread_id": "t", "checkpoint_ns": "a\x00"}, "checkpoint_ns"),
        (GET, {"thread_id": "t", "fliter": {}}, "fliter"),
        (GET, ["thread_id"], "body"),
        (LIST, {"limit": -1}, "limit"),
        (LIST, {"limit": "5"}, "limit"),
        (LIST, {"filter": {"user": "a\x00"}}, "filter"),
        (LIST, {"filter": {"a\x00": 1}}, "filter"),
        (LIST, {"checkpoint_ns": ""}, "thread_id"),
        (DELTA, {"thread_id": "t"}, "channels"),
        (DELTA, {"thread_id": "t", "channels": "items"}, "channels"),
    ],
)
@pytest.mark.parametrize("fmt", ["msgpack", "json"])
async def test_bad_bodies_are_a_422_naming_the_field(api: Api, path: str, body: Any, field: str, fmt: str) -> None:
    response = await call(api.client, path, body, fmt)
    assert response.status_code == 422, response.text
    error = answer(response)
    assert error["error"] == "invalid_request" and error["retryable"] is False
    assert field in error["message"]


@pytest.mark.parametrize(
    ("content", "content_type", "status"),
    [
        (b"{not json", JSON, 400),
        (b"\xc1", MSGPACK, 400),
        (b"", JSON, 422),
        (b"thread_id=t", "application/x-www-form-urlencoded", 415),
        (orjson.dumps({"thread_id": "t" * 2_000_000}), JSON, 413),
    ],
)
async def test_undecodable_bodies_are_refused(api: Api, content: bytes, content_type: str, status: int) -> None:
    response = await api.client.post(GET, content=content, headers={"Content-Type": content_type})
    assert response.status_code == status
    assert set(response.json()) == {"error", "message", "retryable"}


async def test_unknown_paths_and_methods_use_the_error_format(api: Api) -> None:
    missing = await api.client.post("/v1/checkpoints/nope", headers={"Accept": MSGPACK})
    assert missing.status_code == 404 and answer(missing)["error"] == "not_found"
    wrong_method = await api.client.get(GET)
    assert wrong_method.status_code == 405 and wrong_method.json()["error"] == "method_not_allowed"


# -- auth, health, schema, outages ------------------------------------------------------------------


async def test_bearer_token_guards_reads_but_not_health(projection: str) -> None:
    async with running(settings_for(projection, api_token="s3cret")) as guarded:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic czNjcmV0"}):
            response = await call(guarded.client, GET, {"thread_id": "direct"}, headers=headers)
            assert response.status_code == 401
            assert response.headers["www-authenticate"] == "Bearer"
            assert answer(response)["error"] == "unauthorized"
        right = await call(guarded.client, GET, {"thread_id": "direct"}, headers={"Authorization": "Bearer s3cret"})
        assert right.status_code == 200
        assert (await guarded.client.get("/healthz")).status_code == 200
        assert (await guarded.client.get("/readyz")).status_code == 200


@pytest.mark.parametrize(("host", "keys_status"), [("127.0.0.1", 200), ("0.0.0.0", 403)])
async def test_without_a_token_keys_and_erasure_need_a_loopback_api(
    projection: str, host: str, keys_status: int
) -> None:
    """No token configured: everyone reads; keys and erasure only where nobody but this host can ask
    (`graphledger dev`). On every address they are refused, saying what to configure."""
    async with running(settings_for(projection, api_host=host)) as anonymous:
        assert (await call(anonymous.client, GET, {"thread_id": "direct"})).status_code == 200
        keys = await call(anonymous.client, "/v1/keys", {"subjects": [{"kind": "thread", "name": "anonymous-t"}]})
        # A body naming nothing: past the permission check it is a 422, and erases nothing in the shared log.
        erase = await call(anonymous.client, "/v1/erase", {})
    assert keys.status_code == keys_status, answer(keys)
    if keys_status == 200:
        assert len(answer(keys)["keys"][0]["key"]) == 32
        assert erase.status_code == 422 and answer(erase)["error"] == "invalid_request", answer(erase)
        return
    for refused in (keys, erase):
        assert refused.status_code == 403 and answer(refused)["error"] == "token_required"
        assert "GRAPHLEDGER_API_HOST" in answer(refused)["message"]


async def test_openapi_documents_the_three_reads(api: Api) -> None:
    schema = (await api.client.get("/openapi.json")).json()
    for path in (GET, LIST, DELTA):
        content = schema["paths"][path]["post"]["requestBody"]["content"]
        assert set(content) == {JSON, MSGPACK}
        assert "thread_id" in content[JSON]["schema"]["properties"]
    assert "channels" in schema["paths"][DELTA]["post"]["requestBody"]["content"][MSGPACK]["schema"]["required"]
    assert {"/healthz", "/readyz"} <= set(schema["paths"])
    # The bearer token (checked by middleware, not a dependency) is declared on every /v1 operation.
    assert schema["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    for path, operations in schema["paths"].items():
        for operation in operations.values():
            assert (operation.get("security") == [{"HTTPBearer": []}]) == path.startswith("/v1/"), path


async def test_readyz_needs_the_migrated_schema(api: Api, fresh_database: str) -> None:
    assert (await api.client.get("/readyz")).status_code == 200
    async with running(settings_for(fresh_database)) as unmigrated:
        assert (await unmigrated.client.get("/healthz")).status_code == 200
        response = await unmigrated.client.get("/readyz")
        assert response.status_code == 503
        assert response.json()["error"] == "not_ready" and response.json()["retryable"] is True
        read = await call(unmigrated.client, GET, {"thread_id": "t"})
        assert read.status_code == 503 and answer(read)["error"] == "not_ready"


async def test_the_pool_hands_out_the_connection_returned_last(projection: str) -> None:
    """At low load reads stay on the backend that ran the last one (warm caches), not on each of the
    pool's connections in turn; `check()` keeps every connection."""
    pool = open_pool(settings_for(projection, api_pool_size=3))
    await pool.open(wait=True)
    try:

        async def backend(conn: psycopg.AsyncConnection[Any]) -> int:
            return (await (await conn.execute("SELECT pg_backend_pid() AS pid")).fetchone())["pid"]

        taken = [await pool.getconn() for _ in range(3)]
        pids = [await backend(conn) for conn in taken]
        for conn in taken:
            await pool.putconn(conn)
        for _ in range(3):
            async with pool.connection() as conn:
                assert await backend(conn) == pids[-1]
        await pool.check()
        assert pool.get_stats()["pool_available"] == 3
        async with pool.connection() as a, pool.connection() as b:
            assert {await backend(a), await backend(b)} <= set(pids)
    finally:
        await pool.close()


async def test_a_store_read_that_gets_no_connection_in_time_is_a_retryable_503(projection: str) -> None:
    """The store reads' pool (asyncpg) answers as the checkpoint reads' does when every connection is
    busy: a 503 after `api_pool_timeout_s`, not a wait without end."""
    async with running(settings_for(projection, api_pool_size=1, api_pool_timeout_s=0.3)) as busy:
        store_pool = busy.app.state.api.store_pool
        # A first read, as every process makes: the tenant's hashing key (which the key store, on the
        # same pool, answers) is cached from then on, and what follows is about the reads' own connection.
        get = {"ops": [{"op": "get", "namespace": ["a"], "key": "k"}]}
        assert (await call(busy.client, "/v1/store/batch", get)).status_code == 200
        async with store_pool.acquire():  # the pool's only connection, held
            read = call(busy.client, "/v1/store/batch", get)
            response = await asyncio.wait_for(read, 10.0)
        assert response.status_code == 503 and response.headers["retry-after"] == "1"
        assert answer(response)["error"] == "postgres_unavailable" and answer(response)["retryable"] is True
        # Released, the connection serves the next read.
        again = await call(busy.client, "/v1/store/batch", get)
        assert again.status_code == 200


async def test_unreachable_postgres_is_a_retryable_503_not_a_500() -> None:
    nowhere = f"postgresql://postgres@127.0.0.1:{free_port()}/postgres?connect_timeout=1"
    async with running(settings_for(nowhere, api_pool_timeout_s=0.3)) as cut_off:
        assert (await cut_off.client.get("/healthz")).status_code == 200
        store_reads = [{"op": "get", "namespace": ["a"], "key": "k"}, {"op": "search", "namespace_prefix": ["a"]}]
        for response in (
            await cut_off.client.get("/readyz"),
            await call(cut_off.client, GET, {"thread_id": "t"}),
            await call(cut_off.client, "/v1/store/batch", {"ops": store_reads}),  # asyncpg's pool, not psycopg's
        ):
            assert response.status_code == 503
            assert response.headers["retry-after"] == "1"
            body = answer(response)
            assert body["retryable"] is True
            assert "select" not in body["message"].lower()


async def test_error_bodies_name_the_failure_not_the_internal_addresses(projection: str) -> None:
    """An unreachable broker or key store is a retryable 503 whose body says which failed; the address
    the driver's message names stays in the log."""
    broker = f"127.0.0.1:{free_port()}"
    database = f"postgresql://postgres@127.0.0.1:{free_port()}/postgres?connect_timeout=1"
    no_broker = settings_for(projection, kafka_bootstrap_servers=broker, consistency_timeout_s=1)
    no_database = settings_for(database, api_pool_timeout_s=0.5)
    async with running(no_broker) as api:
        log = await call(api.client, GET, {"thread_id": "direct"})
    async with running(no_database) as api:
        keys = await call(api.client, "/v1/keys", {"subjects": [{"kind": "thread", "name": "t"}]})
    for response, code in ((log, "log_unavailable"), (keys, "key_store_unavailable")):
        body = answer(response)
        assert response.status_code == 503 and body["error"] == code and body["retryable"] is True, body
        assert "127.0.0.1" not in body["message"] and broker.split(":")[1] not in body["message"], body


# -- the process ------------------------------------------------------------------------------------


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
async def test_the_process_serves_and_stops_cleanly_on_a_signal(projection: str, stop: signal.Signals) -> None:
    await asyncio.to_thread(serve_and_stop, projection, stop)


def serve_and_stop(projection: str, stop: signal.Signals) -> None:
    """`python -m graphledger_server.api` from the environment: ready, answers, exits 0 on `stop`."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRAPHLEDGER_")}
    env |= {
        "GRAPHLEDGER_POSTGRES_DSN": projection,
        "GRAPHLEDGER_POSTGRES_SCHEMA": SCHEMA,
        "GRAPHLEDGER_API_PORT": str(port),
        "GRAPHLEDGER_KEY_ENCRYPTION_KEYS": os.environ["GRAPHLEDGER_KEY_ENCRYPTION_KEYS"],
        **{f"GRAPHLEDGER_{name.upper()}": str(value) for name, value in LOG.items()},
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "graphledger_server.api"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:

        def ready() -> bool:
            assert process.poll() is None, process.communicate()[0].decode()
            try:
                return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(ready, 30, "the read API process to be ready")
        response = httpx.post(f"http://127.0.0.1:{port}{GET}", json={"thread_id": "direct"}, timeout=5)
        assert response.status_code == 200
        assert response.json()["tuple"]["metadata"]["user"] == "alice"
        started = time.monotonic()
        process.send_signal(stop)
        output = process.communicate(timeout=15)[0].decode()
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, output
    assert time.monotonic() - started < 10
    assert "Traceback" not in output


async def test_the_key_filter_is_served_with_the_offset_below_which_it_holds_every_key(pg: Any) -> None:
    """A partition's words and its applied offset, as the projector committed them together; a partition the
    projector had applied before the filter existed is served as not complete, so no client proves with it."""
    dsn = pg.create_database(f"t_{uuid.uuid4().hex[:12]}")
    await migrate(dsn, SCHEMA)
    settings = settings_for(dsn)
    topic, group = settings.checkpoint_topic, settings.projector_group_id
    conn = await asyncpg.connect(dsn)
    try:
        await record_keys(conn, render_record(SCHEMA), topic, [(2, b"thread-a"), (2, b"thread-b"), (1, b"thread-c")])
        insert = f"INSERT INTO {SCHEMA}.graphledger_offsets (consumer_group, topic, partition, next_offset"
        await conn.execute(f"{insert}) VALUES ($1, $2, 2, 40)", group, topic)
        await conn.execute(f"{insert}, key_filter_complete) VALUES ($1, $2, 1, 9, false)", group, topic)
    finally:
        await conn.close()
    async with running(settings) as served:
        copy = KeyFilter.from_answer(await ok(served.client, "/v1/checkpoints/key-filter", {"partition": 2}))
        assert copy is not None and copy.through == 40
        assert copy.may_hold(b"thread-a") and copy.may_hold(b"thread-b") and not copy.may_hold(b"thread-c")
        older = await ok(served.client, "/v1/checkpoints/key-filter", {"partition": 1})
        assert older["complete"] is False and KeyFilter.from_answer(older) is None
        untouched = await ok(served.client, "/v1/checkpoints/key-filter", {"partition": 3})
        assert untouched["through"] == 0 and untouched["complete"] is True and untouched["indexes"] == b""
        refused = await call(served.client, "/v1/checkpoints/key-filter", {"partition": -1})
        assert refused.status_code == 422 and "partition" in refused.text, refused.text
