"""The read API answers as AsyncPostgresSaver: the projection is filled by the official saver (real
serde) running real graphs, then every answer, decoded client-side, must equal what that saver returns
for the same arguments, in msgpack and JSON alike; values come back as the agent wrote them.
"""

from __future__ import annotations

import base64
from typing import Any

import orjson
import ormsgpack
import pytest
from langgraph.checkpoint.base import CheckpointTuple, empty_checkpoint
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.checkpoint.serde.types import TASKS
from langgraph.types import Send

from graphledger.wire import JSON, MSGPACK
from graphledger_server.api.models import DeltaHistoryResponse, GetResponse, ListResponse
from graphledger_server.projection.migrate import migrate
from read_api_helpers import (
    DELTA,
    GET,
    LIST,
    OPAQUE,
    SCHEMA,
    Api,
    answer,
    call,
    decode_history,
    decode_tuple,
    official_saver,
    ok,
    running,
    settings_for,
    thread,
)


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
