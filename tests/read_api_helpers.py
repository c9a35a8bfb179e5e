"""The read API in the test's process on real Postgres, for the tests in tests/integration/read_api/.

The agent's serde and the client-side decoding of answers; calls in msgpack or JSON; the app run with
its lifespan; settings naming the session's empty topics (`LOG`, filled by the directory's conftest.py);
and a projection filled by the official `AsyncPostgresSaver` (real serde) running real graphs that
leave every kind of row behind (`populate`).
"""

from __future__ import annotations

import base64
import operator
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated, Any

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
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import Command, Send, interrupt
from psycopg.rows import dict_row
from typing_extensions import TypedDict

from graphledger.settings import Settings
from graphledger.wire import JSON, MSGPACK
from graphledger_server.api.app import create_app
from graphledger_server.log.applied import AppliedOffsets

SCHEMA = "proj"  # not the default, so a query that ignored search_path would find nothing
OPAQUE = "x-test-opaque"  # a type no JsonPlusSerializer knows: the API must pass it through untouched
GET, LIST, DELTA = "/v1/checkpoints/get", "/v1/checkpoints/list", "/v1/checkpoints/delta-history"
VERDICTS = "/v1/checkpoints/verdicts"


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


def api_settings(dsn: str, log: Mapping[str, Any], schema: str, **overrides: Any) -> Settings:
    """A read API's settings on projection `schema` of `dsn`, over the session's empty topics `log`, its
    applied offsets those of a consumer group of its own."""
    values: dict[str, Any] = {
        **log,
        "postgres_dsn": dsn,
        "postgres_schema": schema,
        "projector_group_id": f"g{uuid.uuid4().hex[:8]}",
        "api_pool_size": 4,
    }
    return Settings(**{**values, **overrides})


def settings_for(dsn: str, **overrides: Any) -> Settings:
    return api_settings(dsn, LOG, SCHEMA, **overrides)


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
