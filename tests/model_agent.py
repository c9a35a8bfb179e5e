"""One agent of the model-based test (`tests/acceptance/test_model_based.py`): a `KafkaSaver` from
`GRAPHLEDGER_*`, running the test's commands concurrently, each as a task of one event loop.

Run as `python tests/model_agent.py`. Each stdin line is `{"id", "op", "args"}` (`args` packed by
`model_ops.pack`); each answer is one stdout line `{"id", "ok", "t0", "t1", "records", ...}`:
- `t0`, `t1`: `time.monotonic()` (one clock for every process of the machine) right before the call
  and right after it returned: a write is acknowledged at `t1`, a read began at `t0` and ended at `t1`;
- `records`: for each event the call published, in order, the `[partition, offset]` of its records
  (test-only instrumentation: the public API does not say where a write landed, and the test orders
  writes by log order);
- `result` (packed): what a read answered;
- `error`, `retryable` when the call raised;
- `answered`: how each of its thread reads was answered (`held`, `folded`, `new`, `read_api:<why>`);
- `calls` (packed), for a `turn` (a LangGraph run): each `aput` and `aput_writes` the run made, in the
  form of the script's own `put` and `put_writes` arguments, with the intent its record carried, its
  records, its times and how it ended.

The saver is opened with `async with`, so every call runs on this loop without a hop and the
instrumentation sees the command it belongs to (a context variable). An erase is asked again while it
answers `erasure_incomplete`; the test finds the erasure records in the log.
"""

from __future__ import annotations

import asyncio
import contextvars
import copy
import json
import sys
import time
from typing import Any

from langgraph.checkpoint.base import get_checkpoint_metadata

from graphledger import KafkaSaver
from graphledger.errors import GraphledgerError
from model_ops import build_graph, pack, unpack

ERASE_DEADLINE_S = 120.0
"""How long an erase is asked again while it answers `erasure_incomplete` (the projector is down)."""

_records: contextvars.ContextVar[list[list[list[int]]] | None] = contextvars.ContextVar("records", default=None)
_calls: contextvars.ContextVar[list[dict[str, Any]] | None] = contextvars.ContextVar("calls", default=None)
_call: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("call", default=None)
_answered: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("answered", default=None)
"""How the command's reads were answered (`ThreadReads`' counters: `held`, `folded`, `read_api:<why>`)."""


def _instrument(saver: KafkaSaver) -> None:
    """Record where each event of a command landed, and a run's saver writes."""
    publisher = saver._runtime.publisher
    publish = publisher.publish

    async def publishing(topic: str, key: str | None, event: Any, **kwargs: Any) -> list[tuple[str, int, int]]:
        positions = await publish(topic, key, event, **kwargs)
        if (records := _records.get()) is not None:
            records.append([[partition, offset] for _, partition, offset in positions])
        if (call := _call.get()) is not None:
            call["intent"] = event.intent
        return positions

    publisher.publish = publishing  # type: ignore[method-assign]
    aput, aput_writes = saver.aput, saver.aput_writes

    async def put(config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        conf = config["configurable"]
        args = {"thread": conf["thread_id"], "ns": conf.get("checkpoint_ns", ""), "parent": conf.get("checkpoint_id"),
                "extra": {}, "checkpoint": copy.deepcopy(checkpoint),
                "metadata": get_checkpoint_metadata(config, metadata), "new_versions": dict(new_versions)}  # fmt: skip
        return await _called("put", args, aput(config, checkpoint, metadata, new_versions))

    async def put_writes(config: Any, writes: Any, task_id: str, task_path: str = "") -> Any:
        conf = config["configurable"]
        args = {"thread": conf["thread_id"], "ns": conf.get("checkpoint_ns", ""),
                "checkpoint_id": conf["checkpoint_id"], "writes": copy.deepcopy(list(writes)), "task_id": task_id,
                "task_path": task_path}  # fmt: skip
        return await _called("put_writes", args, aput_writes(config, writes, task_id, task_path))

    saver.aput = put  # type: ignore[method-assign]
    saver.aput_writes = put_writes  # type: ignore[method-assign]
    reads = saver._runtime.thread_reads
    if reads is not None:
        count = reads._count

        def counting(answered: str, fell_back: str | None = None) -> None:
            if (noted := _answered.get()) is not None:
                noted.append(answered if fell_back is None else f"{answered}:{fell_back}")
            count(answered, fell_back)

        reads._count = counting  # type: ignore[method-assign]


async def _called(kind: str, args: dict[str, Any], call: Any) -> Any:
    """Run a saver write of a turn, noting it in the turn's calls."""
    calls = _calls.get()
    if calls is None:
        return await call
    noted: dict[str, Any] = {"kind": kind, "args": args, "records": [], "intent": None, "t0": time.monotonic()}
    calls.append(noted)
    records, this = _records.set(noted["records"]), _call.set(noted)
    try:
        return await call
    except BaseException as exc:  # a cancelled write may have landed: the test cannot tell
        noted["error_type"] = type(exc).__name__
        raise
    finally:
        noted["t1"] = time.monotonic()
        _records.reset(records)
        _call.reset(this)


def _config(thread: str, ns: str | None = "", checkpoint_id: str | None = None, **extra: Any) -> dict[str, Any]:
    configurable: dict[str, Any] = {"thread_id": thread, **extra}
    if ns is not None:
        configurable["checkpoint_ns"] = ns
    if checkpoint_id is not None:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


class Agent:
    def __init__(self, saver: KafkaSaver) -> None:
        self.saver = saver
        self.graph = build_graph(saver)

    async def run(self, op: str, a: dict[str, Any]) -> dict[str, Any]:
        saver = self.saver
        match op:
            case "put":
                config = _config(a["thread"], a["ns"], a["parent"], **a["extra"])
                await saver.aput(config, a["checkpoint"], a["metadata"], a["new_versions"])
            case "put_writes":
                config = _config(a["thread"], a["ns"], a["checkpoint_id"])
                await saver.aput_writes(config, a["writes"], a["task_id"], a["task_path"])
            case "delete_thread":
                await saver.adelete_thread(a["thread"])
            case "copy_thread":
                await saver.acopy_thread(a["source"], a["target"])
            case "prune":
                await saver.aprune(a["threads"], strategy=a["strategy"])
            case "delete_for_runs":
                await saver.adelete_for_runs(a["run_ids"])
            case "erase":
                await self._erase(a["thread"])
            case "turn":
                config = _config(a["thread"], None)
                if a["run_id"] is not None:
                    config["metadata"] = {"run_id": a["run_id"]}
                await self.graph.ainvoke({"messages": [a["text"]]}, config, durability="sync")
            case "get_tuple":
                return {"result": await saver.aget_tuple(_config(a["thread"], a["ns"], a["checkpoint_id"]))}
            case "list":
                before = _config(a["thread"], None, a["before"]) if a["before"] else None
                config = _config(a["thread"], a["ns"])
                found = saver.alist(config, filter=a["filter"], before=before, limit=a["limit"])
                return {"result": [t async for t in found]}
            case "list_all":
                return {"result": [t async for t in saver.alist(None, filter=a["filter"])]}
            case "get_state":
                return {"result": await self.graph.aget_state(_config(a["thread"], None))}
            case "keys":
                runtime = saver._runtime
                assert runtime.sealer is not None, "the model test runs with sealing on"
                await runtime.sealer.tenant_hashing(runtime.tenant)
                return {"result": {t: key.decode() for t in a["threads"] if (key := runtime.record_key_of_thread(t))}}
            case "stats":
                reads = saver._runtime.thread_reads
                threads = saver._runtime.threads
                answered, fell_back = (dict(reads.answered), dict(reads.fell_back)) if reads else ({}, {})
                return {"result": {"answered": answered, "fell_back": fell_back, "held_bytes": threads.size}}
            case _:
                raise ValueError(f"unknown op {op!r}")
        return {}

    async def _erase(self, thread: str) -> None:
        """Erase the thread, again while the projector is too far behind to name its copies (the test
        finds the erasure records in the log)."""
        deadline = time.monotonic() + ERASE_DEADLINE_S
        while True:
            try:
                await self.saver.aerase_thread(thread)
                return
            except GraphledgerError as exc:
                if not exc.retryable or time.monotonic() > deadline:
                    raise


def emit(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


async def handle(agent: Agent, command: dict[str, Any]) -> None:
    records: list[list[list[int]]] = []
    _records.set(records)
    answered: list[str] = []
    _answered.set(answered)
    calls: list[dict[str, Any]] = []
    if command["op"] == "turn":  # the run's saver writes, each with its own records
        _calls.set(calls)
    answer: dict[str, Any] = {"id": command["id"]}
    t0 = time.monotonic()
    try:
        result = await agent.run(command["op"], unpack(command["args"]))
    except Exception as exc:
        t1 = time.monotonic()
        answer |= {"ok": False, "error": f"{type(exc).__name__}: {exc}", "error_type": type(exc).__name__,
                   "retryable": bool(getattr(exc, "retryable", False))}  # fmt: skip
    else:
        t1 = time.monotonic()
        answer["ok"] = True
        if "result" in result:
            answer["result"] = pack(result["result"])
    if command["op"] == "turn":
        answer["calls"] = pack(calls)
    if answered:
        answer["answered"] = answered
    emit({**answer, "t0": t0, "t1": t1, "records": records})


async def main() -> None:
    async with KafkaSaver.from_env() as saver:
        _instrument(saver)
        agent = Agent(saver)
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=64 * 1024 * 1024)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        tasks: set[asyncio.Task[None]] = set()
        emit({"event": "ready"})
        while line := await reader.readline():
            task = asyncio.create_task(handle(agent, json.loads(line)))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        await asyncio.gather(*tasks)


if __name__ == "__main__":
    asyncio.run(main())
