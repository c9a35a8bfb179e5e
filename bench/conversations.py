"""Multi-turn conversations: each turn one `ainvoke` on the conversation's thread, as an agent serves a
chat, side by side with both forms of the official saver (`bench/official.py`).

Rows: chat turns at concurrency 1, 16 and 64 (each concurrent worker runs its own conversations);
the same with `aget_state` after each turn; and "hop" turns at concurrency 1, where consecutive
turns of a conversation run on two savers in turn, as when a load balancer sends each turn of a
thread to another pod (for KafkaSaver: the saver of a turn has not written the thread's previous
turn, so its first read waits for the projector; the official savers read Postgres either way).

Each row runs in rounds; every round runs all sides, in an order that alternates between rounds, so
the machine's drift falls on all of them. Printed: the median turns/s and p50 turn latency per side,
the ratio of KafkaSaver's median to the stronger official form's, and the spread of that ratio
over the rounds.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from operator import add
from typing import Annotated, Any, TypedDict

from langgraph.graph import START, StateGraph

ROUNDS = 3
TURNS = 10
"""Turns per conversation."""
MESSAGE = "x" * 200


class Chat(TypedDict):
    messages: Annotated[list[str], add]


def _reply(state: Chat) -> dict[str, Any]:
    return {"messages": [f"reply to {state['messages'][-1][:20]}" + MESSAGE]}


def chat_graph(saver: Any) -> Any:
    builder = StateGraph(Chat)
    builder.add_node("reply", _reply)
    builder.add_edge(START, "reply")
    return builder.compile(checkpointer=saver)


@dataclass(frozen=True, slots=True)
class Run:
    turns_per_s: float
    p50_ms: float


async def _converse(savers: Sequence[Any], concurrency: int, turns: int, *, get_state: bool) -> Run:
    """`turns` turns in all, by `concurrency` workers each running conversations of `TURNS` turns;
    turn `n` of a conversation runs on `savers[n % len(savers)]`."""
    graphs = [chat_graph(s) for s in savers]
    per_worker = max(TURNS, turns // concurrency)
    latencies: list[float] = []

    async def worker() -> None:
        for n in range(per_worker):
            if n % TURNS == 0:
                config = {"configurable": {"thread_id": str(uuid.uuid4())}}
            graph = graphs[n % len(graphs)]
            started = time.perf_counter()
            await graph.ainvoke({"messages": [f"message {n} " + MESSAGE]}, config)
            if get_state:
                await graph.aget_state(config)
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    return Run(len(latencies) / elapsed, statistics.median(latencies) * 1000)


async def _row(
    name: str, ours: Sequence[Any], official: dict[str, Sequence[Any]], concurrency: int, turns: int, *, get_state: bool
) -> str:
    sides = {"KafkaSaver": ours, **{f"official ({form})": savers for form, savers in official.items()}}
    runs: dict[str, list[Run]] = {side: [] for side in sides}
    for r in range(ROUNDS):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        for side in order:
            runs[side].append(await _converse(sides[side], concurrency, turns, get_state=get_state))
    medians = {side: statistics.median(r.turns_per_s for r in rs) for side, rs in runs.items()}
    p50s = {side: statistics.median(r.p50_ms for r in rs) for side, rs in runs.items()}
    stronger = max((s for s in sides if s != "KafkaSaver"), key=lambda s: medians[s])
    ratios = sorted(
        mine.turns_per_s / theirs.turns_per_s for mine, theirs in zip(runs["KafkaSaver"], runs[stronger], strict=True)
    )
    line = (
        f"| {name} | {concurrency} | {medians['KafkaSaver']:,.0f}/s, p50 {p50s['KafkaSaver']:.1f} ms | "
        + " | ".join(f"{medians[s]:,.0f}/s, p50 {p50s[s]:.1f} ms" for s in sides if s != "KafkaSaver")
        + f" | {medians['KafkaSaver'] / medians[stronger]:.2f}x ({stronger.removeprefix('official ')}; "
        f"{ratios[0]:.2f}-{ratios[-1]:.2f}) |"
    )
    print(line, flush=True)
    return line


async def run(ours: Sequence[Any], official: dict[str, Sequence[Any]], turns: int) -> list[str]:
    """The conversation rows as Markdown table rows. `ours` and each `official` form hold two savers:
    the first serves ordinary turns, both serve hop turns."""
    forms = list(official)
    header = (
        "| workload | concurrency | KafkaSaver | "
        + " | ".join(f"AsyncPostgresSaver ({form})" for form in forms)
        + " | ratio (stronger official; spread over rounds) |"
    )
    lines = [header, "|---|---:|---:|" + "---:|" * len(forms) + "---|"]
    print("\n".join(lines), flush=True)
    first = {form: savers[:1] for form, savers in official.items()}
    for concurrency in (1, 16, 64):
        n = turns if concurrency > 1 else turns // 4
        lines.append(await _row("chat turn", ours[:1], first, concurrency, n, get_state=False))
    for concurrency in (1, 16, 64):
        n = turns if concurrency > 1 else turns // 4
        lines.append(await _row("chat turn + aget_state", ours[:1], first, concurrency, n, get_state=True))
    lines.append(await _row("hop turn", ours, official, 1, turns // 4, get_state=False))
    lines.append(await _row("non-hop turn (same run)", ours[:1], first, 1, turns // 4, get_state=False))
    return lines
