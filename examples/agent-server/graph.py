"""A small graph for LangGraph's Agent Server: it notes each turn, remembers it in the long-term
store, and asks a human (an interrupt) to confirm a turn that begins with "review:".

Its checkpoints, pending writes (the interrupt among them) and memories all go through graphledger:
the server takes its checkpointer and store from persistence.py (see langgraph.json), so the graph
itself names neither.
"""

from __future__ import annotations

import operator
from typing import Annotated, Any, Literal, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from langgraph.types import interrupt

REVIEW_PREFIX = "review:"
MEMORY_NAMESPACE = "memories"
"""Each thread's memories live under ("memories", thread_id), keyed "turn-N"."""


class State(TypedDict):
    turns: Annotated[list[str], operator.add]


async def note(state: State, runtime: Runtime) -> dict[str, Any]:
    said = state["turns"][-1]
    info = runtime.execution_info
    if runtime.store is not None and info is not None and info.thread_id is not None:
        key = f"turn-{len(state['turns'])}"
        await runtime.store.aput((MEMORY_NAMESPACE, info.thread_id), key, {"text": said})
    return {"turns": [f"noted: {said}"]}


def route(state: State) -> Literal["review", "__end__"]:
    return "review" if state["turns"][-2].startswith(REVIEW_PREFIX) else END


def review(state: State) -> dict[str, Any]:
    verdict = interrupt({"question": f"confirm {state['turns'][-2]!r}?"})
    return {"turns": [f"reviewed: {verdict}"]}


builder = StateGraph(State)
builder.add_node("note", note)
builder.add_node("review", review)
builder.add_edge(START, "note")
builder.add_conditional_edges("note", route)
builder.add_edge("review", END)
graph = builder.compile()
