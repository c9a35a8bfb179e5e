"""One agent pod for the multi-process tests: its own `KafkaSaver` and `KafkaStore` from `GRAPHLEDGER_*`.

Run as `python tests/agent_process.py`. It reads one JSON command per line on stdin and answers each
with one JSON line on stdout carrying the command's `id`: `{"id", "ok": true, ...}`, or
`{"id", "ok": false, "error", "retryable"}` when the call raised. `gate_open` is handled at once, even
while another command runs, so that a test can hold a node (a `gate:<name>` message) and release it.

The graph is a chat: each turn appends the user's message and the node's reply to `messages`. A
message `interrupt:<q>` makes the node ask `<q>` with `interrupt()` and reply with the answer given
on resume; `gate:<name>` makes the node report `{"event": "in_node", "gate": name}` and wait for
`gate_open` before replying; a turn's `read_gate` holds it likewise once its run has read the thread
(`{"event": "read", "gate": name}`), before it writes; a turn's `checkpoint_id` runs it from that older
checkpoint (time travel: a branch). `continue` runs the thread's pending tasks. A
turn answers how long its invoke took (`elapsed_ms`) and its read of the thread (`get_ms`).

`load_start` starts the bench's chat load in this process (`bench/conversations.py`: `concurrency`
workers, each running conversations of ten turns of 200-character messages on threads of their own)
and answers at once; `load_stop` stops it and answers the turns it ran and the errors it met.
"""

from __future__ import annotations

import json
import queue
import sys
import threading
import time
import uuid
from operator import add
from typing import Annotated, Any, TypedDict

from langgraph.checkpoint.base import empty_checkpoint
from langgraph.graph import START, StateGraph
from langgraph.types import Command, interrupt

from graphledger import KafkaSaver, KafkaStore

GATE_WAIT_S = 120.0
LOAD_TURNS = 10
"""Turns per conversation of the chat load, as the bench runs them."""
LOAD_MESSAGE = "x" * 200


class Chat(TypedDict):
    messages: Annotated[list[str], add]


class Pod:
    def __init__(self) -> None:
        self.saver = KafkaSaver.from_env()
        self.get_s = 0.0
        """Seconds the current turn's thread read (`get_tuple`) took."""
        get_tuple = self.saver.get_tuple

        def timed_get(config: Any) -> Any:
            started = time.perf_counter()
            try:
                found = get_tuple(config)
            finally:
                self.get_s += time.perf_counter() - started
            if (gate := self.read_gate) is not None:
                self.read_gate = None  # the turn's first read: hold it there
                emit({"event": "read", "gate": gate})
                if not self.gate(gate).wait(GATE_WAIT_S):
                    raise TimeoutError(f"gate {gate} was never opened")
            return found

        self.saver.get_tuple = timed_get  # type: ignore[method-assign]
        self.store = KafkaStore.from_env()
        self.gates: dict[str, threading.Event] = {}
        self.read_gate: str | None = None
        """A turn's `read_gate`: once its run has read the thread, it reports `read` and waits for the gate."""
        self.lock = threading.Lock()
        self.loading = threading.Event()
        self.load_workers: list[threading.Thread] = []
        self.load_turns = 0
        self.load_errors: list[str] = []
        builder = StateGraph(Chat)
        builder.add_node("reply", self.reply)
        builder.add_edge(START, "reply")
        self.graph = builder.compile(checkpointer=self.saver)

    def gate(self, name: str) -> threading.Event:
        with self.lock:
            return self.gates.setdefault(name, threading.Event())

    def reply(self, state: Chat) -> dict[str, Any]:
        last = state["messages"][-1]
        if last.startswith("interrupt:"):
            return {"messages": [f"answer {interrupt(last)}"]}
        if last.startswith("gate:"):
            name = last.removeprefix("gate:")
            emit({"event": "in_node", "gate": name})
            if not self.gate(name).wait(GATE_WAIT_S):
                raise TimeoutError(f"gate {name} was never opened")
        return {"messages": [f"reply to {last}"]}

    def run(self, command: dict[str, Any]) -> dict[str, Any]:
        op = command["op"]
        config = {"configurable": {"thread_id": command.get("thread", "")}}
        if op == "turn":  # one invoke and nothing else: a failure means the turn wrote nothing after its read
            started, self.get_s = time.perf_counter(), 0.0
            self.read_gate = command.get("read_gate")
            if (older := command.get("checkpoint_id")) is not None:  # time travel: a branch from an older one
                config["configurable"]["checkpoint_id"] = older
            messages = self.graph.invoke({"messages": [command["text"]]}, config)["messages"]
            return {
                "messages": messages,
                "elapsed_ms": (time.perf_counter() - started) * 1000,
                "get_ms": self.get_s * 1000,
            }
        if op == "load_start":
            self.loading.set()
            for n in range(command["concurrency"]):
                worker = threading.Thread(target=self.load, name=f"load-{n}", daemon=True)
                worker.start()
                self.load_workers.append(worker)
            return {}
        if op == "load_stop":
            self.loading.clear()
            for worker in self.load_workers:
                worker.join()
            self.load_workers.clear()
            return {"turns": self.load_turns, "errors": self.load_errors[:20]}
        if op == "reads":  # how the saver answered its reads of threads so far (`ThreadReads`)
            reads = self.saver._runtime.thread_reads
            return {"answered": dict(reads.answered), "fell_back": dict(reads.fell_back)} if reads else {}
        if op == "continue":  # the thread's pending tasks, run from its newest checkpoint (`invoke(None)`)
            return {"messages": self.graph.invoke(None, config)["messages"]}
        if op == "resume":
            return {"messages": self.graph.invoke(Command(resume=command["value"]), config)["messages"]}
        if op == "state":
            state = self.graph.get_state(config)
            return {"messages": state.values.get("messages", []), "next": list(state.next)}
        if op == "history":  # newest first: (checkpoint id, parent id)
            history = self.graph.get_state_history(config)
            return {"checkpoints": [(_id(s.config), _id(s.parent_config)) for s in history]}
        if op == "put":  # one checkpoint put, no read first: a new thread's first write
            checkpoint = empty_checkpoint()
            checkpoint["channel_values"] = {"note": command.get("text", "")}
            checkpoint["channel_versions"] = {"note": "1"}
            written = self.saver.put(
                {"configurable": {**config["configurable"], "checkpoint_ns": ""}},
                checkpoint,
                {"source": "input", "step": -1},
                {"note": "1"},
            )
            return {"checkpoint_id": written["configurable"]["checkpoint_id"]}
        if op == "store_put":
            self.store.put(tuple(command["namespace"]), command["key"], command["value"])
            return {}
        if op == "store_get":
            item = self.store.get(tuple(command["namespace"]), command["key"])
            return {"value": None if item is None else item.value}
        if op == "store_search":
            items = self.store.search(tuple(command["namespace"]), limit=100)
            return {"items": [[list(i.namespace), i.key, i.value] for i in items]}
        raise ValueError(f"unknown op {op!r}")

    def load(self) -> None:
        """Conversations of `LOAD_TURNS` turns on new threads, until `load_stop`."""
        n = 0
        while self.loading.is_set():
            if n % LOAD_TURNS == 0:
                config = {"configurable": {"thread_id": f"load-{uuid.uuid4().hex}"}}
            try:
                self.graph.invoke({"messages": [f"message {n} " + LOAD_MESSAGE]}, config)
            except Exception as exc:
                with self.lock:
                    self.load_errors.append(f"{type(exc).__name__}: {exc}")
            else:
                with self.lock:
                    self.load_turns += 1
            n += 1


def _id(config: Any) -> str | None:
    return config["configurable"]["checkpoint_id"] if config else None


_out = threading.Lock()


def emit(message: dict[str, Any]) -> None:
    with _out:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()


def main() -> None:
    pod = Pod()
    commands: queue.Queue[dict[str, Any] | None] = queue.Queue()

    def read() -> None:
        for line in sys.stdin:
            command = json.loads(line)
            if command["op"] == "gate_open":
                pod.gate(command["name"]).set()
                emit({"id": command["id"], "ok": True})
            else:
                commands.put(command)
        commands.put(None)

    threading.Thread(target=read, daemon=True).start()
    emit({"event": "ready"})
    while (command := commands.get()) is not None:
        try:
            emit({"id": command["id"], "ok": True, **pod.run(command)})
        except Exception as exc:
            emit({"id": command["id"], "ok": False, "error": f"{type(exc).__name__}: {exc}",
                  "retryable": bool(getattr(exc, "retryable", False))})  # fmt: skip
    pod.saver.close()
    pod.store.close()


if __name__ == "__main__":
    main()
