"""`make bench`: graphledger's KafkaSaver side by side with the official AsyncPostgresSaver, one run.

Both write to the same embedded Postgres (the official saver in its own schema). Printed: throughput
of raw `aput` and of whole graph invocations at concurrency 1, 16 and 64, with ratios; projector apply
rate; write-to-visible latency at a steady 500 checkpoints/s; the conversation rows (bench/conversations.py),
the cost of sealing events (on against off, alternating rounds), the store rows (bench/store.py) and the
replay rebuild rate (bench/rebuild.py). Numbers, not assertions: tests never time.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

from bench import conversations as conversation_bench
from bench import rebuild as rebuild_bench
from bench import store as store_bench
from bench.official import official_savers
from graphledger import KafkaSaver, KafkaStore
from graphledger.settings import DEFAULT_PARTITIONS
from graphledger_server.devstack.demo import build_graph
from graphledger_server.devstack.stack import DevStack
from graphledger_server.log.offsets import OffsetStatements, group_offsets

CONCURRENCY = (1, 16, 64)
SEALING_ROUNDS = 6


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


async def _applied(conn: asyncpg.Connection, stack: DevStack) -> int:
    settings = stack.settings
    applied = await group_offsets(conn, OffsetStatements(settings.postgres_schema), settings.projector_group_id)
    return sum(next_offset for (topic, _), next_offset in applied.items() if topic == settings.checkpoint_topic)


async def _projector_rate(stack: DevStack, saver: KafkaSaver, total: int) -> float:
    """Checkpoints applied per second by one projector catching up on a backlog of `total` puts."""
    conn = await asyncpg.connect(stack.settings.postgres_dsn)
    try:
        stack.kill_projector()
        await _run_puts(saver, 64, total)
        target = sum(saver.consistency_token.values()) + len(saver.consistency_token)
        before = await _applied(conn, stack)
        stack.start_projector()
        while await _applied(conn, stack) == before:
            await asyncio.sleep(0.01)
        start, first = time.perf_counter(), await _applied(conn, stack)
        while (now := await _applied(conn, stack)) < target:
            await asyncio.sleep(0.01)
        return (now - first) / (time.perf_counter() - start)
    finally:
        await conn.close()


async def _sealing(stack: DevStack, total: int, backlog: int) -> list[str]:
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
                    rates["apply"][side].append(await _projector_rate(stack, saver, backlog // 2))
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


async def _write_to_visible(stack: DevStack, saver: KafkaSaver, rate: int, seconds: float) -> list[float]:
    """Milliseconds from calling `aput` to its row being in Postgres, at a steady `rate` puts per second.

    A poller looks for the pending checkpoints every 2 ms, so a reading is at most 2 ms late.
    """
    started: dict[str, float] = {}
    latencies: list[float] = []
    conn = await asyncpg.connect(stack.settings.postgres_dsn)
    query = f"SELECT checkpoint_id FROM {stack.settings.postgres_schema}.checkpoints WHERE checkpoint_id = ANY($1)"

    async def poll(until: asyncio.Event) -> None:
        while started or not until.is_set():
            for row in await conn.fetch(query, list(started)):
                latencies.append((time.perf_counter() - started.pop(row["checkpoint_id"])) * 1000)
            await asyncio.sleep(0.002)

    async def one(i: int) -> None:
        config: dict[str, Any] = {"configurable": {"thread_id": str(uuid.uuid4()), "checkpoint_ns": ""}}
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"step": i}
        started[checkpoint["id"]] = time.perf_counter()
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


async def main(args: argparse.Namespace) -> None:
    # The topics get the production default of 12 partitions: tansu scans its in-memory log to serve a
    # fetch, so a partition holding every record of the run would slow it down as the run goes on.
    with DevStack(
        Path(tempfile.mkdtemp(prefix="graphledger-bench-")), partitions=DEFAULT_PARTITIONS, log_level="WARNING"
    ) as stack:
        settings = stack.settings
        dsn = settings.postgres_dsn
        print(f"graphledger bench — {args.total} ops per row, Postgres and broker embedded, 2 cores", flush=True)
        # First, on empty topics: a read of a thread fetches its partition's tail, and tansu's fetch time
        # grows with every record a partition holds (a real broker's does not).
        conversation_rows: list[str] = []
        if args.conversation_turns:
            print("conversations (reads consistent across processes; see README, Performance)", flush=True)
            async with KafkaSaver(settings) as first, KafkaSaver(settings) as second, official_savers(dsn) as official:
                conversation_rows = await conversation_bench.run([first, second], official, args.conversation_turns)
        async with (
            KafkaSaver(settings) as ours,
            AsyncPostgresSaver.from_conn_string(dsn) as official,
        ):
            await official.setup()
            rows = await _side_by_side("aput", _run_puts, ours, official, args.total)
            rows += await _side_by_side("graph.ainvoke", _run_graphs, ours, official, args.total // 8)
            rate = await _projector_rate(stack, ours, args.backlog)
            print(f"  projector apply    {rate:9.0f} checkpoints/s (backlog of {args.backlog})", flush=True)
            latencies = sorted(await _write_to_visible(stack, ours, 500, args.seconds))
            p50 = statistics.median(latencies)
            p99 = latencies[int(len(latencies) * 0.99) - 1]
            print(f"  write-to-visible   p50 {p50:6.1f} ms  p99 {p99:6.1f} ms at 500 checkpoints/s", flush=True)
        sealing_rows = await _sealing(stack, args.total, args.backlog) if args.sealing else []
        store_rows = await store_bench.run(stack, args.total, args.recall_items) if args.store else []
        rebuild_rows = await rebuild_bench.run(settings, args.rebuild_events) if args.rebuild_events else []

        print("\n| operation | concurrency | KafkaSaver ops/s | AsyncPostgresSaver ops/s | ratio |")
        print("|---|---:|---:|---:|---:|")
        for name, concurrency, mine, theirs in rows:
            print(f"| {name} | {concurrency} | {mine:,.0f} | {theirs:,.0f} | {mine / theirs:.2f}x |")
        print(f"| projector apply (backlog {args.backlog:,}) | – | {rate:,.0f} checkpoints/s | – | – |")
        print(f"| write-to-visible at 500/s | – | p50 {p50:.1f} ms, p99 {p99:.1f} ms | – | – |")
        print("\n".join(["", *conversation_rows, "", *sealing_rows, "", *store_rows, *rebuild_rows]))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--total", type=int, default=4000, help="aput calls per row (graph rows use total/8)")
    parser.add_argument("--backlog", type=int, default=20000, help="checkpoints for the projector rate")
    parser.add_argument("--seconds", type=float, default=10.0, help="duration of the write-to-visible run")
    parser.add_argument("--recall-items", type=int, default=20000, help="items for the HNSW recall@10 row")
    parser.add_argument("--no-store", dest="store", action="store_false", help="skip the store rows")
    parser.add_argument("--no-sealing", dest="sealing", action="store_false", help="skip the sealing rows")
    parser.add_argument(
        "--conversation-turns",
        type=int,
        default=800,
        help="turns per side per round of the conversation rows (concurrency 1: a quarter; 0 skips them)",
    )
    parser.add_argument(
        "--rebuild-events",
        type=int,
        default=rebuild_bench.DEFAULT_EVENTS,
        help="events for the replay rebuild row (env GRAPHLEDGER_BENCH_REBUILD_EVENTS; 0 skips it)",
    )
    asyncio.run(main(parser.parse_args()))
