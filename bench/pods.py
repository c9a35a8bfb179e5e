"""Pods rows of `make bench`: a thread that moves between agent processes, as a Service in front of agent
replicas or the Agent Server's queue workers move it.

`PODS` agent processes (OS processes, each with its own saver: `KafkaSaver`, or the official
`AsyncPostgresSaver` on a pool of its own without the per-instance lock, `bench/official.py`) run the chat
turns of `bench/conversations.py`. Conversations are `conversations.TURNS` turns long; their first turns
run before the clock starts. Each timed turn goes to a pod:
- random: a pod drawn at random (seeded), so with 4 pods about three turns in four land on a pod that did
  not run the conversation's last one (a hop);
- stay: the conversation's own pod, always (a thread pinned to one process, for comparison);
- random with a pause: random routing, and 300 ms between a conversation's turns (the projector has
  caught up by the next turn), at concurrency 16; its p50 is the figure.
Concurrency is the total over the pods. Both sides run in the same rounds, in an order reversed every
other round. A cell gives turns/s, the p50 and p99 turn latency (the coordinator's clock, from sending a
turn to its answer), the agent processes' CPU per turn (all of them) and the stack's. The pods run on
the agent's core, the stack on the others (`bench/placement.py`).

`python -m bench.pods` runs the section alone (`--ownership`: with a third side, KafkaSaver with
`GRAPHLEDGER_WRITE_OWNERSHIP=record`, and the rule's ratio); `python -m bench.pods --worker SIDE` is one pod.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

from bench.conversations import TURNS, chat_graph, message
from bench.official import UnlockedPoolSaver, saver_pool
from bench.placement import Placement, cpu_seconds
from bench.settle import Settle
from graphledger import KafkaSaver
from graphledger.settings import DEFAULT_PARTITIONS, Settings
from graphledger_server.devstack.stack import DevStack

PODS = 4
ROUNDS = 5
CONCURRENCY = (1, 16, 64)
RUN_S = 3.0
PAUSE_S = 0.3
PAUSE_CONCURRENCY = 16
SIDES = ("kafka", "official")
RECORDING = "kafka-record"
"""With `--ownership`: KafkaSaver with `GRAPHLEDGER_WRITE_OWNERSHIP=record`, the one-writer rule's cost."""
LABELS = {"kafka": "KafkaSaver", "official": "official (a pool per pod)", RECORDING: "KafkaSaver, ownership record"}


# -- one pod ---------------------------------------------------------------------------------------


async def _serve(side: str) -> None:
    """Answer `{"id", "thread", "n"}` lines with `{"id", "ms"}` once the turn is done, concurrently;
    `{"id", "cpu": true}` with this process's CPU seconds; `{"id", "reads": true}` with how its saver
    answered its reads so far (KafkaSaver's `ThreadReads` counters)."""
    settings = Settings()
    if side in ("kafka", RECORDING):
        async with KafkaSaver(settings) as saver:
            await _answer(chat_graph(saver), lambda: _reads_of(saver))
        return
    async with saver_pool(settings.postgres_dsn) as pool:
        await _answer(chat_graph(UnlockedPoolSaver(pool)), dict)


def _reads_of(saver: KafkaSaver) -> dict[str, int]:
    reads = saver._runtime.thread_reads
    if reads is None:
        return {}
    return {**reads.answered, **{f"read_api:{reason}": n for reason, n in reads.fell_back.items()}}


async def _answer(graph: Any, reads: Callable[[], dict[str, int]]) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    tasks: set[asyncio.Task[None]] = set()

    async def turn(command: dict[str, Any]) -> None:
        started = time.perf_counter()
        try:
            await graph.ainvoke(message(command["n"]), {"configurable": {"thread_id": command["thread"]}})
            answer: dict[str, Any] = {"id": command["id"], "ms": (time.perf_counter() - started) * 1000}
        except Exception as exc:  # the coordinator counts it and the bench fails
            answer = {"id": command["id"], "error": f"{type(exc).__name__}: {exc}"}
        _emit(answer)

    _emit({"ready": True})
    while line := await reader.readline():
        command = json.loads(line)
        if command.get("cpu"):
            usage = resource.getrusage(resource.RUSAGE_SELF)
            _emit({"id": command["id"], "cpu": usage.ru_utime + usage.ru_stime})
            continue
        if command.get("reads"):
            _emit({"id": command["id"], "reads": reads()})
            continue
        task = asyncio.create_task(turn(command))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    await asyncio.gather(*tasks)


def _emit(message_: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message_) + "\n")
    sys.stdout.flush()


# -- the coordinator -------------------------------------------------------------------------------


class Pod:
    """One agent process, driven over its stdin and stdout."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self._ids = iter(range(1 << 62))
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._reading = asyncio.create_task(self._read())

    @classmethod
    async def start(cls, side: str, env: dict[str, str]) -> Pod:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.pods", "--worker", side,
            env=env, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, limit=1 << 24,
        )  # fmt: skip
        assert process.stdout is not None
        ready = json.loads(await asyncio.wait_for(process.stdout.readline(), 120))
        assert ready.get("ready"), ready
        return cls(process)

    async def _read(self) -> None:
        assert self.process.stdout is not None
        while line := await self.process.stdout.readline():
            answer = json.loads(line)
            self._waiting.pop(answer["id"]).set_result(answer)
        for waiting in self._waiting.values():
            waiting.set_exception(RuntimeError(f"pod {self.process.pid} exited"))

    async def call(self, **command: Any) -> dict[str, Any]:
        assert self.process.stdin is not None
        ident = next(self._ids)
        waiting = self._waiting[ident] = asyncio.get_running_loop().create_future()
        self.process.stdin.write((json.dumps({"id": ident, **command}) + "\n").encode())
        answer = await waiting
        if "error" in answer:
            raise RuntimeError(f"pod {self.process.pid}: {answer['error']}")
        return answer

    async def cpu(self) -> float:
        return float((await self.call(cpu=True))["cpu"])

    async def reads(self) -> Counter[str]:
        return Counter((await self.call(reads=True))["reads"])

    async def stop(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        await self.process.wait()
        await self._reading


@dataclass
class Cell:
    """One run of one side at one concurrency and routing."""

    turns: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    hops: int = 0
    agent_cpu_s: float = 0.0
    stack_cpu_s: float = 0.0
    stack_parts: dict[str, float] = field(default_factory=dict)
    reads: Counter[str] = field(default_factory=Counter)
    """How the pods answered their reads (KafkaSaver: held, folded, new, read_api and why)."""
    """The stack's CPU seconds by component (broker, projector, api, postgres, sweeper)."""

    @property
    def rate(self) -> float:
        return self.turns / self.seconds if self.seconds else 0.0

    def per_turn_ms(self, cpu_s: float) -> float:
        return cpu_s / self.turns * 1000 if self.turns else 0.0


async def run_cell(
    pods: Sequence[Pod],
    concurrency: int,
    routing: str,
    rng: random.Random,
    stack_cpu: Any,
    pause_s: float = 0.0,
    run_s: float = RUN_S,
) -> Cell:
    """Turns of `concurrency` conversations at once for `run_s` seconds (or each's share of a cap)."""
    cap = 30 * concurrency if concurrency > 1 else 60
    per_worker = max(1, cap // concurrency)
    conversations = [
        [(f"pods-{uuid.uuid4()}", rng.randrange(len(pods))) for _ in range(-(-per_worker // (TURNS - 1)))]
        for _ in range(concurrency)
    ]
    # First turns before the clock, each on its conversation's own pod.
    await asyncio.gather(*(pods[home].call(thread=t, n=0) for worker in conversations for t, home in worker))
    cell = Cell()
    cpu_before = sum(await asyncio.gather(*(pod.cpu() for pod in pods)))
    reads_before = sum(await asyncio.gather(*(pod.reads() for pod in pods)), Counter[str]())
    stack_before = stack_cpu()
    started = time.perf_counter()
    deadline = started + run_s

    async def worker(plan: list[tuple[str, int]]) -> None:
        done = 0
        for thread, home in plan:
            last = home
            for n in range(1, TURNS):
                if done >= per_worker or time.perf_counter() > deadline:
                    return
                target = home if routing == "stay" else rng.randrange(len(pods))
                cell.hops += target != last
                sent = time.perf_counter()
                await pods[target].call(thread=thread, n=n)
                cell.latencies.append((time.perf_counter() - sent) * 1000)
                last, done = target, done + 1
                if pause_s:
                    await asyncio.sleep(pause_s)  # the pacing of a conversation, not a wait for anything

    await asyncio.gather(*(worker(plan) for plan in conversations))
    cell.seconds = time.perf_counter() - started
    cell.turns = len(cell.latencies)
    cell.agent_cpu_s = sum(await asyncio.gather(*(pod.cpu() for pod in pods))) - cpu_before
    cell.reads = sum(await asyncio.gather(*(pod.reads() for pod in pods)), Counter[str]()) - reads_before
    stack_after = stack_cpu()
    cell.stack_parts = {name: stack_after.get(name, 0.0) - seconds for name, seconds in stack_before.items()}
    cell.stack_cpu_s = sum(cell.stack_parts.values())
    return cell


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else 0.0


def _cell_text(cells: list[Cell], pause: bool) -> str:
    rate = statistics.median(c.rate for c in cells)
    p50 = statistics.median(_percentile(c.latencies, 0.5) for c in cells)
    p99 = statistics.median(_percentile(c.latencies, 0.99) for c in cells)
    agent = statistics.median(c.per_turn_ms(c.agent_cpu_s) for c in cells)
    stack = statistics.median(c.per_turn_ms(c.stack_cpu_s) for c in cells)
    head = f"p50 {p50:.1f} ms" if pause else f"{rate:,.0f}/s, p50 {p50:.1f} ms"
    return f"{head}, p99 {p99:.1f} ms; agent {agent:.1f} ms, stack {stack:.1f} ms CPU a turn"


def _parts(cell: Cell) -> str:
    """The stack's CPU a turn by component, largest first."""
    parts = sorted(cell.stack_parts.items(), key=lambda item: -item[1])
    return " ".join(f"{name} {cell.per_turn_ms(seconds):.1f}" for name, seconds in parts)


def _ratio(ours: list[Cell], theirs: list[Cell], pause: bool) -> str:
    if pause:  # lower latency is better: their p50 over ours
        pairs = zip(ours, theirs, strict=True)
        ratios = [_percentile(t.latencies, 0.5) / _percentile(o.latencies, 0.5) for o, t in pairs if o.latencies]
    else:
        ratios = [o.rate / t.rate for o, t in zip(ours, theirs, strict=True) if t.rate]
    return f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"


@asynccontextmanager
async def fresh_stack(work_dir: Path, placement: Placement, base: Settings | None = None) -> AsyncIterator[DevStack]:
    """A stack of its own for one round, placed on the stack's cores: tansu (the dev stack's broker) serves a
    fetch by scanning its in-memory log, so on one stack for every round KafkaSaver's turns would pay for
    every record the rounds before left (its CPU a turn doubled over five rounds), and a production broker
    indexes offsets (`bench/conversations.py`)."""
    placement.to_stack()  # the stack's processes inherit the stack's cores
    data_dir = Path(tempfile.mkdtemp(prefix="round-", dir=work_dir))
    stack = DevStack(data_dir, partitions=DEFAULT_PARTITIONS, base=base, log_level="WARNING")
    try:
        await asyncio.to_thread(stack.start)
        placement.to_agent()
        placement.pin(stack.pids().values())
        yield stack
    finally:
        placement.to_agent()
        await asyncio.to_thread(stack.stop)
    shutil.rmtree(data_dir, ignore_errors=True)  # kept when the round failed, for its logs


Stacks = Callable[[], AbstractAsyncContextManager[DevStack]]


async def run(
    stacks: Stacks,
    placement: Placement,
    rounds: int = ROUNDS,
    seed: int = 0,
    run_s: float = RUN_S,
    ownership: bool = False,
) -> tuple[list[str], str]:
    """The pods rows and where the last round ran: each round on a fresh stack (`stacks`), every side's pods
    started on it, the sides and each side's cells in an order reversed every other round (`ownership`: a
    third side, KafkaSaver with the one-writer rule off, and its ratio). Within a round tansu's cost a turn
    grows with the records the cells before left (`fresh_stack`), so a cell order kept for every round
    would charge that growth to the last cells (the pods-stay row after the random one) every time."""
    sides = (*SIDES, RECORDING) if ownership else SIDES
    rng = random.Random(seed)
    cells = [(routing, c, 0.0) for routing in ("random", "stay") for c in CONCURRENCY]
    cells.append(("random", PAUSE_CONCURRENCY, PAUSE_S))
    results: dict[tuple[str, int, float, str], list[Cell]] = {}
    where = ""
    for r in range(rounds):
        async with stacks() as stack:
            async with AsyncPostgresSaver.from_conn_string(stack.settings.postgres_dsn) as official:
                await official.setup()
            env = {**os.environ, **stack.client_env()}
            envs = {
                "kafka": env,
                "official": {**env, "GRAPHLEDGER_POSTGRES_DSN": stack.settings.postgres_dsn},
                RECORDING: {**env, "GRAPHLEDGER_WRITE_OWNERSHIP": "record"},
            }
            pods = {side: [await Pod.start(side, envs[side]) for _ in range(PODS)] for side in sides}
            placement.pin(stack.pids().values())  # the official pods' Postgres backends
            where = placement.describe(stack.pids())

            def stack_cpu(stack: DevStack = stack) -> dict[str, float]:
                return {name: cpu_seconds([pid]) for name, pid in stack.pids().items()}

            try:
                async with Settle(stack.settings) as settle:
                    for side in sides if r % 2 == 0 else sides[::-1]:
                        for routing, concurrency, pause in cells if r % 2 == 0 else cells[::-1]:
                            await settle()
                            cell = await run_cell(pods[side], concurrency, routing, rng, stack_cpu, pause, run_s)
                            results.setdefault((routing, concurrency, pause, side), []).append(cell)
                            print(
                                f"  pods {side:<8} {routing:<6} c={concurrency:<3}{' paused' if pause else ''} "
                                f"{cell.rate:8.0f}/s p50 {_percentile(cell.latencies, 0.5):6.1f} ms hops "
                                f"{cell.hops / max(1, cell.turns):.0%} agent "
                                f"{cell.per_turn_ms(cell.agent_cpu_s):.1f} stack "
                                f"{cell.per_turn_ms(cell.stack_cpu_s):.1f} ms CPU a turn ({_parts(cell)})"
                                + (f"; reads {dict(cell.reads.most_common())}" if cell.reads else ""),
                                flush=True,
                            )
            finally:
                for side_pods in pods.values():
                    for pod in side_pods:
                        await pod.stop()
    lines = [
        f"| pods ({PODS} agent processes, {rounds} rounds) | concurrency | {LABELS['kafka']} | "
        f"{LABELS['official']} | ratio (median; spread) |",
        "|---|---:|---|---|---:|",
    ]
    for routing, concurrency, pause in cells:
        ours, theirs = (results[(routing, concurrency, pause, side)] for side in SIDES)
        hops = sum(c.hops for c in ours) / max(1, sum(c.turns for c in ours))
        label = {"random": f"random pod ({hops:.0%} of turns hop)", "stay": "each thread on its own pod"}[routing]
        if pause:
            label += f", {PAUSE_S * 1000:.0f} ms between a conversation's turns (p50 ratio)"
        lines.append(
            f"| {label} | {concurrency} | {_cell_text(ours, bool(pause))} | {_cell_text(theirs, bool(pause))} "
            f"| {_ratio(ours, theirs, bool(pause))} |"
        )
    lines += ["", "Where the stack's CPU a turn goes (median ms, by component):", ""]
    for routing, concurrency, pause in cells:
        row = [f"{routing} c={concurrency}{', paused' if pause else ''}"]
        for side in SIDES:
            cells_of = results[(routing, concurrency, pause, side)]
            parts = {name for c in cells_of for name in c.stack_parts}
            medians = {n: statistics.median(c.per_turn_ms(c.stack_parts.get(n, 0.0)) for c in cells_of) for n in parts}
            ordered = sorted(medians.items(), key=lambda item: -item[1])
            row.append(f"{LABELS[side]}: " + ", ".join(f"{n} {ms:.1f}" for n, ms in ordered))
        lines.append("- " + "; ".join(row))
    if ownership:
        lines += ["", "| one writer in the pods rows | concurrency | refuse / record (median; spread) |"]
        lines.append("|---|---:|---:|")
        for routing, concurrency, pause in cells:
            on, off = (results[(routing, concurrency, pause, side)] for side in ("kafka", RECORDING))
            label = f"{routing}{', paused' if pause else ''}"
            lines.append(f"| {label} | {concurrency} | {_ratio(on, off, bool(pause))} |")
    for line in lines:
        print(line, flush=True)
    return lines, where


async def _alone(rounds: int, seed: int, ownership: bool) -> None:
    placement = Placement.plan()
    work_dir = Path(tempfile.mkdtemp(prefix="graphledger-bench-pods-"))
    _, where = await run(lambda: fresh_stack(work_dir, placement), placement, rounds, seed, ownership=ownership)
    print(f"Machine: {where}; a fresh stack per round")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", choices=(*SIDES, RECORDING), help="run as one pod of this side")
    parser.add_argument("--ownership", action="store_true", help="also KafkaSaver with the one-writer rule off")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--seed", type=int, default=0, help="the routing's seed")
    args = parser.parse_args()
    if args.worker:
        asyncio.run(_serve(args.worker))
    else:
        asyncio.run(_alone(args.rounds, args.seed, args.ownership))
