"""A minimal LangGraph agent that checkpoints through graphledger, configured only by environment.

Every run appends one turn to the thread's history: the write goes to Kafka through `KafkaSaver`, and
the state read right after it comes back through the read API, including that turn (read your
writes). It needs the client (`pip install graphledger langgraph`) and the `GRAPHLEDGER_*` variables
(see agent.env.example); examples/agent-deployment.yaml runs it in Kubernetes.

    python agent.py                      # one turn on thread $AGENT_THREAD_ID, then exit
    python agent.py --every 60           # one turn a minute until SIGTERM
"""

from __future__ import annotations

import argparse
import json
import operator
import os
import signal
import socket
import threading
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph

from graphledger import KafkaSaver


class State(TypedDict):
    turns: Annotated[list[str], operator.add]


def take_turn(state: State) -> dict[str, Any]:
    return {"turns": [f"turn {len(state['turns']) + 1} by {socket.gethostname()}"]}


def build_graph() -> StateGraph:
    graph = StateGraph(State)
    graph.add_node("take_turn", take_turn)
    graph.add_edge(START, "take_turn")
    graph.add_edge("take_turn", END)
    return graph


def run_turn(agent: Any, thread_id: str) -> dict[str, Any]:
    """One turn on `thread_id`; what the read API then returns for the thread."""
    config = {"configurable": {"thread_id": thread_id}}
    agent.invoke({"turns": []}, config)
    state = agent.get_state(config)
    return {
        "thread_id": thread_id,
        "turns": len(state.values["turns"]),
        "last": state.values["turns"][-1],
        "checkpoint_id": state.config["configurable"]["checkpoint_id"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--thread-id", default=os.environ.get("AGENT_THREAD_ID", "example-agent"))
    parser.add_argument("--every", type=float, default=0.0, help="seconds between turns; 0: one turn, then exit")
    args = parser.parse_args(argv)

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    # KafkaSaver.from_env() reads GRAPHLEDGER_*: Kafka (and its TLS/SASL settings), the topic prefix,
    # the read API's URL and token. Closing it flushes and stops its Kafka producer.
    with KafkaSaver.from_env() as saver:
        agent = build_graph().compile(checkpointer=saver)
        while True:
            print(json.dumps(run_turn(agent, args.thread_id)), flush=True)
            if args.every <= 0 or stop.wait(args.every):
                return 0


if __name__ == "__main__":
    raise SystemExit(main())
