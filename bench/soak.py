"""Soak: mixed graph and store traffic at a steady rate with a projector SIGKILL every minute.

`python -m bench.soak` (or `make soak`) runs the embedded stack for `--minutes` (10 by default):
agents invoke the seed graph through `KafkaSaver` and put memories through `KafkaStore` at fixed
rates (open loop: a tick that finds every agent busy is counted as missed, not queued), while the
projector is killed with SIGKILL and restarted every `--kill-every` seconds. It reports

- backlog: events acknowledged by Kafka but not yet projected, sampled every second (p50, p99, max);
- freshness: from a write's acknowledgement to its partition's offset being applied in Postgres,
  probed every 200 ms (p50, p99, max);
- resident memory of each process at the start and at the end;
- the check at the end, once the projection caught up: every acknowledged checkpoint and pending
  write is a row (primary keys make a duplicate impossible to store twice, so rows = acknowledged
  means nothing lost and nothing applied twice), and every store key holds the last value written.
It exits non-zero when the check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import psutil
from langgraph.checkpoint.base import WRITES_IDX_MAP

from graphledger import KafkaSaver, KafkaStore
from graphledger.errors import GraphledgerError
from graphledger.settings import Settings
from graphledger_server.devstack.demo import build_graph
from graphledger_server.devstack.stack import DevStack
from graphledger_server.log.offsets import OffsetStatements, group_offsets

PROBE_INTERVAL_S = 0.2
SAMPLE_INTERVAL_S = 1.0
POLL_INTERVAL_S = 0.02
CATCH_UP_TIMEOUT_S = 180.0
STORE_KEYS_PER_AGENT = 50
RETRIES = 10

Token = dict[tuple[str, int], int]


class CountingSaver(KafkaSaver):
    """`KafkaSaver` that remembers the primary key of every acknowledged checkpoint and write."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.checkpoints: set[tuple[str, str, str]] = set()
        self.writes: set[tuple[str, str, str, str, int]] = set()

    async def aput(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        result = await super().aput(config, checkpoint, metadata, new_versions)
        conf = config["configurable"]
        self.checkpoints.add((conf["thread_id"], conf.get("checkpoint_ns", ""), checkpoint["id"]))
        return result

    async def aput_writes(
        self, config: Any, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        await super().aput_writes(config, writes, task_id, task_path)
        conf = config["configurable"]
        for i, (channel, _) in enumerate(writes):
            idx = WRITES_IDX_MAP.get(channel, i)
            self.writes.add((conf["thread_id"], conf.get("checkpoint_ns", ""), conf["checkpoint_id"], task_id, idx))


@dataclass
class Traffic:
    """What the agents did, for the report and the final check."""

    invocations: int = 0
    puts: int = 0
    missed_ticks: int = 0
    retried: int = 0
    """Invocations whose first read got a retryable error (the projector restarting) and were run again."""
    errors: list[str] = field(default_factory=list)
    last_values: dict[tuple[tuple[str, ...], str], int] = field(default_factory=dict)


async def _steady(
    rate: float, agents: int, until: float, traffic: Traffic, one: Callable[[int], Awaitable[None]]
) -> None:
    """Start `one(n)` `rate` times a second on at most `agents` concurrent tasks until `until`."""
    busy = asyncio.Semaphore(agents)
    tasks: set[asyncio.Task[None]] = set()
    n = 0
    start = time.monotonic()
    while (now := time.monotonic()) < until:
        await asyncio.sleep(max(0.0, start + n / rate - now))
        if busy.locked():
            traffic.missed_ticks += 1
        else:
            await busy.acquire()

            async def run(i: int) -> None:
                try:
                    await one(i)
                except Exception as exc:  # reported, and the check at the end fails on them
                    traffic.errors.append(f"{type(exc).__name__}: {exc}")
                finally:
                    busy.release()

            task = asyncio.create_task(run(n))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        n += 1
    await asyncio.gather(*tasks)


def _merged(*tokens: Token) -> Token:
    out: Token = {}
    for token in tokens:
        for key, offset in token.items():
            out[key] = max(out.get(key, -1), offset)
    return out


class Progress:
    """The projection's applied offsets, polled from Postgres, against the clients' acknowledged ones."""

    def __init__(self, conn: asyncpg.Connection, schema: str, group: str) -> None:
        self.conn, self.sql, self.group = conn, OffsetStatements(schema), group
        self.applied: dict[tuple[str, int], int] = {}

    async def poll(self) -> None:
        self.applied = await group_offsets(self.conn, self.sql, self.group)

    def reached(self, token: Token) -> bool:
        return all(self.applied.get(key, 0) > offset for key, offset in token.items())

    def backlog(self, token: Token) -> int:
        return sum(max(0, offset + 1 - self.applied.get(key, 0)) for key, offset in token.items())


def _memory(stack: DevStack) -> dict[str, float]:
    """Resident MiB of this process (the agents) and of each process of the stack."""
    out = {"agents (client)": psutil.Process().memory_info().rss / 2**20}
    for name, pid in stack.pids().items():
        try:
            process = psutil.Process(pid)
            family = [process, *process.children(recursive=True)] if name == "postgres" else [process]
            out[name] = sum(p.memory_info().rss for p in family if p.is_running()) / 2**20
        except psutil.Error:
            continue
    return out


def _percentiles(values: list[float]) -> str:
    if not values:
        return "none"
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"p50 {statistics.median(ordered):,.1f}, p99 {p99:,.1f}, max {ordered[-1]:,.1f}"


async def soak(stack: DevStack, args: argparse.Namespace) -> int:
    settings = stack.settings
    graph_agents = store_agents = args.agents
    traffic = Traffic()
    run_id = uuid.uuid4().hex[:6]
    conn = await asyncpg.connect(settings.postgres_dsn)
    progress = Progress(conn, settings.postgres_schema, settings.projector_group_id)
    freshness_ms: list[float] = []
    backlog: list[float] = []
    kills = 0
    async with CountingSaver(settings) as saver, KafkaStore(settings) as store:
        graph = build_graph().compile(checkpointer=saver)

        async def invoke(n: int) -> None:
            thread = f"soak-{run_id}-{n % args.threads}"
            for attempt in range(RETRIES + 1):
                try:
                    await graph.ainvoke({"foo": "", "bar": []}, {"configurable": {"thread_id": thread}})
                    break
                except GraphledgerError as exc:
                    # A run starts by reading its thread; while the projector restarts after a kill
                    # that read waits for the thread's last writes and ends in a retryable 503. An
                    # agent retries the step, as here; nothing of the run was written yet.
                    if not exc.retryable or attempt == RETRIES:
                        raise
                    traffic.retried += 1
            traffic.invocations += 1

        async def put(n: int) -> None:
            namespace, key = ("soak", run_id, f"agent{n % store_agents}"), f"k{n % STORE_KEYS_PER_AGENT}"
            # One agent's puts to one key are sequential (n steps by store_agents), so the last wins.
            await store.aput(namespace, key, {"n": n, "text": f"memory {n}"})
            traffic.puts += 1
            if traffic.last_values.get((namespace, key), -1) < n:
                traffic.last_values[(namespace, key)] = n

        def token() -> Token:
            return _merged(saver.consistency_token, store.consistency_token)

        await invoke(0)  # warm up both paths before the first memory reading
        await put(0)
        memory_start = _memory(stack)
        started = time.monotonic()
        until = started + args.minutes * 60
        print(
            f"soak: {args.minutes} min, {args.graph_rate}/s graph invocations, {args.store_rate}/s store puts, "
            f"projector SIGKILL every {args.kill_every:.0f} s",
            flush=True,
        )

        async def killer() -> None:
            nonlocal kills
            next_kill = started + args.kill_every
            while next_kill < until:
                await asyncio.sleep(next_kill - time.monotonic())
                # On the main thread (a moment's block): DevStack arms a child's parent-death signal
                # only there, so an interrupted soak leaves no projector behind.
                stack.kill_projector()
                stack.start_projector(wait=False)
                kills += 1
                next_kill += args.kill_every

        async def observer(stop: asyncio.Event) -> None:
            probes: list[tuple[float, Token]] = []
            last_probe = last_sample = 0.0
            while not stop.is_set() or probes:
                await progress.poll()
                now = time.monotonic()
                if not stop.is_set() and now - last_probe >= PROBE_INTERVAL_S:
                    probes.append((now, token()))
                    last_probe = now
                if now - last_sample >= SAMPLE_INTERVAL_S:
                    backlog.append(progress.backlog(token()))
                    last_sample = now
                    elapsed = now - started
                    if int(elapsed) % 30 == 0:
                        print(
                            f"  {elapsed:5.0f} s: {traffic.invocations} invocations, {traffic.puts} puts, "
                            f"backlog {backlog[-1]:,.0f} events, {kills} kills",
                            flush=True,
                        )
                still = []
                for at, wanted in probes:
                    if progress.reached(wanted):
                        freshness_ms.append((now - at) * 1000)
                    else:
                        still.append((at, wanted))
                probes = still
                if stop.is_set() and now - until > CATCH_UP_TIMEOUT_S:
                    break
                await asyncio.sleep(POLL_INTERVAL_S)

        stop = asyncio.Event()
        watching = asyncio.create_task(observer(stop))
        await asyncio.gather(
            _steady(args.graph_rate, graph_agents, until, traffic, invoke),
            _steady(args.store_rate, store_agents, until, traffic, put),
            killer(),
        )
        final = token()
        stop.set()
        await watching
        deadline = time.monotonic() + CATCH_UP_TIMEOUT_S
        while not progress.reached(final) and time.monotonic() < deadline:
            await asyncio.sleep(POLL_INTERVAL_S)
            await progress.poll()
        caught_up = progress.reached(final)
        memory_end = _memory(stack)
        problems = await _check(conn, settings.postgres_schema, saver, traffic, run_id) if caught_up else []
    await conn.close()
    if not caught_up:
        problems.append(f"the projection did not catch up within {CATCH_UP_TIMEOUT_S:.0f} s")
    problems += [f"agent error: {e}" for e in traffic.errors[:5]]

    print(f"\n| soak ({args.minutes} min, projector SIGKILL every {args.kill_every:.0f} s, {kills} kills) | value |")
    print("|---|---|")
    print(
        f"| graph invocations / store puts | {traffic.invocations:,} / {traffic.puts:,} "
        f"({traffic.missed_ticks} ticks missed, {traffic.retried} runs retried after a retryable 503) |"
    )
    print(f"| checkpoints / pending writes acknowledged | {len(saver.checkpoints):,} / {len(saver.writes):,} |")
    print(f"| backlog, events (sampled every {SAMPLE_INTERVAL_S:.0f} s) | {_percentiles(backlog)} |")
    print(f"| freshness, ms (ack to applied) | {_percentiles(freshness_ms)} |")
    for name, start in memory_start.items():
        if (end := memory_end.get(name)) is not None:
            print(f"| RSS {name}, MiB | start {start:,.0f}, end {end:,.0f} |")
    print(f"| check | {'nothing lost, nothing duplicated' if not problems else '; '.join(problems)} |")
    return 1 if problems else 0


async def _check(
    conn: asyncpg.Connection, schema: str, saver: CountingSaver, traffic: Traffic, run_id: str
) -> list[str]:
    problems = []
    like = f"soak-{run_id}-%"
    checkpoints = await conn.fetchval(f"SELECT count(*) FROM {schema}.checkpoints WHERE thread_id LIKE $1", like)
    writes = await conn.fetchval(f"SELECT count(*) FROM {schema}.checkpoint_writes WHERE thread_id LIKE $1", like)
    if checkpoints != len(saver.checkpoints):
        problems.append(f"{checkpoints} checkpoint rows for {len(saver.checkpoints)} acknowledged checkpoints")
    if writes != len(saver.writes):
        problems.append(f"{writes} write rows for {len(saver.writes)} acknowledged writes")
    rows = await conn.fetch(
        f"SELECT prefix, key, value->>'n' AS n FROM {schema}.store WHERE prefix LIKE $1", f"soak.{run_id}.%"
    )
    found = {(tuple(r["prefix"].split(".")), r["key"]): int(r["n"]) for r in rows}
    if found != traffic.last_values:
        wrong = sum(1 for k, v in traffic.last_values.items() if found.get(k) != v)
        problems.append(f"{wrong} of {len(traffic.last_values)} store keys do not hold the last value written")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0, help="duration of the traffic (default 10)")
    parser.add_argument("--kill-every", type=float, default=60.0, help="seconds between projector SIGKILLs")
    parser.add_argument("--graph-rate", type=float, default=20.0, help="graph invocations per second")
    parser.add_argument("--store-rate", type=float, default=100.0, help="store puts per second")
    parser.add_argument("--agents", type=int, default=16, help="concurrent agents per kind of traffic")
    parser.add_argument("--threads", type=int, default=500, help="LangGraph threads the invocations cycle through")
    args = parser.parse_args()
    with DevStack(Path(tempfile.mkdtemp(prefix="graphledger-soak-")), log_level="WARNING") as stack:
        return asyncio.run(soak(stack, args))


if __name__ == "__main__":
    sys.exit(main())
