"""LangGraph graphs run on KafkaSaver behave as on InMemorySaver (the examples of LangGraph's persistence guide)."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import subprocess
import sys
import uuid
from operator import add
from pathlib import Path
from typing import Annotated, Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.channels import DeltaChannel
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph, add_messages
from langgraph.types import interrupt
from typing_extensions import TypedDict

from graphledger import KafkaSaver
from graphledger_server.devstack.demo import build_graph
from graphledger_server.devstack.ports import wait_until


@pytest.fixture
def saver(stack):
    with KafkaSaver(stack.settings) as saver:
        yield saver


def _thread() -> dict[str, Any]:
    return {"configurable": {"thread_id": str(uuid.uuid4())}}


def _summary(history: list) -> list[tuple]:
    """What must match between savers: values, next, metadata, tasks; not ids or timestamps."""
    return [
        (
            s.values,
            s.next,
            {k: v for k, v in s.metadata.items() if k not in ("run_id", "thread_id")},
            [(t.name, t.error is not None, tuple(i.value for i in t.interrupts)) for t in s.tasks],
            s.parent_config is None,
        )
        for s in history
    ]


def test_seed_example_yields_the_documented_four_checkpoints(saver) -> None:
    graph = build_graph().compile(checkpointer=saver)
    config = _thread()
    assert graph.invoke({"foo": ""}, config) == {"foo": "b", "bar": ["a", "b"]}

    state = graph.get_state(config)
    assert state.values == {"foo": "b", "bar": ["a", "b"]}
    assert state.next == ()
    assert state.metadata["source"] == "loop" and state.metadata["step"] == 2

    history = list(graph.get_state_history(config))
    assert [(s.values, s.next, s.metadata["source"], s.metadata["step"]) for s in history] == [
        ({"foo": "b", "bar": ["a", "b"]}, (), "loop", 2),
        ({"foo": "a", "bar": ["a"]}, ("node_b",), "loop", 1),
        ({"foo": "", "bar": []}, ("node_a",), "loop", 0),
        ({"bar": []}, ("__start__",), "input", -1),
    ]
    # Each checkpoint's parent is the one before it, and the config carries the thread and namespace.
    for newer, older in itertools.pairwise(history):
        assert newer.parent_config["configurable"]["checkpoint_id"] == older.config["configurable"]["checkpoint_id"]
        assert newer.config["configurable"]["checkpoint_ns"] == ""
    assert history[-1].parent_config is None

    reference = build_graph().compile(checkpointer=InMemorySaver())
    ref_config = _thread()
    reference.invoke({"foo": ""}, ref_config)
    assert _summary(history) == _summary(list(reference.get_state_history(ref_config)))


@pytest.mark.parametrize("as_node", [None, "node_a"])
def test_update_state_and_replay_match_in_memory_saver(saver, as_node: str | None) -> None:
    results = []
    for checkpointer in (saver, InMemorySaver()):
        graph = build_graph().compile(checkpointer=checkpointer)
        config = _thread()
        graph.invoke({"foo": ""}, config)
        graph.update_state(config, {"foo": "x", "bar": ["x"]}, as_node=as_node)
        after_update = graph.get_state(config)
        # Replay from the checkpoint after node_a: node_b runs again on a new branch.
        after_a = next(s for s in graph.get_state_history(config) if s.next == ("node_b",))
        replayed = graph.invoke(None, after_a.config)
        results.append(
            (after_update.values, after_update.next, replayed, _summary(list(graph.get_state_history(config))))
        )
    assert results[0] == results[1]
    assert results[0][0] == {"foo": "x", "bar": ["a", "b", "x"]}


async def test_async_invoke_and_state(saver) -> None:
    graph = build_graph().compile(checkpointer=saver)
    config = _thread()
    assert await graph.ainvoke({"foo": ""}, config) == {"foo": "b", "bar": ["a", "b"]}
    assert len([s async for s in graph.aget_state_history(config)]) == 4
    assert (await graph.aget_state(config)).values == {"foo": "b", "bar": ["a", "b"]}


class AskState(TypedDict):
    question: str
    answer: str


def ask(state: AskState) -> dict:
    return {"answer": interrupt(state["question"])}


def build_ask_graph() -> StateGraph:
    workflow = StateGraph(AskState)
    workflow.add_node(ask)
    workflow.add_edge(START, "ask")
    return workflow


RESUME_SCRIPT = """
import json, sys
sys.path.insert(0, {tests!r})
from langgraph.types import Command
from graphledger import KafkaSaver
from graphledger_server.devstack.ports import wait_until
from test_saver_graphs import build_ask_graph
with KafkaSaver.from_env() as saver:
    graph = build_ask_graph().compile(checkpointer=saver)
    config = {{"configurable": {{"thread_id": sys.argv[1]}}}}
    print(json.dumps(graph.invoke(Command(resume="forty-two"), config)))
"""


def test_interrupt_then_resume_from_a_second_process(saver, stack) -> None:
    graph = build_ask_graph().compile(checkpointer=saver)
    config = _thread()
    result = graph.invoke({"question": "the answer?", "answer": ""}, config)
    assert [i.value for i in result["__interrupt__"]] == ["the answer?"]
    assert graph.get_state(config).next == ("ask",)

    tests_dir = str(Path(__file__).parent)
    done = subprocess.run(
        [sys.executable, "-c", RESUME_SCRIPT.format(tests=tests_dir), config["configurable"]["thread_id"]],
        env={**os.environ, **stack.client_env()},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"question": "the answer?", "answer": "forty-two"}
    # Another process's writes carry no token of ours: they become visible here eventually.
    wait_until(lambda: graph.get_state(config).next == (), 30, "the resumed run to be projected")
    assert graph.get_state(config).values == {"question": "the answer?", "answer": "forty-two"}


class FanState(TypedDict):
    done: Annotated[list[str], add]


def test_pending_writes_keep_a_successful_sibling_from_rerunning(saver) -> None:
    runs: dict[str, int] = {"steady": 0, "flaky": 0}

    def steady(state: FanState) -> dict:
        runs["steady"] += 1
        return {"done": ["steady"]}

    def flaky(state: FanState) -> dict:
        runs["flaky"] += 1
        if runs["flaky"] == 1:
            raise RuntimeError("first attempt fails")
        return {"done": ["flaky"]}

    workflow = StateGraph(FanState)
    workflow.add_node(steady)
    workflow.add_node(flaky)
    workflow.add_edge(START, "steady")
    workflow.add_edge(START, "flaky")
    graph = workflow.compile(checkpointer=saver)
    config = _thread()

    with pytest.raises(RuntimeError, match="first attempt fails"):
        graph.invoke({"done": []}, config)
    tasks = graph.get_state(config).tasks
    assert {t.name: t.error is not None for t in tasks} == {"steady": False, "flaky": True}

    assert sorted(graph.invoke(None, config)["done"]) == ["flaky", "steady"]
    assert runs == {"steady": 1, "flaky": 2}


def _extend(state: list, writes: list) -> list:
    out = list(state or [])
    for w in writes:
        out.extend(w)
    return out


class DeltaState(TypedDict):
    items: Annotated[list, DeltaChannel(_extend, snapshot_frequency=3)]


def test_delta_channel_state_matches_in_memory_saver(saver) -> None:
    def step(state: DeltaState) -> dict:
        return {"items": [len(state["items"])]}

    states = []
    for checkpointer in (saver, InMemorySaver()):
        workflow = StateGraph(DeltaState)
        workflow.add_node(step)
        workflow.add_edge(START, "step")
        graph = workflow.compile(checkpointer=checkpointer)
        config = _thread()
        for _ in range(7):
            graph.invoke({"items": []}, config)
        history = checkpointer.get_delta_channel_history(config=graph.get_state(config).config, channels=["items"])
        states.append((graph.get_state(config).values, len(history["items"]["writes"]), "seed" in history["items"]))
    assert states[0] == states[1]
    assert states[0][0]["items"] == [0, 1, 2, 3, 4, 5, 6]


class ChatState(TypedDict):
    messages: Annotated[list, add_messages]


def _reply(state: ChatState) -> dict:
    return {"messages": [AIMessage(f"heard {len(state['messages'])}")]}


def test_a_patched_uuid4_gives_the_ids_in_memory_saver_gives(stack, monkeypatch: pytest.MonkeyPatch) -> None:
    """LangGraph's own tests (`test_large_cases.py::test_root_graph`) patch `uuid.uuid4` with a counter and
    compare the ids it hands out (message ids, here) with a snapshot: a saver that draws from it on a
    write or a read shifts them. Ids graphledger makes for itself come from elsewhere, so a graph on
    KafkaSaver (started inside the patch) draws exactly what it draws on InMemorySaver."""
    thread_id = f"root-graph-{uuid.uuid4().hex}"  # unique in the session's log, drawn before the patch

    def run(make_saver: Any) -> tuple[Any, ...]:
        drawn = itertools.count()
        monkeypatch.setattr(uuid, "uuid4", lambda: uuid.UUID(f"00000000-0000-4000-8000-{next(drawn):012}"))
        try:
            with contextlib.ExitStack() as stack_:
                checkpointer = stack_.enter_context(make_saver())
                workflow = StateGraph(ChatState)
                workflow.add_node("reply", _reply)
                workflow.add_edge(START, "reply")
                graph = workflow.compile(checkpointer=checkpointer)
                config = {"configurable": {"thread_id": thread_id}}
                outputs = [graph.invoke({"messages": [HumanMessage(text)]}, config) for text in ("hi", "again")]
                history = list(graph.get_state_history(config))
            return outputs, _summary(history), next(drawn)
        finally:
            monkeypatch.undo()

    ours = run(lambda: KafkaSaver(stack.settings))
    theirs = run(lambda: contextlib.nullcontext(InMemorySaver()))
    assert ours == theirs
    outputs, _, drawn = ours
    assert [m.id for m in outputs[-1]["messages"]] == [f"00000000-0000-4000-8000-{n:012}" for n in range(4)]
    assert drawn == 4  # one per message: nothing else drew from it
