"""The seed-001 graph (`node_a` → `node_b`, `bar` with an `add` reducer), shared by tests and demo checks."""

from __future__ import annotations

from operator import add
from typing import Annotated

from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict


class State(TypedDict):
    foo: str
    bar: Annotated[list[str], add]


def node_a(state: State) -> dict:
    return {"foo": "a", "bar": ["a"]}


def node_b(state: State) -> dict:
    return {"foo": "b", "bar": ["b"]}


def build() -> StateGraph:
    workflow = StateGraph(State)
    workflow.add_node(node_a)
    workflow.add_node(node_b)
    workflow.add_edge(START, "node_a")
    workflow.add_edge("node_a", "node_b")
    workflow.add_edge("node_b", END)
    return workflow
