"""`graphledger dev --demo`: LangGraph's persistence examples run through the running stack, and checked.

The graph is the example of LangGraph's persistence guide (`node_a` → `node_b`, `bar` reduced with
`operator.add`): one invoke makes exactly four checkpoints. The demo runs it with `KafkaSaver` (writes
go to Kafka, the projector applies them, reads come back through the read API), prints what it wrote
and read back, and compares that with the history the guide documents and with the same graph run on
LangGraph's own `InMemorySaver`. It then does the same with `ainvoke` to show the async path. Then the
guide's memory store example, through `KafkaStore` with a real embedding model, checked against
`InMemoryStore` (`memory_demo.py`). Any difference is a failure (exit status 1), so the demo doubles
as an end-to-end check.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import Mapping
from operator import add
from typing import TYPE_CHECKING, Annotated, Any, TextIO

from typing_extensions import TypedDict

from graphledger.settings import Settings

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig
    from langgraph.graph import StateGraph
    from langgraph.types import StateSnapshot

INPUT: Any = {"foo": ""}  # the guide's input: `bar` starts empty

# The history the persistence guide documents, newest first: (step, source, values, next, what the next
# task wrote).
# The task results come from the pending writes of each checkpoint, so they check those round trip too.
Summary = tuple[int, str, dict[str, Any], tuple[str, ...], tuple[tuple[str, Any], ...]]
EXPECTED_HISTORY: list[Summary] = [
    (2, "loop", {"foo": "b", "bar": ["a", "b"]}, (), ()),
    (1, "loop", {"foo": "a", "bar": ["a"]}, ("node_b",), (("node_b", {"foo": "b", "bar": ["b"]}),)),
    (0, "loop", {"foo": "", "bar": []}, ("node_a",), (("node_a", {"foo": "a", "bar": ["a"]}),)),
    (-1, "input", {"bar": []}, ("__start__",), (("__start__", {"foo": ""}),)),
]


class State(TypedDict):
    foo: str
    bar: Annotated[list[str], add]


def node_a(state: State) -> dict[str, Any]:
    return {"foo": "a", "bar": ["a"]}


def node_b(state: State) -> dict[str, Any]:
    return {"foo": "b", "bar": ["b"]}


def build_graph() -> StateGraph[State]:
    """The persistence guide's graph, uncompiled."""
    from langgraph.graph import END, START, StateGraph

    workflow = StateGraph(State)
    workflow.add_node(node_a)
    workflow.add_node(node_b)
    workflow.add_edge(START, "node_a")
    workflow.add_edge("node_a", "node_b")
    workflow.add_edge("node_b", END)
    return workflow


def settings_from_env(env: Mapping[str, str]) -> Settings:
    """Settings from a `GRAPHLEDGER_*` mapping (such as `DevStack.client_env()`), over the process env."""
    prefix = str(Settings.model_config.get("env_prefix", ""))
    values: dict[str, Any] = {
        key[len(prefix) :].lower(): value for key, value in env.items() if key.upper().startswith(prefix)
    }
    return Settings(**values)


def run_demo(env: Mapping[str, str], out: TextIO | None = None) -> int:
    """Run the demo against the stack described by `env`; 0 when everything read back matches."""
    out = out or sys.stdout
    try:
        import langgraph.graph  # noqa: F401  (the demo's only dependency beyond the client)
    except ImportError:
        print("demo: needs langgraph: pip install langgraph", file=out)
        return 2
    from langgraph.checkpoint.memory import InMemorySaver

    from graphledger import KafkaSaver

    settings = settings_from_env(env)
    reference = _summarize(_history_sync(build_graph().compile(checkpointer=InMemorySaver()), "reference")[2])
    print(
        "demo: LangGraph's persistence example: START → node_a → node_b → END, channel `bar` reduced with operator.add",
        file=out,
    )
    problems: list[str] = []

    thread_id = f"demo-sync-{uuid.uuid4().hex[:8]}"
    print(f"\ndemo: graph.invoke({INPUT!r}) on thread {thread_id!r} with KafkaSaver", file=out)
    with KafkaSaver(settings) as saver:
        result, state, history = _history_sync(build_graph().compile(checkpointer=saver), thread_id)
        token = saver.consistency_token
    _report(out, result, state, history, token)
    problems += _check("sync", result, state, history, reference)

    thread_id = f"demo-async-{uuid.uuid4().hex[:8]}"
    print(f"\ndemo: await graph.ainvoke({INPUT!r}) on thread {thread_id!r} with KafkaSaver (async)", file=out)
    result, state, history, token = asyncio.run(_history_async(settings, thread_id))
    _report(out, result, state, history, token)
    problems += _check("async", result, state, history, reference)

    from graphledger_server.devstack.memory_demo import run_memory_demo

    try:
        problems += run_memory_demo(settings, out)
    except ImportError as exc:  # OnnxEmbedder's model and runtime come with an extra
        print(f"demo: the memory store example needs OnnxEmbedder: {exc}", file=out)
        return 2

    if problems:
        print("\ndemo: FAILED, what was read back differs from what was written:", file=out)
        for problem in problems:
            print(f"  - {problem}", file=out)
        return 1
    print(
        "\ndemo: OK: both threads read back the 4 checkpoints the persistence guide documents, as InMemorySaver "
        "does; another thread found the user's memories by meaning and by filter, as InMemoryStore finds them; "
        "the memory with a TTL expired",
        file=out,
    )
    return 0


def _history_sync(graph: Any, thread_id: str) -> tuple[Any, StateSnapshot, list[StateSnapshot]]:
    config = {"configurable": {"thread_id": thread_id}}
    result = graph.invoke(INPUT, config)
    return result, graph.get_state(config), list(graph.get_state_history(config))


async def _history_async(
    settings: Settings, thread_id: str
) -> tuple[Any, StateSnapshot, list[StateSnapshot], dict[tuple[str, int], int]]:
    from graphledger import KafkaSaver

    config: RunnableConfig = {"configurable": {"thread_id": thread_id}}
    async with KafkaSaver(settings) as saver:
        graph = build_graph().compile(checkpointer=saver)
        result = await graph.ainvoke(INPUT, config)
        state = await graph.aget_state(config)
        history = [snapshot async for snapshot in graph.aget_state_history(config)]
        return result, state, history, saver.consistency_token


def _summarize(history: list[StateSnapshot]) -> list[Summary]:
    return [
        (
            snapshot.metadata.get("step", 0) if snapshot.metadata else 0,
            str(snapshot.metadata.get("source", "")) if snapshot.metadata else "",
            dict(snapshot.values),
            tuple(snapshot.next),
            tuple((task.name, task.result) for task in snapshot.tasks),
        )
        for snapshot in history
    ]


def _checkpoint_id(snapshot: StateSnapshot) -> str | None:
    return snapshot.config["configurable"].get("checkpoint_id")


def _parent_id(snapshot: StateSnapshot) -> str | None:
    return snapshot.parent_config["configurable"].get("checkpoint_id") if snapshot.parent_config else None


def _report(
    out: TextIO, result: Any, state: StateSnapshot, history: list[StateSnapshot], token: Mapping[Any, int]
) -> None:
    acked = ", ".join(f"{topic}[{partition}]@{offset}" for (topic, partition), offset in sorted(token.items()))
    print(f"  invoke returned    {result!r}", file=out)
    print(f"  Kafka acknowledged the writes up to {acked or 'nothing'}", file=out)
    print(f"  get_state          values={dict(state.values)!r} next={tuple(state.next)!r}", file=out)
    print(f"  get_state_history  {len(history)} checkpoints, newest first, read back through the read API:", file=out)
    for snapshot, (step, source, values, next_, tasks) in zip(history, _summarize(history), strict=True):
        print(f"    step {step:>2}  {source:<5}  checkpoint {_checkpoint_id(snapshot)}  next={next_!r}", file=out)
        print(f"             values={values!r}", file=out)
        for name, written in tasks:
            print(f"             then {name} wrote {written!r}", file=out)


def _check(
    label: str, result: Any, state: StateSnapshot, history: list[StateSnapshot], reference: list[Summary]
) -> list[str]:
    problems = []
    summary = _summarize(history)
    if summary != EXPECTED_HISTORY:
        problems.append(f"{label}: history {summary!r} is not the documented {EXPECTED_HISTORY!r}")
    if summary != reference:
        problems.append(f"{label}: history {summary!r} differs from InMemorySaver's {reference!r}")
    if result != EXPECTED_HISTORY[0][2]:
        problems.append(f"{label}: invoke returned {result!r}, expected {EXPECTED_HISTORY[0][2]!r}")
    if dict(state.values) != result or tuple(state.next) != ():
        problems.append(f"{label}: get_state gave values={state.values!r} next={state.next!r}, expected {result!r}")
    if history and _checkpoint_id(state) != _checkpoint_id(history[0]):
        problems.append(f"{label}: get_state's checkpoint is not the newest in the history")
    ids = [_checkpoint_id(snapshot) for snapshot in history]
    if len(set(ids)) != len(ids):
        problems.append(f"{label}: checkpoint ids repeat: {ids}")
    parents = [_parent_id(snapshot) for snapshot in history]
    if parents != [*ids[1:], None]:
        problems.append(f"{label}: parent chain {parents} does not link the checkpoints {ids}")
    return problems
