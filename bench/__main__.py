"""`make bench`: graphledger beside the official `langgraph-checkpoint-postgres` savers, one run.

Both write to the same embedded Postgres (the official saver in its own schema). The bench process is
the agent and runs on a core of its own, the stack on the others (`bench/placement.py`). Sections, in
the order they run (`--only` picks some):
- conversations: chat turns, turn + `aget_state`, first turns of new threads, hop turns
  (`bench/conversations.py`), beside both official forms and `InMemorySaver`;
- pods: a thread's turns spread over 4 agent processes, each with its own saver (`bench/pods.py`), on a
  stack of its own;
- checkpoints: raw `aput` and whole graph invocations at concurrency 1, 16 and 64, with ratios, and the
  projector's apply rate on a backlog against its limit (`bench/apply_limit.py`);
- write-to-visible: latency of a new thread's write at a steady 500 writes/s;
- sealing: its cost, on against off in alternating rounds; ownership: the one-writer rule's
  (`GRAPHLEDGER_WRITE_OWNERSHIP` `refuse` against `record`), likewise; store: `bench/store.py`; rebuild:
  `bench/rebuild.py`.
Printed at the end: the command that reproduces the run, the machine's facts, and Markdown tables.
Numbers, not assertions: tests never time.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import platform
import shlex
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

from bench import apply_limit
from bench import conversations as conversation_bench
from bench import pods as pods_bench
from bench import rebuild as rebuild_bench
from bench import store as store_bench
from bench.conversations import StackCpu
from bench.official import official_savers
from bench.placement import Placement, cpu_seconds
from bench.settle import Settle
from graphledger import KafkaSaver, KafkaStore
from graphledger.settings import DEFAULT_PARTITIONS, Settings
from graphledger_server.devstack.demo import build_graph
from graphledger_server.devstack.stack import DevStack
from graphledger_server.log.offsets import OffsetStatements, group_offsets

CONCURRENCY = (1, 16, 64)
SEALING_ROUNDS = 6
SEALING_BACKLOG = 10_000
"""Checkpoints of each sealing round's projector backlog (two rounds a side), at most: fewer than the projector
apply row's, so the rounds stay short."""
OWNERSHIP_ROUNDS = 6
LABELS = {"aput": "`aput`", "graph.ainvoke": "`graph.ainvoke`, a new thread each"}
SECTIONS = ("conversations", "pods", "checkpoints", "write-to-visible", "sealing", "ownership", "store", "rebuild")


def _message_history(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"message {j} of step {i}: " + "x" * 200} for j in range(4)]


async def _run_puts(saver: Any, concurrency: int, total: int) -> float:
    """Checkpoints per second of `aput`, `concurrency` threads each writing a parent chain."""
    per_worker = max(1, total // concurrency)

    async def worker() -> None:
        config: dict[str, Any] = {"configurable": {"thread_id": str(uuid.uuid4()), "checkpoint_ns": ""}}
        for i in range(per_worker):
            checkpoint = empty_checkpoint()
            version = saver.get_next_version(None if i == 0 else str(i), None)
            checkpoint["channel_values"] = {"messages": _message_history(i), "step": i}
            checkpoint["channel_versions"] = {"messages": version, "step": version}
            config = await saver.aput(config, checkpoint, {"source": "loop", "step": i}, {"messages": version})

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return per_worker * concurrency / (time.perf_counter() - start)


async def _run_graphs(saver: Any, concurrency: int, total: int) -> float:
    """Graph invocations per second of the seed graph (4 checkpoints and 3 write sets each)."""
    graph = build_graph().compile(checkpointer=saver)
    per_worker = max(1, total // concurrency)

    async def worker() -> None:
        for _ in range(per_worker):
            await graph.ainvoke({"foo": ""}, {"configurable": {"thread_id": str(uuid.uuid4())}})

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return per_worker * concurrency / (time.perf_counter() - start)


async def _side_by_side(
    name: str, run: Callable[[Any, int, int], Awaitable[float]], ours: Any, official: Any, total: int
) -> list[tuple[str, int, float, float]]:
    rows = []
    for concurrency in CONCURRENCY:
        n = total if concurrency > 1 else total // 4
        theirs = await run(official, concurrency, n)
        mine = await run(ours, concurrency, n)
        rows.append((name, concurrency, mine, theirs))
        print(
            f"  {name:<18} c={concurrency:<3} KafkaSaver {mine:9.0f}/s  AsyncPostgresSaver {theirs:9.0f}/s  "
            f"ratio {mine / theirs:5.2f}x",
            flush=True,
        )
    return rows


class _RowStacks:
    """A fresh stack per conversation row (`bench/conversations.py` says why), placed as the bench's own is,
    with the savers of every side on it."""

    def __init__(self, work_dir: Path, placement: Placement, base: Settings) -> None:
        self._work_dir = work_dir
        self._placement = placement
        self._base = base
        self._rows = 0
        self.timeouts = 0
        """Projector waits that ran out, over all rows."""
        self.placement = ""
        """Where the last row's processes ran, read back from the kernel."""

    @asynccontextmanager
    async def __call__(self) -> AsyncIterator[tuple[list[KafkaSaver], dict[str, list[Any]], Settle, StackCpu]]:
        self._rows += 1
        placement = self._placement
        placement.to_stack()  # the row stack's processes inherit the stack's cores
        data_dir = self._work_dir / f"row-{self._rows}"
        stack = DevStack(data_dir, partitions=DEFAULT_PARTITIONS, base=self._base, log_level="WARNING")
        try:
            await asyncio.to_thread(stack.start)
            placement.to_agent()
            placement.pin(stack.pids().values())
            settings = stack.settings
            async with (
                KafkaSaver(settings) as first,
                KafkaSaver(settings) as second,
                official_savers(settings.postgres_dsn) as official,
                Settle(settings) as settle,
            ):
                placement.pin(stack.pids().values())  # the savers' new Postgres backends (the postmaster's children)
                self.placement = placement.describe(stack.pids())
                try:
                    yield [first, second], official, settle, lambda: cpu_seconds(stack.pids().values())
                finally:
                    self.timeouts += settle.timeouts
        finally:
            placement.to_agent()
            await asyncio.to_thread(stack.stop)
        shutil.rmtree(data_dir, ignore_errors=True)  # kept when the row failed, for its logs


async def _applied(conn: asyncpg.Connection, stack: DevStack) -> int:
    settings = stack.settings
    applied = await group_offsets(conn, OffsetStatements(settings.postgres_schema), settings.projector_group_id)
    return sum(next_offset for (topic, _), next_offset in applied.items() if topic == settings.checkpoint_topic)


async def _projector_rate(stack: DevStack, placement: Placement, saver: KafkaSaver, total: int) -> float:
    """Checkpoints applied per second by one projector catching up on a backlog of `total` puts."""
    conn = await asyncpg.connect(stack.settings.postgres_dsn)
    try:
        stack.kill_projector()
        await _run_puts(saver, 64, total)
        target = sum(saver.consistency_token.values()) + len(saver.consistency_token)
        before = await _applied(conn, stack)
        with placement.spawning():
            stack.start_projector()
        while await _applied(conn, stack) == before:
            await asyncio.sleep(0.01)
        start, first = time.perf_counter(), await _applied(conn, stack)
        while (now := await _applied(conn, stack)) < target:
            await asyncio.sleep(0.01)
        return (now - first) / (time.perf_counter() - start)
    finally:
        await conn.close()


def _of_limit(rate: float, limit: float) -> str:
    return f"{rate / limit:.2f}x its limit" if limit else "its limit not measured (no checkpoint rows)"


async def _sealing(stack: DevStack, placement: Placement, total: int, backlog: int) -> list[str]:
    """What sealing costs: `aput` and store `aput` at concurrency 64 and the projector's apply rate, with
    `encrypt_events` on and off on the same stack, in alternating rounds (the machine is noisy)."""
    sealed = stack.settings
    clear = sealed.model_copy(update={"encrypt_events": False})
    dims = sealed.store_vector_dims or 0
    rates: dict[str, dict[str, list[float]]] = {row: {"on": [], "off": []} for row in ("aput", "store", "apply")}
    async with (
        KafkaSaver(sealed) as sealed_saver,
        KafkaSaver(clear) as clear_saver,
        KafkaStore(sealed, index=store_bench.index_config(dims)) as sealed_store,
        KafkaStore(clear, index=store_bench.index_config(dims)) as clear_store,
    ):
        sides = {"on": (sealed_saver, sealed_store), "off": (clear_saver, clear_store)}
        for r in range(SEALING_ROUNDS):
            for side in ("on", "off") if r % 2 == 0 else ("off", "on"):
                saver, store = sides[side]
                rates["aput"][side].append(await _run_puts(saver, 64, total))
                rates["store"][side].append(await store_bench.puts(store, f"sealing-{side}-{r}", 64, total // 4))
                if r < 2:  # each apply row is a backlog: two rounds of it
                    rates["apply"][side].append(await _projector_rate(stack, placement, saver, backlog))
    lines = [
        "| sealing (docs/security.md) | concurrency | sealed | clear | ratio (median; spread over rounds) |",
        "|---|---:|---:|---:|---|",
    ]
    for row, label, concurrency in (
        ("aput", "aput", "64"),
        ("store", "store aput", "64"),
        ("apply", "projector apply", "–"),
    ):
        on, off = rates[row]["on"], rates[row]["off"]
        ratios = [a / b for a, b in zip(on, off, strict=True) if a and b]  # 0: a backlog applied in one batch
        spread = f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})" if ratios else "–"
        lines.append(
            f"| {label} | {concurrency} | {statistics.median(on):,.0f}/s | {statistics.median(off):,.0f}/s | {spread} |"
        )
    for line in lines:
        print(line, flush=True)
    return lines


async def _run_turns(saver: Any, concurrency: int, total: int) -> float:
    """Chat turns per second (`conversations.chat_graph`), each worker continuing its own conversation of
    `conversations.TURNS` turns, then a new one: every turn reads its thread, then writes on it."""
    graph = conversation_bench.chat_graph(saver)
    per_worker = max(1, total // concurrency)

    async def worker() -> None:
        config: dict[str, Any] = {}
        for n in range(per_worker):
            if n % conversation_bench.TURNS == 0:
                config = {"configurable": {"thread_id": str(uuid.uuid4())}}
            await graph.ainvoke(conversation_bench.message(n), config)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return per_worker * concurrency / (time.perf_counter() - start)


async def _ownership(stack: DevStack, total: int) -> list[str]:
    """What the one-writer rule costs a writer: chat turns and new threads' graph runs with
    `write_ownership` `refuse` (intents sent, each write's verdict learned) and `record` (today's writes
    without them), on the same stack.

    The sides take turns, `record` first and last, each run after the projector caught up: so every run
    follows a run of the other saver (the two share this process, and a run starts from what the other's
    left: the log it wrote, which the saver's next proofs of new threads read on through), and each `refuse`
    run is compared with the geometric mean of the two `record` runs around it, which cancels a drift as
    the log grows. Taking turns in pairs (ABBA) instead gave every side's first run of a pair the log as
    its own last run left it: new threads' graph runs measured 1.0-1.4x first in a pair, 0.7x second."""
    settings = stack.settings
    cells = (("turns", 1), ("turns", 64), ("graphs", 64))
    rates: dict[tuple[str, int], dict[str, list[float]]] = {cell: {"on": [], "off": []} for cell in cells}
    cpu: dict[tuple[str, int], dict[str, list[float]]] = {cell: {"on": [], "off": []} for cell in cells}
    runs = {"turns": _run_turns, "graphs": _run_graphs}
    async with (
        KafkaSaver(settings.model_copy(update={"write_ownership": "refuse"})) as refusing,
        KafkaSaver(settings.model_copy(update={"write_ownership": "record"})) as recording,
        Settle(settings) as settle,
    ):
        sides = {"on": refusing, "off": recording}
        for side in ("off", *(s for _ in range(OWNERSHIP_ROUNDS) for s in ("on", "off"))):
            for row, concurrency in cells:
                n = total // 8 if concurrency > 1 else total // 32
                await settle()
                started = time.process_time()
                rates[(row, concurrency)][side].append(await runs[row](sides[side], concurrency, n))
                done = max(1, n // concurrency) * concurrency
                cpu[(row, concurrency)][side].append((time.process_time() - started) / done * 1000)
        verdicts = dict(refusing._runtime.verdicts)  # the bench reads the client's own count
    lines = [
        "| one writer (docs/architecture.md) | concurrency | refuse | record | ratio (median; spread over rounds) "
        "| agent CPU per run, refuse / record |",
        "|---|---:|---:|---:|---|---|",
    ]
    labels = {"turns": "chat turn, a conversation's next", "graphs": "`graph.ainvoke`, a new thread each"}
    for row, concurrency in cells:
        on, off = rates[(row, concurrency)]["on"], rates[(row, concurrency)]["off"]
        ratios = [a / math.sqrt(before * after) for a, before, after in zip(on, off, off[1:], strict=False)]
        spread = f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"
        cpu_on, cpu_off = (statistics.median(cpu[(row, concurrency)][side]) for side in ("on", "off"))
        lines.append(
            f"| {labels[row]} | {concurrency} | {statistics.median(on):,.0f}/s | {statistics.median(off):,.0f}/s "
            f"| {spread} | {cpu_on:.2f} / {cpu_off:.2f} ms |"
        )
    lines.append(f"\n{OWNERSHIP_ROUNDS} rounds; the `refuse` side's verdicts (one writer a thread): {verdicts}")
    for line in lines:
        print(line, flush=True)
    return lines


async def _write_to_visible(stack: DevStack, saver: KafkaSaver, rate: int, seconds: float) -> list[float]:
    """Milliseconds from calling `aput` to its row being in Postgres, at a steady `rate` puts per second.

    A poller looks for the pending checkpoints every 2 ms, so a reading is at most 2 ms late. Each put is
    of a new thread and the poll probes the primary key by thread id, never scanning the table (the
    table grows faster than its statistics, so the planner would): a poll that scanned took a quarter
    of the stack's core at 500/s and grew with the table.
    """
    started: dict[str, float] = {}
    latencies: list[float] = []
    conn = await asyncpg.connect(stack.settings.postgres_dsn, server_settings={"enable_seqscan": "off"})
    query = f"SELECT thread_id FROM {stack.settings.postgres_schema}.checkpoints WHERE thread_id = ANY($1::text[])"

    async def poll(until: asyncio.Event) -> None:
        while started or not until.is_set():
            for row in await conn.fetch(query, list(started)):
                latencies.append((time.perf_counter() - started.pop(row["thread_id"])) * 1000)
            await asyncio.sleep(0.002)

    async def one(i: int) -> None:
        thread_id = str(uuid.uuid4())
        config: dict[str, Any] = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"step": i}
        started[thread_id] = time.perf_counter()
        await saver.aput(config, checkpoint, {"step": i}, {})

    done = asyncio.Event()
    poller = asyncio.create_task(poll(done))
    tasks = []
    start = time.perf_counter()
    for i in range(int(rate * seconds)):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i)))
    await asyncio.gather(*tasks)
    done.set()
    await poller
    await conn.close()
    return latencies


def _command(argv: list[str]) -> str:
    return " ".join(["python -m bench", *map(shlex.quote, argv)])


def _machine(where: str) -> str:
    """The CPU, where the bench's processes ran (`Placement.describe`), and the load."""
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if "model name" in line
        ),
        platform.machine(),
    )
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return f"{model}, {where}; load average {load} (1, 5, 15 min)"


def _sections(args: argparse.Namespace) -> set[str]:
    chosen = {name for given in args.only or SECTIONS for name in given.split(",")}
    unknown = chosen - set(SECTIONS)
    if unknown:
        raise SystemExit(f"--only {', '.join(sorted(unknown))}: not a section; the sections are {', '.join(SECTIONS)}")
    off = {
        "store": not args.store,
        "sealing": not args.sealing,
        "conversations": not args.conversation_turns,
        "rebuild": not args.rebuild_events,
    }
    return {s for s in chosen if not off.get(s)}


async def main(args: argparse.Namespace) -> None:
    sections = _sections(args)
    placement = Placement.plan()
    # The stack's data and logs stay in `work_dir` when the bench fails, and are deleted when it ends
    # (hundreds of MB of Postgres data a run).
    work_dir = Path(tempfile.mkdtemp(prefix="graphledger-bench-"))
    try:
        await _run(args, sections, placement, work_dir)
    except BaseException:
        print(f"the stack's logs and data are in {work_dir}", file=sys.stderr)
        raise
    shutil.rmtree(work_dir, ignore_errors=True)


async def _run(args: argparse.Namespace, sections: set[str], placement: Placement, work_dir: Path) -> None:
    # The topics get the production default of 12 partitions: tansu scans its in-memory log to serve a
    # fetch, so a partition holding every record of the run would slow it down as the run goes on.
    base = Settings(store_vector_dims=store_bench.DIMS)
    print(f"graphledger bench: {', '.join(s for s in SECTIONS if s in sections)}", flush=True)
    conversation_rows: list[str] = []
    conversation_facts = ""
    where = ""
    if "conversations" in sections:
        pace = conversation_bench.Pace(args.conversation_turns, args.run_seconds, args.rounds, args.drift_records)
        print(f"conversations: {pace.rounds} rounds; a run: {pace.seconds:g} s or {pace.turns} turns", flush=True)
        started = time.perf_counter()
        fresh = _RowStacks(work_dir, placement, base)
        conversation_rows = await conversation_bench.run(fresh, pace)
        minutes = (time.perf_counter() - started) / 60
        print(f"  conversation rows took {minutes:.1f} min; projector waits that ran out: {fresh.timeouts}")
        where = fresh.placement
        conversation_facts = (
            f"Conversations ({minutes:.1f} min): each row on a fresh stack; medians of {args.rounds} rounds, "
            "sides alternating; each cell is turns/s, p50 turn latency, the agent process's CPU per turn (in "
            "brackets: its CPU over the run's wall time, how busy its core was) and the stack's (all its "
            "processes, on the stack's cores)"
        )
    pods_rows: list[str] = []
    if "pods" in sections:
        pods_rows, where = await pods_bench.run(
            lambda: pods_bench.fresh_stack(work_dir, placement, base),
            placement,
            args.pods_rounds,
            run_s=max(args.run_seconds, 1.0),
        )
    operation_rows: list[str] = []
    sealing_rows: list[str] = []
    if sections - {"conversations", "pods"}:
        placement.to_stack()  # the stack's processes inherit the stack's cores
        with DevStack(work_dir / "stack", partitions=DEFAULT_PARTITIONS, base=base, log_level="WARNING") as stack:
            placement.to_agent()
            placement.pin(stack.pids().values())
            where = placement.describe(stack.pids())
            operation_rows, sealing_rows = await _operations(args, sections, placement, stack)

    print(f"\nReproduce: `{_command(sys.argv[1:])}` (from the repository's root, after `make install`)")
    print(f"Machine: {_machine(where)}")
    if conversation_rows:
        print(f"{conversation_facts}\n")
        print("\n".join(conversation_rows))
    if pods_rows:
        print("\n" + "\n".join(pods_rows))
    if operation_rows:
        print("\n| operation | concurrency | graphledger | official | ratio |")
        print("|---|---:|---:|---:|---:|")
        print("\n".join(operation_rows))
    if sealing_rows:
        print("\n" + "\n".join(sealing_rows))


async def _operations(
    args: argparse.Namespace, sections: set[str], placement: Placement, stack: DevStack
) -> tuple[list[str], list[str]]:
    """The sections other than conversations, on one stack: write-to-visible first, on an empty log."""
    settings = stack.settings
    rows: list[tuple[str, int, float, float]] = []
    rate: float | None = None
    limit = 0.0
    visible: tuple[float, float] | None = None
    if {"checkpoints", "write-to-visible"} & sections:
        async with KafkaSaver(settings) as ours:
            if "write-to-visible" in sections:
                latencies = sorted(await _write_to_visible(stack, ours, 500, args.seconds))
                visible = statistics.median(latencies), latencies[int(len(latencies) * 0.99) - 1]
                print(
                    f"  write-to-visible   p50 {visible[0]:6.1f} ms  p99 {visible[1]:6.1f} ms at 500 checkpoints/s",
                    flush=True,
                )
            if "checkpoints" in sections:
                async with AsyncPostgresSaver.from_conn_string(settings.postgres_dsn) as official:
                    await official.setup()
                    rows = await _side_by_side("aput", _run_puts, ours, official, args.total)
                    rows += await _side_by_side("graph.ainvoke", _run_graphs, ours, official, args.total // 8)
                since = await apply_limit.mark(settings.postgres_dsn)
                rate = await _projector_rate(stack, placement, ours, args.backlog)
                placement.to_stack()  # the limit's loader where the projector ran, beside Postgres
                try:
                    copied, seconds = await apply_limit.staging_merge(settings, since)
                finally:
                    placement.to_agent()
                limit = copied / seconds
                print(f"  projector apply    {rate:9.0f} checkpoints/s (backlog of {args.backlog}): "
                      f"{_of_limit(rate, limit)}, COPY into staging + one merge per table {limit:.0f}/s",
                      flush=True)  # fmt: skip
    sealing_backlog = min(args.backlog, SEALING_BACKLOG)
    sealing_rows = await _sealing(stack, placement, args.total, sealing_backlog) if "sealing" in sections else []
    if "ownership" in sections:
        sealing_rows += ["", *await _ownership(stack, args.total)]
    store_rows = await store_bench.run(stack, args.total, args.recall_items) if "store" in sections else []
    rebuild_rows = await rebuild_bench.run(settings, args.rebuild_events) if "rebuild" in sections else []
    checkpoint_rows = [
        f"| {LABELS[name]} (KafkaSaver vs AsyncPostgresSaver) | {concurrency} | {mine:,.0f}/s | {theirs:,.0f}/s "
        f"| {mine / theirs:.2f}x |"
        for name, concurrency, mine, theirs in rows
    ]
    if rate is not None:
        applied = f"{rate:,.0f} checkpoints/s ({_of_limit(rate, limit)}, {limit:,.0f}/s)"
        checkpoint_rows.append(f"| projector apply (backlog {args.backlog:,}) | – | {applied} | – | – |")
    if visible is not None:
        p50, p99 = visible
        checkpoint_rows.append(
            f"| write-to-visible at 500/s, a new thread each | – | p50 {p50:.1f} ms, p99 {p99:.1f} ms | – | – |"
        )
    return [*checkpoint_rows, *store_rows, *rebuild_rows], sealing_rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--only",
        action="append",
        metavar="SECTION",
        help=f"run only this section (repeatable, or comma-separated): {', '.join(SECTIONS)}; "
        "`--only conversations` takes about 7 minutes on 2 cores",
    )
    parser.add_argument("--total", type=int, default=4000, help="aput calls per row (graph rows use total/8)")
    parser.add_argument("--backlog", type=int, default=100_000, help="checkpoints for the projector rate")
    parser.add_argument("--seconds", type=float, default=10.0, help="duration of the write-to-visible run")
    parser.add_argument("--recall-items", type=int, default=20000, help="items for the HNSW recall@10 row")
    parser.add_argument("--no-store", dest="store", action="store_false", help="skip the store rows")
    parser.add_argument("--no-sealing", dest="sealing", action="store_false", help="skip the sealing rows")
    parser.add_argument("--pods-rounds", type=int, default=pods_bench.ROUNDS, help="rounds of the pods rows")
    parser.add_argument(
        "--conversation-turns",
        type=int,
        default=600,
        help="cap of timed turns of a conversation run (concurrency 1: a quarter; 0 skips the conversation rows)",
    )
    parser.add_argument(
        "--run-seconds",
        type=float,
        default=conversation_bench.RUN_S,
        help="seconds a conversation run starts turns for (it stops earlier at its cap of turns)",
    )
    parser.add_argument(
        "--rounds", type=int, default=conversation_bench.ROUNDS, help="rounds of every conversation row"
    )
    parser.add_argument(
        "--drift-records",
        type=int,
        default=conversation_bench.DRIFT_RECORDS,
        help="records written to the log before the drift row's turns",
    )
    parser.add_argument(
        "--rebuild-events",
        type=int,
        default=rebuild_bench.DEFAULT_EVENTS,
        help="events for the replay rebuild row (env GRAPHLEDGER_BENCH_REBUILD_EVENTS; 0 skips it)",
    )
    asyncio.run(main(parser.parse_args()))
