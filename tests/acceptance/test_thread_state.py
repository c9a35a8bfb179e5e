"""What a process holds of a thread answers its reads as the projection would, without waiting for it.

Regressions of the client's fast path: a read racing an eviction, long conversations, code that drives
the saver directly, graphs with DeltaChannel state, a writer whose thread was erased (an outage of the
read API: test_outage_writes.py); and a new thread's first read, answered in the client when the log
proves the thread new, and only then. The projector is stopped (SIGSTOP) where a test
says so: a read that waited for it would fail with `consistency_timeout` instead of answering.
"""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from operator import add
from typing import Annotated, Any, TypedDict

import httpx
import pytest
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph

from agent_pods import AgentPod
from graphledger import KafkaSaver
from graphledger.errors import SubjectErasedError
from graphledger_server.devstack.stack import DevStack
from thread_partitions import threads_on_partition

LONG_CONVERSATION_TURNS = int(os.environ.get("GRAPHLEDGER_LONG_CONVERSATION_TURNS", "150"))
"""Turns of the long conversation (`make soak` runs 2,000)."""
SMALL_BOUND = max(256 * 1024, 1536 * LONG_CONVERSATION_TURNS)
"""A client memory bound a long conversation's whole history would exceed many times over, yet holding its
newest state: the view holds the newest checkpoint's `messages` about three times over (its blob, its
answer, its put), some 1.3 KiB a turn here, so 256 KiB holds about 200 turns and `make soak`'s 2,000
need about 3 MiB (the history of 2,000 turns is about 850 MB)."""


def all_projected(stack: DevStack) -> None:
    """Return once the projector applied everything written before."""
    with KafkaSaver(stack.settings) as reader:
        next(iter(reader.list(None, limit=1)), None)  # a list across threads waits for the whole topic


@contextmanager
def projector_stopped(stack: DevStack) -> Iterator[None]:
    """The projector stopped (SIGSTOP) for the block, once it applied everything written before: earlier
    tests' records, a `runs.delete` among them, are no test's own and would be waited for."""
    all_projected(stack)
    pid = stack.pids()["projector"]
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def count_reads(saver: KafkaSaver) -> Counter[str]:
    """The saver's reads from now on, by who answered them (`held`, `read_api`)."""
    reads = saver._runtime.thread_reads
    assert reads is not None
    reads.answered.clear()
    return reads.answered


class Chat(TypedDict):
    messages: Annotated[list[str], add]


def chat(saver: KafkaSaver) -> Any:
    builder = StateGraph(Chat)
    builder.add_node("reply", lambda state: {"messages": [f"reply to {state['messages'][-1]}"]})
    builder.add_edge(START, "reply")
    return builder.compile(checkpointer=saver)


@pytest.fixture
async def saver(stack: DevStack) -> AsyncIterator[KafkaSaver]:
    async with KafkaSaver(stack.settings) as opened:
        yield opened


def thread() -> dict[str, Any]:
    return {"configurable": {"thread_id": new_thread("t"), "checkpoint_ns": ""}}


def new_thread(label: str) -> str:
    return f"{label}-{uuid.uuid4().hex[:10]}"


def config_of(thread_id: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}


async def test_a_read_racing_an_eviction_returns_every_acknowledged_write(stack: DevStack) -> None:
    """With the memory bound full, another thread's acknowledgement evicts the read thread while its
    read is in flight: the read still answers the newest checkpoint, and so does the next one."""
    settings = stack.settings.model_copy(update={"client_thread_memory_bytes": 4096})
    async with KafkaSaver(settings) as saver:
        graph = chat(saver)
        config = thread()
        for turn in range(10):
            others = [graph.ainvoke({"messages": [f"other {turn}.{i}"]}, thread()) for i in range(3)]
            state, *_ = await asyncio.gather(graph.aget_state(config), *others)
            assert len(state.values.get("messages", [])) == 2 * turn
            await graph.ainvoke({"messages": [f"turn {turn}"]}, config)
            assert len((await graph.aget_state(config)).values["messages"]) == 2 * turn + 2


async def test_a_long_conversation_never_reaches_the_read_api_once_held(stack: DevStack) -> None:
    """After the first turn, every read of the conversation is answered from what the process holds,
    with the projector stopped, and the process's memory stays within its bound."""
    settings = stack.settings.model_copy(update={"client_thread_memory_bytes": SMALL_BOUND})
    async with KafkaSaver(settings) as saver:
        graph = chat(saver)
        config = thread()
        await graph.ainvoke({"messages": ["hello"]}, config)
        calls = count_reads(saver)
        with projector_stopped(stack):
            for turn in range(LONG_CONVERSATION_TURNS):
                await graph.ainvoke({"messages": [f"turn {turn} " + "x" * 200]}, config)
                assert saver._runtime.threads.size <= SMALL_BOUND
            state = await graph.aget_state(config)
        assert len(state.values["messages"]) == 2 * LONG_CONVERSATION_TURNS + 2
        assert calls["read_api"] == 0 and calls["held"] == LONG_CONVERSATION_TURNS + 1, dict(calls)


async def test_code_that_calls_the_saver_itself_never_waits_for_the_projector(
    saver: KafkaSaver, stack: DevStack
) -> None:
    """`aput` then `aget_tuple` of a new thread, with the projector stopped: the first read asks the
    read API (which does not wait for this process's own records), the later ones nothing. The caller
    passes only some of the versions it changed as new, with versions from `get_next_version` (in another
    form a version not called new may name another put's blob row: those reads ask the read API)."""
    config = thread()
    calls = count_reads(saver)
    version: str | None = None
    with projector_stopped(stack):
        for step in range(5):
            checkpoint = empty_checkpoint()
            checkpoint["channel_values"] = {"step": step, "note": "x" * 2048}
            version = saver.get_next_version(version, None)
            checkpoint["channel_versions"] = {"step": version, "note": version}
            config = await saver.aput(config, checkpoint, {"source": "loop", "step": step}, {"step": version})
            await saver.aput_writes(config, [("step", step + 1)], task_id=f"task-{step}")
            found = await saver.aget_tuple({"configurable": {**config["configurable"], "checkpoint_id": None}})
            assert found is not None
            assert found.checkpoint["id"] == checkpoint["id"]
            assert found.checkpoint["channel_values"] == {"step": step, "note": "x" * 2048}
            assert [(task, channel, value) for task, channel, value in found.pending_writes] == [
                (f"task-{step}", "step", step + 1)
            ]
    assert calls == {"read_api": 1, "held": 4}


def _extend(state: list[str], batches: Any) -> list[str]:
    return [*state, *(message for batch in batches for message in batch)]


class DeltaChat(TypedDict):
    messages: Annotated[list[str], DeltaChannel(_extend, snapshot_frequency=4)]


def delta_chat(saver: Any) -> Any:
    builder = StateGraph(DeltaChat)
    builder.add_node("reply", lambda state: {"messages": [f"reply to {state['messages'][-1]}"]})
    builder.add_edge(START, "reply")
    return builder.compile(checkpointer=saver)


async def test_a_delta_channel_conversation_is_read_from_what_the_process_holds(stack: DevStack) -> None:
    """A DeltaChannel state is rebuilt from its history at every turn: the history comes from the
    process's own writes, with the projector stopped, and equals InMemorySaver's."""
    async with KafkaSaver(stack.settings) as saver:
        graph, reference = delta_chat(saver), delta_chat(InMemorySaver())
        config = thread()
        await graph.ainvoke({"messages": ["hello"]}, config)
        await reference.ainvoke({"messages": ["hello"]}, config)
        calls = count_reads(saver)
        with projector_stopped(stack):
            for turn in range(12):  # several snapshots (every 4 updates)
                mine = await graph.ainvoke({"messages": [f"turn {turn}"]}, config)
                theirs = await reference.ainvoke({"messages": [f"turn {turn}"]}, config)
                assert mine == theirs
        assert calls["read_api"] == 0 and calls["held"] > 12, dict(calls)  # gets and histories alike


async def test_a_delta_channel_conversation_that_moves_between_pods_is_read_from_what_each_holds(
    stack: DevStack,
) -> None:
    """The same conversation, each turn on the other of two savers (two pods) once both read it: each folds
    the other's records onto what it holds (`others_records.py`), its DeltaChannel history included, with the
    projector stopped, and the state equals InMemorySaver's."""
    async with KafkaSaver(stack.settings) as first, KafkaSaver(stack.settings) as second:
        graphs, reference = (delta_chat(first), delta_chat(second)), delta_chat(InMemorySaver())
        config = thread()
        for turn in range(3):  # both read it through the read API once, and seal it with its own key
            await graphs[turn % 2].ainvoke({"messages": [f"turn {turn}"]}, config)
            await reference.ainvoke({"messages": [f"turn {turn}"]}, config)
        calls = [count_reads(first), count_reads(second)]
        with projector_stopped(stack):
            for turn in range(3, 15):  # several snapshots (every 4 updates)
                mine = await graphs[turn % 2].ainvoke({"messages": [f"turn {turn}"]}, config)
                theirs = await reference.ainvoke({"messages": [f"turn {turn}"]}, config)
                assert mine == theirs
    assert sum(c["read_api"] for c in calls) == 0 and sum(c["folded"] for c in calls) >= 12, calls


async def test_a_writer_never_reads_back_what_it_wrote_after_its_thread_was_erased(stack: DevStack) -> None:
    """An operator erases the thread while a writer holds it and its key: what the writer publishes
    afterwards is skipped by the projector, and the writer's own next read answers nothing, as every
    other process's does, instead of its own writes."""
    async with KafkaSaver(stack.settings) as writer:
        graph = chat(writer)
        config = thread()
        await graph.ainvoke({"messages": ["before"]}, config)
        async with httpx.AsyncClient(base_url=stack.settings.api_url) as operator:  # a loopback API: no token
            erased = await operator.post("/v1/erase", json={"thread_id": config["configurable"]["thread_id"]})
        assert erased.status_code == 200, erased.text
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"note": "after the erasure"}
        checkpoint["channel_versions"] = {"note": "1"}
        try:  # sealed with the key it holds; or refused, if it learned of the erasure first
            await writer.aput(config, checkpoint, {"source": "input", "step": -1}, {"note": "1"})
        except SubjectErasedError:
            pass
        assert await writer.aget_tuple(config) is None
        async with KafkaSaver(stack.settings) as other:
            assert await other.aget_tuple(config) is None
        with pytest.raises(SubjectErasedError):
            await writer.aput(config, checkpoint, {"source": "input", "step": -1}, {"note": "1"})


# -- a new thread's first read, proved from the log (key filters) ----------------------------------


async def test_new_threads_are_read_without_the_read_api_or_the_projector(stack: DevStack) -> None:
    """Each new thread's first read is proved from the log, with the projector stopped: its turn and the
    state read after it reach the read API only for the key filters, once per partition."""
    async with KafkaSaver(stack.settings) as saver:
        graph = chat(saver)
        calls = count_reads(saver)
        with projector_stopped(stack):
            for turn in range(12):
                config = thread()
                await graph.ainvoke({"messages": [f"hello {turn}"]}, config)
                state = await graph.aget_state(config)
                assert state.values["messages"] == [f"hello {turn}", f"reply to hello {turn}"]
        assert calls["read_api"] == 0 and calls["new"] == 12, dict(calls)


async def test_threads_another_process_wrote_are_never_read_as_new(stack: DevStack) -> None:
    """A thread another agent process wrote is read with its state whether its key came to the reader in a
    key filter (written and projected before the reader fetched the filters) or only in the log since."""
    writer = AgentPod("writer", stack.client_env(), stack.log_dir)
    try:
        early = [new_thread("early") for _ in range(8)]
        for thread_id in early:
            assert writer.call("turn", thread=thread_id, text="early")["ok"]
        all_projected(stack)
        async with KafkaSaver(stack.settings) as reader:
            graph = chat(reader)
            calls = count_reads(reader)
            for _ in range(16):  # copies of the partitions' filters, holding the early threads' keys
                assert await reader.aget_tuple(thread()) is None
            assert calls["new"] == 16, dict(calls)
            late = [new_thread("late") for _ in range(8)]
            for thread_id in late:
                assert writer.call("turn", thread=thread_id, text="late")["ok"]
            for thread_id, text in [*((t, "early") for t in early), *((t, "late") for t in late)]:
                state = await graph.aget_state(config_of(thread_id))
                assert state.values["messages"] == [text, f"reply to {text}"], thread_id
            assert calls["new"] == 16 and calls["read_api"] == 16, dict(calls)
    finally:
        writer.close()


async def test_own_writes_never_carry_a_filter_past_another_process_records(stack: DevStack) -> None:
    """A process's own writes acknowledged at its filter copy's end extend the copy; another process's
    records before them hold it back. The reader writes a new thread, the other process a thread of its own
    on the same partition, the reader its thread again (a held turn, no proof): the other's threads are read
    with their state, never as new."""
    writer = AgentPod("writer", stack.client_env(), stack.log_dir)
    try:
        async with KafkaSaver(stack.settings) as reader:
            graph = chat(reader)
            mine, theirs = await threads_on_partition(reader, 0, 8), await threads_on_partition(reader, 0, 8)
            calls = count_reads(reader)
            for own, other in zip(mine, theirs, strict=True):
                await graph.ainvoke({"messages": ["mine"]}, config_of(own))  # proved new, then written
                assert writer.call("turn", thread=other, text="theirs")["ok"]
                await graph.ainvoke({"messages": ["again"]}, config_of(own))  # held: written past theirs
            assert calls["new"] == len(mine), dict(calls)
            for thread_id in theirs:
                state = await graph.aget_state(config_of(thread_id))
                assert state.values["messages"] == ["theirs", "reply to theirs"], thread_id
            assert calls["new"] == len(mine), dict(calls)
    finally:
        writer.close()


async def test_a_thread_erased_before_its_first_write_is_not_read_as_new(stack: DevStack) -> None:
    """The erasure's record has the thread's key, so the thread is not proved new: its read learns of the
    erasure, and the process refuses to write to it, as before."""
    thread_id = new_thread("erased")
    async with KafkaSaver(stack.settings) as saver:
        calls = count_reads(saver)
        for _ in range(32):  # a copy of every partition's filter, all but surely: the erasure comes after them
            assert await saver.aget_tuple(thread()) is None
        async with httpx.AsyncClient(base_url=stack.settings.api_url) as operator:  # a loopback API: no token
            erased = await operator.post("/v1/erase", json={"thread_id": thread_id})
        assert erased.status_code == 200, erased.text
        assert await saver.aget_tuple(config_of(thread_id)) is None
        checkpoint = empty_checkpoint()
        checkpoint["channel_versions"] = {"note": "1"}
        checkpoint["channel_values"] = {"note": "after the erasure"}
        with pytest.raises(SubjectErasedError):
            await saver.aput(config_of(thread_id), checkpoint, {"source": "input", "step": -1}, {"note": "1"})
        assert calls["new"] == 32 and calls["read_api"] == 1, dict(calls)
