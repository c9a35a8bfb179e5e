"""Conversation rows of `make bench`: an agent's turn, KafkaSaver beside the official savers and the limit.

A turn is one `ainvoke` of a chat graph on LangGraph's `MessagesState`: two nodes in sequence (a model
reply, then a follow-up), each appending one AI message to the user's, so a turn adds three messages
and makes eight saver calls (one get, four puts, three put_writes).

Workloads, each at concurrency 1, 16 and 64 (each concurrent worker runs conversations of its own):
- chat turn: a thread's next turn. Conversations are `TURNS` turns long; their first turns run before
  the clock starts, so the row measures next turns only.
- turn + `aget_state`: the same, each turn followed by `aget_state` of its thread.
- first turn of a new thread: every turn on a thread never seen before.
- hop turn, at concurrency 1: the turns of a conversation alternate between two savers, as when a load
  balancer sends each turn to another pod (a KafkaSaver never holds the thread it is asked for); the
  non-hop row runs in the same rounds on one saver, for comparison.
- the chat turn at concurrency 1 on a log that already holds `Pace.drift_records` records: drift (see `run`).

Every row runs on a stack of its own, started for it (`RowStack`): the dev stack's broker (tansu) serves
a fetch by scanning its in-memory log, so its cost per turn grows with every record an earlier row
left, while a production broker's does not (it indexes offsets). A row on the log of the rows before
it would measure their leftovers; the drift row measures exactly that, on a log filled on purpose.

Sides: `InMemorySaver` (LangGraph with no persistence: the limit; a fresh one per run, so its memory
does not grow over the bench), the official `AsyncPostgresSaver` on one connection and on a pool
without the per-instance lock (`bench/official.py`), and KafkaSaver.

Every row runs in rounds; each round runs every side, in an order reversed every other round, so the
machine's drift falls on all of them. Before each run the projector catches up with the log
(`bench/settle.py`) and garbage is collected, outside the clock. A run's workers start turns for
`RUN_S` seconds or until the run's cap of turns, whichever comes first, so a slow side cannot stretch
the bench. A run reports turns per second (all turns over the wall time from the first start to the
last end), the p50 latency of a turn, and the agent process's CPU (user + system time of the bench
process, all its threads) per turn and over the run's wall time: how busy the agent's core was, near
100 % when the side is bound by the agent's CPU, well below when it waits on something else; and the
stack's CPU per turn (every process of the row's stack: broker, Postgres and its backends, projector, read
API, sweeper; what an idle stack spends counts too, so the limit's column shows that much). A row
prints each side's medians over the rounds, and the ratio of KafkaSaver's median turns/s to the
stronger official form's median, with its spread: the lowest and highest of the per-round ratios,
each of a round's KafkaSaver against that round's stronger form.
"""

from __future__ import annotations

import asyncio
import gc
import math
import resource
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Literal

from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph

ROUNDS = 3
CONCURRENCY = (1, 16, 64)
RUN_S = 2.0
"""Seconds a run starts turns for (it stops earlier at its cap of turns)."""
TURNS = 10
"""Turns per conversation: the history a turn reads and writes grows to 30 messages."""
MESSAGE = "x" * 200
WARM_UP_TURNS = 40
"""Untimed turns per side on each row's stack before it is measured: connections opened, caches warm."""

Settle = Callable[[], Awaitable[object]]
StackCpu = Callable[[], float]
"""CPU seconds the row's stack (every process of it) has used so far."""
RowStack = Callable[
    [], AbstractAsyncContextManager[tuple[Sequence[Any], Mapping[str, Sequence[Any]], Settle, StackCpu]]
]
"""Opens a fresh stack for one row: KafkaSaver's two savers, each official form's two, its `Settle` and its
`StackCpu`."""
DRIFT_RECORDS = 40_000
"""Records in the log before the drift row's turns (written by chat turns at concurrency 64)."""


def _model(state: MessagesState) -> dict[str, Any]:
    return {"messages": [AIMessage(f"reply to {state['messages'][-1].content[:20]}" + MESSAGE)]}


def _follow_up(state: MessagesState) -> dict[str, Any]:
    return {"messages": [AIMessage("anything else? " + MESSAGE)]}


def chat_graph(saver: Any) -> Any:
    builder = StateGraph(MessagesState)
    builder.add_node("model", _model)
    builder.add_node("follow_up", _follow_up)
    builder.add_edge(START, "model")
    builder.add_edge("model", "follow_up")
    return builder.compile(checkpointer=saver)


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    new_threads: bool = False
    """Every turn on a new thread (else conversations of `TURNS` turns, their first turns untimed)."""
    get_state: bool = False
    """`aget_state` after each turn, inside the turn's latency."""
    hop: bool = False
    """Turn `n` of a conversation on the side's saver `n % 2`."""


CHAT = Workload("chat turn")
WITH_STATE = Workload("turn + `aget_state`", get_state=True)
FIRST = Workload("first turn of a new thread", new_threads=True)
HOP = Workload("hop turn (each turn on the other saver)", hop=True)
NON_HOP = Workload("non-hop turn (same rounds)")
RECORDS_PER_TURN = 7
"""Records a chat turn writes: four puts and three put_writes."""


def drift(records: int) -> Workload:
    """The chat turn again, on a log that holds `records` records first."""
    return Workload(f"chat turn on a log of {records:,} more records (drift)")


@dataclass(frozen=True, slots=True)
class Side:
    name: str
    kind: Literal["limit", "official", "ours"]
    savers: Callable[[], Sequence[Any]]
    """The savers of a run: the first serves ordinary turns; hop turns use two, as two pods would."""
    hops: bool = True
    """False where two savers cannot share a thread (two `InMemorySaver`s are two separate memories)."""


@dataclass(frozen=True, slots=True)
class Run:
    turns: int
    turns_per_s: float
    p50_ms: float
    cpu_ms: float
    """The agent process's CPU (user + system, all threads) per turn."""
    busy: float
    """The agent process's CPU over the run's wall time: near 1 (its one core) it is bound by its own CPU."""
    stack_cpu_ms: float | None = None
    """The stack's CPU (broker, Postgres, projector, read API, sweeper) per turn."""


Rows = dict[str, list[Run]]
"""Each side's runs of one workload, by side name."""


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _config() -> dict[str, Any]:
    return {"configurable": {"thread_id": str(uuid.uuid4())}}


def message(n: int) -> dict[str, Any]:
    return {"messages": [HumanMessage(f"message {n} " + MESSAGE)]}


async def _run(
    savers: Sequence[Any],
    workload: Workload,
    concurrency: int,
    turns: int,
    seconds: float,
    settle: Settle,
    stack_cpu: StackCpu | None = None,
) -> Run:
    """Turns by `concurrency` workers, each starting turns for `seconds` or until its share of `turns`
    is done; turn `n` of a conversation runs on `graphs[n % len(graphs)]`."""
    graphs = [chat_graph(s) for s in (savers[:2] if workload.hop else savers[:1])]
    per_worker = max(1, turns // concurrency)
    plans: list[list[tuple[dict[str, Any], int]]] = []
    openings: list[list[dict[str, Any]]] = []
    for _ in range(concurrency):
        if workload.new_threads:
            plans.append([(_config(), 0) for _ in range(per_worker)])
            openings.append([])
            continue
        configs = [_config() for _ in range(math.ceil(per_worker / (TURNS - 1)))]
        plans.append([(config, n) for config in configs for n in range(1, TURNS)][:per_worker])
        openings.append(configs)

    async def open_conversations(configs: list[dict[str, Any]]) -> None:
        for config in configs:
            await graphs[0].ainvoke(message(0), config)

    await asyncio.gather(*(open_conversations(configs) for configs in openings))
    await settle()
    gc.collect()

    latencies: list[float] = []

    async def worker(plan: list[tuple[dict[str, Any], int]]) -> None:
        for config, n in plan:
            if time.perf_counter() >= deadline:
                break
            graph = graphs[n % len(graphs)]
            turn_started = time.perf_counter()
            await graph.ainvoke(message(n), config)
            if workload.get_state:
                await graph.aget_state(config)
            latencies.append(time.perf_counter() - turn_started)

    stack = stack_cpu() if stack_cpu is not None else 0.0
    cpu, started = _cpu_s(), time.perf_counter()
    deadline = started + seconds
    await asyncio.gather(*(worker(plan) for plan in plans))
    elapsed, cpu = time.perf_counter() - started, _cpu_s() - cpu
    stack_ms = (stack_cpu() - stack) / len(latencies) * 1000 if stack_cpu is not None else None
    done = len(latencies)
    return Run(done, done / elapsed, statistics.median(latencies) * 1000, cpu / done * 1000, cpu / elapsed, stack_ms)


def _runs(side: Side, workload: Workload) -> bool:
    return side.hops or not workload.hop


@dataclass(frozen=True, slots=True)
class Pace:
    """How long and how many turns a run may take."""

    turns: int
    """The cap of turns of a run at concurrency 16 and 64; a quarter at 1."""
    seconds: float = RUN_S
    rounds: int = ROUNDS
    drift_records: int = DRIFT_RECORDS


async def _measure(
    workloads: Sequence[Workload],
    sides: Sequence[Side],
    concurrency: int,
    pace: Pace,
    settle: Settle,
    stack_cpu: StackCpu | None = None,
) -> dict[Workload, Rows]:
    """`pace.rounds` rounds; in each every side runs every workload, sides in an order reversed every other
    round. After the first round a run's cap is 1.5 times what the side did in its previous run, so
    conversations are not opened (untimed, but not free) for turns the run will not reach."""
    cap = pace.turns if concurrency > 1 else pace.turns // 4
    runs: dict[Workload, dict[str, list[Run]]] = {w: {s.name: [] for s in sides if _runs(s, w)} for w in workloads}
    for r in range(pace.rounds):
        for side in sides if r % 2 == 0 else list(reversed(sides)):
            for workload in workloads:
                if not _runs(side, workload):
                    continue
                done = runs[workload][side.name]
                turns = min(cap, int(done[-1].turns * 1.5) + concurrency) if done else cap
                done.append(await _run(side.savers(), workload, concurrency, turns, pace.seconds, settle, stack_cpu))
    return runs


def _cell(runs: list[Run] | None) -> str:
    if not runs:
        return "–"
    tps = statistics.median(r.turns_per_s for r in runs)
    p50 = statistics.median(r.p50_ms for r in runs)
    cpu = statistics.median(r.cpu_ms for r in runs)
    busy = statistics.median(r.busy for r in runs)
    stacks = [r.stack_cpu_ms for r in runs if r.stack_cpu_ms is not None]
    stack = f", stack {statistics.median(stacks):.1f} ms" if stacks else ""
    return f"{tps:,.0f}/s, p50 {p50:.1f} ms, {cpu:.1f} ms CPU ({busy:.0%}){stack}"


def _ratio(sides: Sequence[Side], runs: Mapping[str, list[Run]]) -> str:
    """KafkaSaver's median turns/s over the stronger official form's; spread over per-round ratios."""
    ours = runs[next(s.name for s in sides if s.kind == "ours")]
    official = [runs[s.name] for s in sides if s.kind == "official"]
    medians = [statistics.median(r.turns_per_s for r in form) for form in official]
    stronger = max(range(len(official)), key=lambda i: medians[i])
    per_round = [mine.turns_per_s / max(form[i].turns_per_s for form in official) for i, mine in enumerate(ours)]
    name = [s.name for s in sides if s.kind == "official"][stronger].removeprefix("official, ")
    ratio = statistics.median(r.turns_per_s for r in ours) / medians[stronger]
    return f"{ratio:.2f}x vs {name} ({min(per_round):.2f}-{max(per_round):.2f})"


def _line(workload: Workload, concurrency: int, sides: Sequence[Side], runs: Mapping[str, list[Run]]) -> str:
    cells = " | ".join(_cell(runs.get(s.name)) for s in sides)
    return f"| {workload.name} | {concurrency} | {cells} | {_ratio(sides, runs)} |"


def sides_of(ours: Sequence[Any], official: Mapping[str, Sequence[Any]]) -> list[Side]:
    """The sides in table order; each of `ours` and `official`'s forms holds two savers."""
    return [
        Side("InMemorySaver", "limit", lambda: [InMemorySaver()], hops=False),
        *(Side(f"official, {form}", "official", lambda s=savers: s) for form, savers in official.items()),
        Side("KafkaSaver", "ours", lambda: ours),
    ]


async def run(fresh: RowStack, pace: Pace) -> list[str]:
    """The conversation rows as a Markdown table (header included); each row is printed as it completes,
    each measured on a fresh stack (`fresh`), its sides warmed up first.

    The last row repeats the first workload on a log that holds `pace.drift_records` records first.
    tansu (the dev stack's broker) serves a fetch by scanning its in-memory log, so a side whose turns
    fetch slows down as the log grows; a broker that indexes offsets does not. Earlier measurements on
    the 2-core machine: with 80,000 more records in the topic, tansu's CPU per KafkaSaver chat turn went
    from 4 to 20-24 ms and the turn's p50 from 15 to 43-49 ms.
    """
    sides: list[Side] = []
    lines: list[str] = []

    async def row(workloads: Sequence[Workload], concurrency: int, fill: int = 0) -> dict[Workload, Rows]:
        async with fresh() as (ours, official, settle, stack_cpu):
            sides[:] = sides_of(ours, official)
            if not lines:
                lines.extend(_header(sides))
                print("\n".join(lines), flush=True)
            for side in sides:
                await _run(side.savers(), CHAT, 4, WARM_UP_TURNS, pace.seconds, settle)
            if fill:
                await _run(ours, CHAT, 64, fill // RECORDS_PER_TURN, float("inf"), settle)
            return await _measure(workloads, sides, concurrency, pace, settle, stack_cpu)

    def add(workload: Workload, concurrency: int, runs: Rows) -> None:
        lines.append(_line(workload, concurrency, sides, runs))
        print(lines[-1], flush=True)

    for workload in (CHAT, WITH_STATE, FIRST):
        for concurrency in CONCURRENCY:
            add(workload, concurrency, (await row([workload], concurrency))[workload])
    runs = await row([HOP, NON_HOP], 1)
    for workload in (HOP, NON_HOP):
        add(workload, 1, runs[workload])
    again = drift(pace.drift_records)
    add(again, 1, (await row([again], 1, pace.drift_records))[again])
    return lines


def _header(sides: Sequence[Side]) -> list[str]:
    return [
        "| workload | concurrency | "
        + " | ".join(f"{s.name} (limit)" if s.kind == "limit" else s.name for s in sides)
        + " | ratio, KafkaSaver / stronger official (spread over rounds) |",
        "|---|---:|" + "---:|" * len(sides) + "---|",
    ]
