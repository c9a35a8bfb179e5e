"""Reads at the log's end without the projector (invariant 5): the read API folds a thread's (or a store
item's) unprojected records onto the projection's answer, and that answer is the one the projection
gives once it has applied them.

Two clients in one test process stand for two agent processes: each holds only what it wrote or read
itself, so the reader's get goes to the read API. No projector runs until the test starts one; every
record is sealed with its subject's (or a fresh) key, as a deployment writes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from operator import add
from typing import Annotated, Any, TypedDict

import httpx
import ormsgpack
import pytest
from aiokafka.partitioner import murmur2
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.graph import START, StateGraph

from graphledger import KafkaSaver, KafkaStore
from graphledger.errors import ReadApiError
from graphledger.events import envelope, to_envelope
from graphledger.events.checkpoint import ThreadCopyBarrier
from graphledger.events.envelope import Envelope
from graphledger.settings import Settings
from graphledger.wire import MSGPACK
from graphledger_server.api.consistency import unprojected
from graphledger_server.api.main import server as api_server
from graphledger_server.devstack.ports import free_port
from graphledger_server.log.clients import new_consumer
from graphledger_server.projector.main import run_projector
from kafka_clients import raw_producer
from polling import WAIT_S, wait_for
from projection_helpers import put

CONSISTENCY_TIMEOUT_S = 3.0
"""A read that waits for the projector fails after this: a read that must not wait answers well within it."""


class Chat(TypedDict):
    messages: Annotated[list[str], add]


def _reply(state: Chat) -> dict[str, Any]:
    return {"messages": [f"reply to {state['messages'][-1]}"]}


def chat(saver: KafkaSaver) -> Any:
    builder = StateGraph(Chat)
    builder.add_node("reply", _reply)
    builder.add_edge(START, "reply")
    return builder.compile(checkpointer=saver)


@pytest.fixture
async def settings(ready_settings: Callable[..., Awaitable[Settings]]) -> Settings:
    port = free_port()
    return await ready_settings(
        api_port=port,
        api_url=f"http://127.0.0.1:{port}",
        consistency_timeout_s=CONSISTENCY_TIMEOUT_S,
        batch_max_wait_ms=5,
    )


@contextlib.asynccontextmanager
async def read_api(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """The read API in this process (uvicorn on its port), and an HTTP client of it."""
    api = api_server(settings)
    serving = asyncio.create_task(api.serve())

    async def started() -> bool:
        if serving.done():
            serving.result()
        return bool(api.started)

    try:
        await wait_for(started, "the read API to listen")
        async with httpx.AsyncClient(base_url=settings.api_url, timeout=30) as client:
            yield client
    finally:
        api.should_exit = True
        await asyncio.wait_for(serving, WAIT_S)


@contextlib.asynccontextmanager
async def projector(settings: Settings) -> AsyncIterator[None]:
    stop = asyncio.Event()
    task = asyncio.create_task(run_projector(settings, stop, migrate_first=False))
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, WAIT_S)


async def post(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    response = await client.post(
        path, content=ormsgpack.packb(body), headers={"content-type": MSGPACK, "accept": MSGPACK}
    )
    return response.status_code, ormsgpack.unpackb(response.content)


async def get(client: httpx.AsyncClient, thread_id: str, checkpoint_id: str | None = None) -> dict[str, Any]:
    """The read API's get answer, less where the log ended (which moves as tests write)."""
    status, answer = await post(
        client, "/v1/checkpoints/get", {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": checkpoint_id}
    )
    assert status == 200, answer
    return {k: v for k, v in answer.items() if k not in ("log_end", "log_partition", "own_writes_from")}


async def history(client: httpx.AsyncClient, thread_id: str, channels: list[str]) -> dict[str, Any]:
    status, answer = await post(
        client, "/v1/checkpoints/delta-history", {"thread_id": thread_id, "checkpoint_ns": "", "channels": channels}
    )
    assert status == 200, answer
    return answer["history"]  # type: ignore[no-any-return]


async def fully_projected(settings: Settings, client: httpx.AsyncClient) -> None:
    """Wait until a read across threads (which waits for the whole topic) answers: everything applied."""

    async def listed() -> bool:
        status, _ = await post(client, "/v1/checkpoints/list", {"limit": 1})
        return status == 200

    await wait_for(listed, "the projector to apply the whole log")


async def test_another_process_reads_a_thread_at_once_as_the_projection_will_answer_it(settings: Settings) -> None:
    async with read_api(settings) as client, KafkaSaver(settings) as a, KafkaSaver(settings) as b:
        config = {"configurable": {"thread_id": "t-hop"}}
        # Turns in process a, then in b, then in a again: each reads what the other wrote, no projector.
        started = time.monotonic()
        await chat(a).ainvoke({"messages": ["m1"]}, config)
        await chat(a).ainvoke({"messages": ["m2"]}, config)
        assert (await chat(b).ainvoke({"messages": ["m3"]}, config))["messages"] == [
            "m1", "reply to m1", "m2", "reply to m2", "m3", "reply to m3"
        ]  # fmt: skip
        state = await chat(a).aget_state(config)
        assert state.values["messages"][-2:] == ["m3", "reply to m3"]
        assert time.monotonic() - started < CONSISTENCY_TIMEOUT_S  # no read waited for the deadline
        # The answers a read-through gives now ...
        newest = await get(client, "t-hop")
        parent = newest["tuple"]["parent_config"]["checkpoint_id"]
        older = await get(client, "t-hop", parent)
        channels = list(newest["tuple"]["checkpoint"]["channel_values"])
        delta = await history(client, "t-hop", channels)
        async with projector(settings):
            await fully_projected(settings, client)
            # ... are the projection's, once it has applied the same records.
            assert await get(client, "t-hop") == newest
            assert await get(client, "t-hop", parent) == older
            assert await history(client, "t-hop", channels) == delta


async def test_writes_ahead_of_their_put_come_with_the_answer_as_the_projection_gives_them(settings: Settings) -> None:
    async with read_api(settings) as client, KafkaSaver(settings) as a, KafkaSaver(settings) as b:
        config = {"configurable": {"thread_id": "t-ahead", "checkpoint_ns": ""}}
        first, second = empty_checkpoint(), empty_checkpoint()
        await a.aput(config, first, {"source": "input", "step": -1}, {})
        ahead = {"configurable": {**config["configurable"], "checkpoint_id": second["id"]}}
        await b.aput_writes(ahead, [("x", 1)], "task")  # another process's writes, before their put
        folded = await get(client, "t-ahead")
        assert folded["tuple"]["config"]["checkpoint_id"] == first["id"]
        # A client holding the thread from this answer folds them in when the checkpoint is put.
        assert list(folded["later_writes"]) == [second["id"]]
        async with projector(settings):
            await fully_projected(settings, client)
            assert await get(client, "t-ahead") == folded


async def test_a_history_over_writes_the_projection_applied_before_their_put_waits_for_it(settings: Settings) -> None:
    """Writes the projector applied ahead of their put are in no answer the fold starts from: a DeltaChannel
    history of a child of their checkpoint folded without them would lack them, so it waits, as a get does."""
    async with read_api(settings) as client, KafkaSaver(settings) as a, KafkaSaver(settings) as b:
        config = {"configurable": {"thread_id": "t-early", "checkpoint_ns": ""}}
        first, second, third = empty_checkpoint(), empty_checkpoint(), empty_checkpoint()
        await a.aput(config, first, {"source": "input", "step": -1}, {})
        at = {"configurable": {**config["configurable"], "checkpoint_id": second["id"]}}
        await b.aput_writes(at, [("x", 1)], "task")  # before their put
        async with projector(settings):
            await fully_projected(settings, client)
        parent = {"configurable": {**config["configurable"], "checkpoint_id": first["id"]}}
        await a.aput(parent, second, {"source": "loop", "step": 0}, {})
        await a.aput(at, third, {"source": "loop", "step": 1}, {})
        body = {"thread_id": "t-early", "checkpoint_ns": "", "channels": ["x"]}
        status, answer = await post(client, "/v1/checkpoints/delta-history", body)
        assert status == 503 and answer["error"] == "consistency_timeout", answer
        async with projector(settings):
            await fully_projected(settings, client)
            writes = (await history(client, "t-early", ["x"]))["x"]["writes"]
            assert [(channel, ormsgpack.unpackb(value["b"])) for _, channel, value in writes] == [("x", 1)]


async def test_a_write_after_its_thread_was_erased_is_not_read_though_the_projector_applied_the_erasure_unread(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The read API reads a partition only for a read of it, so the projector applies the erasure first.
    monkeypatch.setattr(unprojected, "FOLLOW_INTERVAL_S", 3600.0)
    async with read_api(settings) as client, KafkaSaver(settings) as writer, KafkaSaver(settings) as eraser:
        config = {"configurable": {"thread_id": "t-erased", "checkpoint_ns": ""}}
        await writer.aput(config, empty_checkpoint(), {"source": "input", "step": -1}, {})
        assert (await get(client, "t-erased"))["tuple"] is not None  # read through: the thread's key is held
        async with projector(settings):
            await fully_projected(settings, client)
            await eraser.aerase_thread("t-erased")
        # The writer still holds the key: its record is sealed with the erased key, and unprojected.
        await writer.aput(config, empty_checkpoint(), {"source": "loop", "step": 0}, {})
        # Its erasure is read before it: the fold cannot tell an erasure's effect, so the read waits.
        status, answer = await post(client, "/v1/checkpoints/get", {"thread_id": "t-erased", "checkpoint_ns": ""})
        assert status == 503 and answer["error"] == "consistency_timeout", answer
        async with projector(settings):
            await fully_projected(settings, client)
            assert await get(client, "t-erased") == {"tuple": None, "erased": True}


async def test_a_reader_that_never_read_a_thread_learns_from_the_projection_that_it_was_erased(
    settings: Settings,
) -> None:
    """A get the read API answers from the projection (it holds no view of the thread) says whether the
    key store recorded the thread as erased, so the client refuses its writes; a thread that never
    existed reads as new."""
    config = {"configurable": {"thread_id": "t-gone", "checkpoint_ns": ""}}
    async with read_api(settings) as client, KafkaSaver(settings) as writer:
        await writer.aput(config, empty_checkpoint(), {"source": "input", "step": -1}, {})
        async with projector(settings):  # an erasure returns once the projector applied it
            await fully_projected(settings, client)
            await writer.aerase_thread("t-gone")
    async with read_api(settings) as fresh:
        assert await get(fresh, "t-gone") == {"tuple": None, "erased": True}
        never = await get(fresh, "t-never")
        assert never["tuple"] is None and "erased" not in never, never


async def test_a_write_whose_effect_needs_the_projection_waits_for_it(settings: Settings) -> None:
    async with read_api(settings) as client, KafkaSaver(settings) as a:
        config = {"configurable": {"thread_id": "t-prune"}}
        for text in ("m1", "m2"):
            await chat(a).ainvoke({"messages": [text]}, config)
        await a.aprune(["t-prune"], strategy="keep_latest")
        status, answer = await post(client, "/v1/checkpoints/get", {"thread_id": "t-prune", "checkpoint_ns": ""})
        # A prune keep_latest unlinks parents the fold does not hold: the read waits for the projector,
        # and says why when the deadline passes.
        assert status == 503 and answer["error"] == "consistency_timeout", answer
        assert "prune" in answer["message"]
        async with projector(settings):
            await fully_projected(settings, client)
            assert (await get(client, "t-prune"))["tuple"]["parent_config"] is None


async def test_a_store_get_reads_through_and_a_search_waits(settings: Settings) -> None:
    async with read_api(settings) as client, KafkaStore(settings) as a:
        await a.aput(("users", "u1"), "profile", {"name": "ada"}, ttl=10)
        await a.aput(("users", "u1"), "profile", {"name": "ada", "lang": "en"})
        await a.aput(("users", "u1"), "gone", {"x": 1})
        await a.adelete(("users", "u1"), "gone")
        ops = [
            {"op": "get", "namespace": ["users", "u1"], "key": "profile"},
            {"op": "get", "namespace": ["users", "u1"], "key": "gone"},
        ]
        status, answer = await post(client, "/v1/store/batch", {"ops": ops})
        assert status == 200, answer
        item, gone = answer["results"]
        assert item["value"] == {"name": "ada", "lang": "en"} and gone is None
        search = {"ops": [{"op": "search", "namespace_prefix": ["users"]}]}
        status, answer = await post(client, "/v1/store/batch", search)
        assert status == 503 and answer["error"] == "consistency_timeout"  # a search waits for the projection
        async with projector(settings):
            await fully_projected(settings, client)

            async def searched() -> bool:
                found, _ = await post(client, "/v1/store/batch", search)
                return found == 200

            await wait_for(searched, "the store's projection")
            status, projected = await post(client, "/v1/store/batch", {"ops": ops})
            assert projected["results"] == [item, None]


async def test_beyond_its_bound_the_read_waits_and_says_so(ready_settings: Callable[..., Awaitable[Settings]]) -> None:
    port = free_port()
    s = await ready_settings(
        api_port=port, api_url=f"http://127.0.0.1:{port}", consistency_timeout_s=1.0, api_read_through_max_bytes=1
    )
    async with read_api(s) as client, KafkaSaver(s) as a:
        config = {"configurable": {"thread_id": "t-bound", "checkpoint_ns": ""}}
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"note": "x" * 1000}
        checkpoint["channel_versions"] = {"note": "1"}
        await a.aput(config, checkpoint, {"source": "input", "step": -1}, {"note": "1"})
        status, answer = await post(client, "/v1/checkpoints/get", {"thread_id": "t-bound", "checkpoint_ns": ""})
        assert status == 503 and answer["error"] == "consistency_timeout", answer
        assert "GRAPHLEDGER_API_READ_THROUGH_MAX_BYTES" in answer["message"]


async def test_a_chunked_checkpoint_is_reassembled_and_read_through(settings: Settings) -> None:
    async with read_api(settings) as client, KafkaSaver(settings) as a:
        config = {"configurable": {"thread_id": "t-big", "checkpoint_ns": ""}}
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"note": "x" * (2 * settings.max_message_bytes)}  # three chunks or more
        checkpoint["channel_versions"] = {"note": "1"}
        await a.aput(config, checkpoint, {"source": "input", "step": -1}, {"note": "1"})
        folded = await get(client, "t-big")
        assert folded["tuple"]["checkpoint"]["id"] == checkpoint["id"]
        async with projector(settings):
            await fully_projected(settings, client)
            assert await get(client, "t-big") == folded


async def _thread_on(saver: KafkaSaver, partitions: int, partition: int, prefix: str) -> str:
    """A thread of `saver`'s (one turn written) whose records go to `partition`."""
    for n in range(256):
        thread = f"{prefix}-{n}"
        await chat(saver).ainvoke({"messages": ["hi"]}, {"configurable": {"thread_id": thread}})
        key = saver._runtime.record_key_of_thread(thread)
        assert key is not None
        if (murmur2(key) & 0x7FFFFFFF) % partitions == partition:
            return thread
    raise AssertionError(f"no thread of 256 went to partition {partition}")


async def test_a_parked_thread_is_refused_by_name_and_no_other_read_waits_for_it(settings: Settings) -> None:
    """Records no projector version can apply, published by any producer with a thread's record key (the
    log shows it): one claiming version 99, a copy barrier naming a copy at 2^62. Each parks its thread: a
    read of it fails `subject_parked` naming the parking, never answers without the records it holds (the
    read-through folds none of them); a thread of the same partition reads, and a list across threads
    answers once the projector has applied the partition, which such a barrier used to hold for ever."""
    async with projector(settings), read_api(settings) as client, KafkaSaver(settings) as writer:
        victim = await _thread_on(writer, settings.topic_partitions, 0, "victim")
        copied = await _thread_on(writer, settings.topic_partitions, 0, "copied")
        bystander = await _thread_on(writer, settings.topic_partitions, 0, "bystander")
        forged = to_envelope(put("x", 1))
        too_new = Envelope(forged.type, forged.event_id, forged.produced_ms, forged.payload, version=99)
        beyond = to_envelope(ThreadCopyBarrier(copied, 0, 2**62))
        producer = raw_producer(settings)
        await producer.start()
        try:
            parked = []
            for thread, env in ((victim, too_new), (copied, beyond)):
                key = writer._runtime.record_key_of_thread(thread)
                sent = await producer.send_and_wait(settings.checkpoint_topic, envelope.encode(env), key=key,
                                                    partition=0, headers=envelope.headers_for(env))  # fmt: skip
                parked.append(f"{settings.checkpoint_topic}:0@{sent.offset}")
        finally:
            await producer.stop()
        after = {"configurable": {"thread_id": victim, "checkpoint_ns": ""}}
        await writer.aput(after, empty_checkpoint(), {"source": "input", "step": 9}, {})  # held with the thread
        await chat(writer).ainvoke({"messages": ["again"]}, {"configurable": {"thread_id": bystander}})
        await fully_projected(settings, client)  # a list across threads answers: nothing holds the partition

        for thread, name in ((victim, parked[0]), (copied, parked[1])):
            status, answer = await post(client, "/v1/checkpoints/get", {"thread_id": thread, "checkpoint_ns": ""})
            assert status == 503 and answer["error"] == "subject_parked", answer
            assert answer["retryable"] and name in answer["message"], answer
        async with KafkaSaver(settings) as reader:  # another process: the client raises it as it came
            with pytest.raises(ReadApiError) as refused:
                await chat(reader).aget_state({"configurable": {"thread_id": victim}})
            assert refused.value.code == "subject_parked"
            state = await chat(reader).aget_state({"configurable": {"thread_id": bystander}})
            assert state.values["messages"] == ["hi", "reply to hi", "again", "reply to again"]


async def _only_record_key(settings: Settings, topic: str) -> bytes:
    """The key of the one record `topic` holds."""
    consumer = new_consumer(settings)
    await consumer.start()
    try:
        consumer.subscribe([topic])
        fetched = await consumer.getmany(timeout_ms=int(WAIT_S * 1000), max_records=1)
        ((record,),) = fetched.values()
        assert record.key is not None
        return record.key
    finally:
        await consumer.stop()


async def test_a_parked_store_item_is_refused_by_name_and_a_search_answers(settings: Settings) -> None:
    """A record claiming version 99 with a store item's record key parks that item: its get fails
    `subject_parked`, and a search of the namespace answers (the item as it was when it parked)."""
    async with projector(settings), read_api(settings) as client, KafkaStore(settings) as store:
        await store.aput(("users", "u1"), "profile", {"name": "ada"})
        key = await _only_record_key(settings, settings.store_topic)
        too_new = Envelope("store.put", envelope.new_event_id(), 0, {}, version=99)
        producer = raw_producer(settings)
        await producer.start()
        try:
            value, headers = envelope.encode(too_new), envelope.headers_for(too_new)
            sent = await producer.send_and_wait(settings.store_topic, value, key=key, headers=headers)
        finally:
            await producer.stop()
        await store.aput(("users", "u1"), "profile", {"name": "ada", "lang": "en"})  # held with the item
        await store.aput(("users", "u2"), "profile", {"name": "bob"})
        search = {"ops": [{"op": "search", "namespace_prefix": ["users"], "limit": 10}]}

        async def searched() -> bool:
            status, _ = await post(client, "/v1/store/batch", search)
            return status == 200

        await wait_for(searched, "a search across the store topic to answer")
        status, answer = await post(client, "/v1/store/batch", search)
        assert sorted((i["namespace"][1], i["value"]["name"]) for i in answer["results"][0]) == [
            ("u1", "ada"),
            ("u2", "bob"),
        ]
        get = {"ops": [{"op": "get", "namespace": ["users", "u1"], "key": "profile"}]}
        status, answer = await post(client, "/v1/store/batch", get)
        assert status == 503 and answer["error"] == "subject_parked", answer
        assert f"{settings.store_topic}:{sent.partition}@{sent.offset}" in answer["message"]
