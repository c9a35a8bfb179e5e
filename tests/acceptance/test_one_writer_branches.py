"""One writer per thread refuses only what no one asked for (invariant 10): every branch LangGraph makes on
purpose counts as on `InMemorySaver` — time travel, `update_state` on the head and on an older checkpoint
(`__copy__` too), `copy_thread`, parallel tasks and `Send`, subgraphs, interrupts resumed in another
process — in every durability mode, sync and async; and `graphledger forks list` shows them as branches.
A time-travel run is still refused when the thread moved on after its read."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from operator import add
from typing import Annotated, Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send
from typing_extensions import TypedDict

from agent_pods import AgentPod
from graphledger import KafkaSaver
from graphledger_server.devstack.ports import wait_until
from graphledger_server.devstack.stack import DevStack
from one_writer_checks import listed, new_thread, ok, one_chain, refused

DURABILITIES = ("sync", "async", "exit")


class Items(TypedDict):
    items: Annotated[list[str], add]


def _plan(state: Items) -> dict[str, Any]:
    return {"items": [f"plan {len(state['items'])}"]}


def _fan_out(state: Items) -> list[Send]:
    return [Send("work", {"items": [f"part {n}"]}) for n in range(2)]


def _work(state: Items) -> dict[str, Any]:
    return {"items": [f"did {state['items'][-1]}"]}


def _inner(state: Items) -> dict[str, Any]:
    return {"items": ["inner"]}


def build_branching_graph() -> StateGraph:
    """Two supersteps after the input: a subgraph (its own namespace) beside two `Send`s run in parallel."""
    sub = StateGraph(Items)
    sub.add_node("inner", _inner)
    sub.add_edge(START, "inner")
    graph = StateGraph(Items)
    graph.add_node("plan", _plan)
    graph.add_node("work", _work)
    graph.add_node("sub", sub.compile())
    graph.add_edge(START, "plan")
    graph.add_conditional_edges("plan", _fan_out, ["work"])
    graph.add_edge("plan", "sub")
    graph.add_edge("work", END)
    graph.add_edge("sub", END)
    return graph


def _config(thread_id: str, checkpoint_id: str | None = None) -> dict[str, Any]:
    configurable = {"thread_id": thread_id}
    if checkpoint_id is not None:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


def _summary(history: list) -> list[tuple]:
    """What must match between savers: values, next, metadata source and step, and the shape of the tree."""
    ids = {s.config["configurable"]["checkpoint_id"]: n for n, s in enumerate(history)}
    return [
        (
            s.values,
            s.next,
            s.metadata["source"],
            s.metadata["step"],
            None if s.parent_config is None else ids.get(s.parent_config["configurable"]["checkpoint_id"]),
        )
        for s in history
    ]


def _branch_everywhere(saver: Any, thread_id: str, durability: str) -> list[tuple]:
    """Two turns, a time travel, `update_state` on the head, on an older checkpoint and as `__copy__`, a last
    turn; the thread's history."""
    graph = build_branching_graph().compile(checkpointer=saver)
    head = _config(thread_id)
    for text in ("m0", "m1"):
        graph.invoke({"items": [text]}, head, durability=durability)
    first_turn = [s for s in graph.get_state_history(head) if s.next == ()][-1].config
    graph.invoke({"items": ["travel"]}, first_turn, durability=durability)
    graph.update_state(head, {"items": ["on the head"]})
    graph.update_state(first_turn, {"items": ["on an older one"]})
    graph.update_state(first_turn, None, as_node="__copy__")
    graph.invoke({"items": ["m2"]}, head, durability=durability)
    return _summary(list(graph.get_state_history(head)))


async def _abranch_everywhere(saver: Any, thread_id: str, durability: str) -> list[tuple]:
    graph = build_branching_graph().compile(checkpointer=saver)
    head = _config(thread_id)
    for text in ("m0", "m1"):
        await graph.ainvoke({"items": [text]}, head, durability=durability)
    first_turn = [s async for s in graph.aget_state_history(head) if s.next == ()][-1].config
    await graph.ainvoke({"items": ["travel"]}, first_turn, durability=durability)
    await graph.aupdate_state(head, {"items": ["on the head"]})
    await graph.aupdate_state(first_turn, {"items": ["on an older one"]})
    await graph.aupdate_state(first_turn, None, as_node="__copy__")
    await graph.ainvoke({"items": ["m2"]}, head, durability=durability)
    return _summary([s async for s in graph.aget_state_history(head)])


def _only_branches(stack: DevStack, thread_id: str) -> None:
    """The projector recorded the thread's branches (at least the time travel), all asked for, and no refusal."""
    wait_until(lambda: bool(listed(stack, thread_id)["forks"]), 60, "the projector to record the branches")
    report = listed(stack, thread_id)
    assert report["refused"] == [], report
    assert {f["kind"] for f in report["forks"]} == {"branch"}, report


@pytest.mark.parametrize("durability", DURABILITIES)
def test_branches_asked_for_count_as_on_in_memory_saver(stack: DevStack, durability: str) -> None:
    thread_id = f"branches-{uuid.uuid4().hex[:8]}"
    with KafkaSaver(stack.settings) as saver:
        ours = _branch_everywhere(saver, thread_id, durability)
        assert saver._runtime.verdicts["refused"] == 0
    assert ours == _branch_everywhere(InMemorySaver(), thread_id, durability)
    assert [source for _, _, source, _, _ in ours].count("update") == 2
    _only_branches(stack, thread_id)


@pytest.mark.parametrize("durability", DURABILITIES)
async def test_async_branches_asked_for_count_as_on_in_memory_saver(stack: DevStack, durability: str) -> None:
    thread_id = f"abranches-{uuid.uuid4().hex[:8]}"
    async with KafkaSaver(stack.settings) as saver:
        ours = await _abranch_everywhere(saver, thread_id, durability)
        assert saver._runtime.verdicts["refused"] == 0
    assert ours == await _abranch_everywhere(InMemorySaver(), thread_id, durability)
    _only_branches(stack, thread_id)


async def test_a_turn_on_a_copied_thread_counts(stack: DevStack) -> None:
    """`copy_thread` is a thread operation on its target: a run that reads the copy then writes on it."""
    source, target = f"copy-from-{uuid.uuid4().hex[:8]}", f"copy-to-{uuid.uuid4().hex[:8]}"
    async with KafkaSaver(stack.settings) as saver:
        graph = build_branching_graph().compile(checkpointer=saver)
        await graph.ainvoke({"items": ["m0"]}, _config(source))
        await saver.acopy_thread(source, target)
        copied = await graph.ainvoke({"items": ["m1"]}, _config(target))
        reference = build_branching_graph().compile(checkpointer=InMemorySaver())
        await reference.ainvoke({"items": ["m0"]}, _config(source))
        assert copied == await reference.ainvoke({"items": ["m1"]}, _config(source))
        assert saver._runtime.verdicts["refused"] == 0


# -- across processes: agents as separate OS processes, each with its own saver ------------------------


@pytest.fixture(scope="module")
def pods(stack: DevStack) -> Iterator[list[AgentPod]]:
    started = [AgentPod(name, stack.client_env(), stack.log_dir) for name in ("a", "b")]
    yield started
    for pod in started:
        pod.close()


@pytest.mark.slow
def test_time_travel_from_another_process_branches_and_one_after_the_thread_moved_on_is_refused(
    stack: DevStack, pods: list[AgentPod]
) -> None:
    a, b = pods
    thread = new_thread()
    for text in ("m0", "m1"):
        ok(a.call("turn", thread=thread, text=text))
    first_turn = one_chain(a, thread)[-3]  # its first turn's input, start and reply, oldest last
    travelled = ok(b.call("turn", thread=thread, text="travel", checkpoint_id=first_turn))["messages"]
    assert travelled == ["m0", "reply to m0", "travel", "reply to travel"]
    assert ok(a.call("state", thread=thread))["messages"] == travelled

    # b travels from an older checkpoint again, and is held inside its node (its reads done); a extends the
    # thread before b writes: b is refused.
    late = b.send("turn", thread=thread, text="gate:b", checkpoint_id=first_turn)
    b.wait_for(lambda m: m.get("event") == "in_node" and m.get("gate") == "b", 60, "b inside its node")
    extended = ok(a.call("turn", thread=thread, text="m2"))["messages"]
    ok(b.call("gate_open", name="b"))
    refused(b.answer(late))
    assert ok(b.call("state", thread=thread))["messages"] == extended
    wait_until(lambda: bool(listed(stack, thread)["refused"]), 60, "the projector to record b's refusal")
    assert {f["kind"] for f in listed(stack, thread)["forks"]} == {"branch"}


@pytest.mark.slow
def test_an_interrupt_resumed_in_another_process_counts(stack: DevStack, pods: list[AgentPod]) -> None:
    a, b = pods
    thread = new_thread()
    asked = ok(a.call("turn", thread=thread, text="interrupt:name?"))
    assert ok(a.call("state", thread=thread))["next"] == ["reply"], asked
    resumed = ok(b.call("resume", thread=thread, value="graphledger"))["messages"]
    assert resumed == ["interrupt:name?", "answer graphledger"]
    assert ok(a.call("state", thread=thread))["messages"] == resumed
    assert listed(stack, thread)["refused"] == []
