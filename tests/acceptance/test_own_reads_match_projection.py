"""A process that reads its own thread adds its unprojected writes to the answer itself (or answers from
the newest checkpoint it keeps). Those answers must be exactly what the projection answers once it
has applied the writes: checked after every step of graphs that exercise parallel tasks, errors,
interrupts, subgraph namespaces, `Send`, `update_state` and values jsonb rewrites. The writer reads
while the projector is frozen (SIGSTOP), so its answer is built from its own writes; the reader then
waits for the projection.
"""

from __future__ import annotations

import operator
import os
import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, Send, interrupt

from graphledger import KafkaSaver
from graphledger.erasure.sealer import EventSealer
from polling import wait_for


class State(TypedDict, total=False):
    items: Annotated[list[Any], operator.add]
    profile: dict[str, Any]
    """Written once: later checkpoints keep its version, so its value comes from an earlier one."""
    score: float
    flag: bool
    note: str | None


@pytest.fixture
async def writer(stack: Any) -> AsyncIterator[KafkaSaver]:
    async with KafkaSaver(stack.settings) as saver:
        yield saver


@pytest.fixture
async def reader(stack: Any) -> AsyncIterator[KafkaSaver]:
    """Another saver, with no writes of its own: every read of it is the projection's answer."""
    async with KafkaSaver(stack.settings) as saver:
        yield saver


def _ordered(value: Any) -> Any:
    """Dicts as item lists, so that key order counts; channel values compare as a mapping."""
    if isinstance(value, dict):
        return [(k, v if k == "channel_values" else _ordered(v)) for k, v in value.items()]
    if isinstance(value, list | tuple):
        return [_ordered(v) for v in value]
    return value


FROZEN: dict[str, int] = {}


@pytest.fixture(autouse=True)
def _projector_pid(stack: Any) -> None:
    FROZEN["pid"] = stack.pids()["projector"]


@contextmanager
def _projector_frozen() -> Iterator[None]:
    """The session stack's projector stopped for the block (short: its group session keeps running)."""
    os.kill(FROZEN["pid"], signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(FROZEN["pid"], signal.SIGCONT)


async def _same(writer: KafkaSaver, reader: KafkaSaver, config: dict[str, Any]) -> None:
    with _projector_frozen():
        mine = await writer.aget_tuple(config)
    theirs = await reader.aget_tuple(config)
    assert (mine is None) == (theirs is None), config
    if mine is None or theirs is None:
        return
    assert _ordered(mine.config) == _ordered(theirs.config)
    assert _ordered(mine.checkpoint) == _ordered(theirs.checkpoint)
    assert mine.checkpoint["channel_values"] == theirs.checkpoint["channel_values"]
    assert _ordered(mine.metadata) == _ordered(theirs.metadata)
    assert mine.parent_config == theirs.parent_config
    assert [(t, c, repr(v)) for t, c, v in mine.pending_writes or []] == [
        (t, c, repr(v)) for t, c, v in theirs.pending_writes or []
    ]


def _thread(ns: str = "") -> dict[str, Any]:
    return {"configurable": {"thread_id": f"own-{uuid.uuid4().hex[:8]}", "checkpoint_ns": ns}}


async def test_a_chat_with_values_jsonb_rewrites(writer: KafkaSaver, reader: KafkaSaver) -> None:
    def step(state: State) -> State:
        n = len(state.get("items", []))
        # 1e16 reads back from jsonb as an integer, a small float keeps its digits, None and bools stay.
        update: State = {"items": [{"n": n, "big": 1e16, "tiny": 1e-7}], "score": 1.5 * n, "flag": n % 2 == 0}
        if "profile" not in state:
            update.update(profile={"name": "ada", "langs": ["py"]}, note=None)
        return update

    builder = StateGraph(State)
    builder.add_node("step", step)
    builder.add_edge(START, "step")
    graph = builder.compile(checkpointer=writer)
    config = _thread()
    for n in range(4):
        run = {**config, "metadata": {"turn": n, "ratio": 1e-5, "big": 2e16}}
        await graph.ainvoke({"items": [f"turn {n}"]}, run)
        await _same(writer, reader, config)


async def test_parallel_tasks_an_error_and_a_retry(writer: KafkaSaver, reader: KafkaSaver) -> None:
    attempts = {"flaky": 0}

    def steady(state: State) -> State:
        return {"items": ["steady"]}

    def flaky(state: State) -> State:
        attempts["flaky"] += 1
        if attempts["flaky"] == 1:
            raise RuntimeError("first attempt fails")
        return {"items": ["flaky"]}

    builder = StateGraph(State)
    builder.add_node(steady)
    builder.add_node(flaky)
    builder.add_edge(START, "steady")
    builder.add_edge(START, "flaky")
    graph = builder.compile(checkpointer=writer)
    config = _thread()
    with pytest.raises(RuntimeError):
        await graph.ainvoke({"items": []}, config)
    await _same(writer, reader, config)  # the failed task's error and the sibling's writes are pending
    await graph.ainvoke(None, config)
    await _same(writer, reader, config)


async def test_an_interrupt_a_resume_and_an_update(writer: KafkaSaver, reader: KafkaSaver) -> None:
    def ask(state: State) -> State:
        return {"items": [f"answer {interrupt('what?')}"]}

    builder = StateGraph(State)
    builder.add_node("ask", ask)
    builder.add_edge(START, "ask")
    builder.add_edge("ask", END)
    graph = builder.compile(checkpointer=writer)
    config = _thread()
    await graph.ainvoke({"items": ["q"]}, config)
    await _same(writer, reader, config)
    await graph.ainvoke(Command(resume="blue"), config)
    await _same(writer, reader, config)
    await graph.aupdate_state(config, {"items": ["edited"], "note": "by hand"})
    await _same(writer, reader, config)


async def test_subgraph_namespaces_and_sends(writer: KafkaSaver, reader: KafkaSaver) -> None:
    def inner_step(state: State) -> State:
        return {"items": ["inner"]}

    inner = StateGraph(State)
    inner.add_node("inner_step", inner_step)
    inner.add_edge(START, "inner_step")

    def fan_out(state: State) -> list[Send]:
        return [Send("worker", {"items": [i]}) for i in range(3)]

    def worker(state: State) -> State:
        return {"items": [f"worked {state['items'][-1]}"]}

    builder = StateGraph(State)
    builder.add_node("sub", inner.compile())
    builder.add_node("worker", worker)
    builder.add_edge(START, "sub")
    builder.add_conditional_edges("sub", fan_out, ["worker"])
    graph = builder.compile(checkpointer=writer)
    config = _thread()
    await graph.ainvoke({"items": ["start"]}, config)
    await _same(writer, reader, config)
    async for snapshot in graph.aget_state_history(config):  # every checkpoint, by its own config
        await _same(writer, reader, snapshot.config)
    state = await graph.aget_state(config, subgraphs=True)
    for task in state.tasks:
        if task.state is not None:
            await _same(writer, reader, task.state.config)  # type: ignore[union-attr]


async def test_a_thread_that_moves_between_pods_reads_as_the_projection(stack: Any, reader: KafkaSaver) -> None:
    """Each turn runs on the other of two savers (two pods), and the pod that takes the next turn reads the
    thread with the projector stopped: it folds the other's records onto what it holds, once both seal the
    thread with its own key (each from its first read of it through the read API; a new thread's first
    records are sealed with a fresh key of its writer's alone)."""

    def ask(state: State) -> State:
        return {"items": [f"answer {interrupt('what?')}"]}

    def step(state: State) -> State:
        return {"items": [len(state.get("items", []))], "score": 0.5 * len(state.get("items", []))}

    def fan_out(state: State) -> list[Send]:
        return [Send("worker", {"items": [i]}) for i in range(2)]

    def worker(state: State) -> State:
        return {"items": [f"worked {state['items'][-1]}"]}

    builder = StateGraph(State)
    builder.add_node("step", step)
    builder.add_node("ask", ask)
    builder.add_node("worker", worker)
    builder.add_edge(START, "step")
    builder.add_conditional_edges("step", fan_out, ["worker"])
    builder.add_edge("worker", "ask")
    builder.add_edge("ask", END)
    config = _thread()
    async with KafkaSaver(stack.settings) as first, KafkaSaver(stack.settings) as second:
        pods = (first, second)
        sealers = [pod._runtime.sealer for pod in pods]  # type: ignore[union-attr]
        await wait_for(lambda: all(s is not None and s.pool is not None and len(s.pool) for s in sealers), "fresh keys")
        asks = _count_key_asks(sealers)  # type: ignore[arg-type]
        graphs = [builder.compile(checkpointer=pod) for pod in pods]
        for turn in range(8):
            graph = graphs[turn % 2]
            if turn % 2:
                await graph.ainvoke(Command(resume=f"blue {turn}"), config)
            else:
                await graph.ainvoke({"items": [f"turn {turn}"]}, config)
            await _same(pods[(turn + 1) % 2], reader, config)  # the next turn's pod
        await graphs[0].aupdate_state(config, {"note": "by hand"})
        await _same(pods[1], reader, config)
        answered = [pod._runtime.thread_reads.answered for pod in pods]  # type: ignore[union-attr]
        fell_back = [pod._runtime.thread_reads.fell_back for pod in pods]  # type: ignore[union-attr]
    # The second pod's first read goes to the read API; every other folds: the first pod's read of the second's
    # first turn (sealed with the thread's own key, which it had not asked for) asks for that key, not the read API.
    assert [a["read_api"] for a in answered] == [0, 1] and sum(a["folded"] for a in answered) == 8, answered
    assert fell_back == [{}, {"not_held": 1}], fell_back
    # The second pod's get brought the thread's key with its answer; the first asks for it once.
    assert asks == [1, 0], asks


def _count_key_asks(sealers: list[EventSealer]) -> list[int]:
    """How many times each sealer asks its key source for data keys (`/v1/keys`), from now on."""
    asks = [0] * len(sealers)
    for i, sealer in enumerate(sealers):
        source = sealer._source
        asked = source.data_keys

        async def counted(tenant: str, subjects: Any, i: int = i, asked: Any = asked) -> Any:
            asks[i] += 1
            return await asked(tenant, subjects)

        source.data_keys = counted  # type: ignore[method-assign]
    return asks
