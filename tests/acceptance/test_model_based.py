"""KafkaSaver against a model (invariants 5 and 10): agents as separate OS processes run a random script of
put, put_writes, get_tuple, list, aget_state, delete_thread, copy_thread, prune, delete_for_runs,
erasure and LangGraph runs (turns, several agents racing on one thread) on a few threads, several
operations at once in each process, with a memory bound so small that threads are evicted all the time,
while the projector is frozen, killed and restarted at random. Every read must equal the reference
(`model_reference.py`: InMemorySaver with the official Postgres saver's rules, plus copy, prune,
delete_for_runs, erasure and the one-writer rule as documented) at some point between its start and its
end (`model_check.py` says how), and a run that answered ok had none of its writes refused by the
reference. At the end every thread is read once more, by each agent and by a fresh one, once the
projection has caught up, and the projection holds no dead letter and no parked subject (every operation
is valid: a record set aside is a write lost to readers).

Behaviours that find a graphledger bug already reported are left out by default (`KNOWN_BUGS`, each
with the bug it finds; `GRAPHLEDGER_MODEL_KNOWN_BUGS=1` puts them back), so that the rest of the model
keeps being exercised; `tests/acceptance/test_model_rules.py` reduces each such behaviour to a few operations.

GRAPHLEDGER_MODEL_SEED replays a seed (the same operations; the interleaving is the machine's),
GRAPHLEDGER_MODEL_OPS sets the number of operations (600 here, 10,000 in `make soak`),
GRAPHLEDGER_MODEL_EXCLUDE leaves out operation kinds or behaviours (`model_ops.FEATURES`, comma-separated)
and GRAPHLEDGER_MODEL_DUMP names the file the history is pickled to (for `model_check.History`; on a failure
the stack's logs are kept where the run's summary says, as every dev stack's are: tests/conftest.py). The seed
and a report are printed (`pytest -s` shows them on success too).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import pickle
import queue
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from aiokafka import TopicPartition

from graphledger.events.envelope import HEADER_TYPE, header
from graphledger.settings import Settings
from graphledger_server.devstack.stack import DevStack
from kafka_clients import raw_consumer
from model_check import History, Outcome, Report
from model_ops import EVERY_THREAD_KINDS, READ_KINDS, RUN_IDS, TURN_THREADS, Fault, Generator, Op, Script, pack

SHORT_RUN_OPS = 600
OPS = int(os.environ.get("GRAPHLEDGER_MODEL_OPS") or SHORT_RUN_OPS)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300 + OPS)]

AGENT = Path(__file__).parents[1] / "model_agent.py"
AGENTS = 3
CONCURRENCY = 4
"""Operations each agent runs at once."""
MEMORY_BYTES = (2_000, 8_000, 40_000)
"""Each agent's `client_thread_memory_bytes`: about one thread, a few, most of them."""
CONSISTENCY_TIMEOUT_S = 3.0
"""The stack's read deadline: short, so that reads the projection cannot serve fail quickly."""
FAULTS_EVERY = 120
"""Operations between faults, on average."""
CALL_TIMEOUT_S = 180.0
FINAL_READ_DEADLINE_S = 180.0
"""How long the last reads are asked again while they fail retryably (a restarted projector catching up)."""

KNOWN_BUGS: dict[str, str] = {}
"""Behaviours of the script (`model_ops.FEATURES`, or operation kinds) left out by default because they
find a graphledger bug already reported; `GRAPHLEDGER_MODEL_KNOWN_BUGS=1` includes them."""


@pytest.fixture(scope="module")
def stack() -> Iterator[DevStack]:
    with DevStack(partitions=4, base=Settings(consistency_timeout_s=CONSISTENCY_TIMEOUT_S)) as dev:
        yield dev


class AgentProcess:
    """One `model_agent.py`; its answers go to the shared `answers` queue as `(agent, answer)`."""

    def __init__(self, index: int, env: dict[str, str], log_dir: Path, answers: queue.Queue[Any]) -> None:
        self.index = index
        self.log_path = log_dir / f"model-agent-{index}.log"
        self._log = open(self.log_path, "w")
        self.process = subprocess.Popen(
            [sys.executable, str(AGENT)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            bufsize=1,
        )
        self._ready = threading.Event()
        self._answers = answers
        threading.Thread(target=self._read, name=f"model-agent-{index}", daemon=True).start()
        if not self._ready.wait(60):
            raise TimeoutError(f"agent {index} did not start; see {self.log_path}")

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            message = json.loads(line)
            if message.get("event") == "ready":
                self._ready.set()
            else:
                self._answers.put((self.index, message))
        self._answers.put((self.index, None))

    def send(self, op: Op) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"id": op.index, "op": op.kind, "args": pack(op.args)}) + "\n")
        self.process.stdin.flush()

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._log.close()


class Projector:
    """The stack's projector, faulted from a thread of its own, one fault at a time."""

    def __init__(self, stack: DevStack) -> None:
        self.stack = stack
        self.faults: queue.Queue[Fault | None] = queue.Queue()
        self.done: Counter[str] = Counter()
        self._thread = threading.Thread(target=self._run, name="projector-faults", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (fault := self.faults.get()) is not None:
            pid = self.stack.pids().get("projector")
            if pid is None:  # a new one is still starting
                self.stack.start_projector(wait=True) if not self._running() else None
                pid = self.stack.pids()["projector"]
            match fault.kind:
                case "freeze":
                    os.kill(pid, signal.SIGSTOP)
                    time.sleep(fault.seconds)  # the fault's duration, not a wait for anything
                    os.kill(pid, signal.SIGCONT)
                case "kill":
                    self.stack.kill_projector(signal.SIGKILL)
                    self.stack.start_projector(wait=False)
                case "restart":
                    self.stack.restart_projector(wait=False)
            self.done[fault.kind] += 1

    def _running(self) -> bool:
        child = self.stack.children.get("projector")
        return child is not None and child.running

    def stop(self) -> None:
        """Wait for the faults queued so far, then leave a projector running."""
        self.faults.put(None)
        self._thread.join(CALL_TIMEOUT_S)
        if not self._running():
            self.stack.start_projector()


@dataclass
class Run:
    script: Script
    outcomes: dict[int, Outcome] = field(default_factory=dict)
    final: list[Op] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    """Failures that are neither retryable nor a refused write to an erased thread."""
    failed: Counter[str] = field(default_factory=Counter)
    """Failures that are no error: retryable ones (by kind), writes refused for an erased thread."""
    stats: list[dict[str, Any]] = field(default_factory=list)
    faults: Counter[str] = field(default_factory=Counter)
    erasures: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    """Where each thread's `thread.erase` records are in the log."""
    set_aside: list[str] = field(default_factory=list)
    """Records the projector dead-lettered or parked: every operation of the script is valid, so any is a
    write lost to readers."""
    seconds: float = 0.0


def _run_ops(agents: list[AgentProcess], answers: queue.Queue[Any], ops: list[Op],
             on_sent: Any = None, apart: bool = False) -> dict[int, Outcome]:  # fmt: skip
    """Send `ops` in order, each to its agent once that agent runs fewer than CONCURRENCY (and, `apart`,
    none of the other kind, read or write, on the same threads); returns each operation's outcome."""
    inflight: dict[int, dict[int, Op]] = {i: {} for i in range(len(agents))}
    outcomes: dict[int, Outcome] = {}
    pending = iter(ops)
    waiting = next(pending, None)
    sent = 0
    while waiting is not None or any(inflight.values()):
        while waiting is not None and _may_send(waiting, inflight[waiting.agent], apart):
            agents[waiting.agent].send(waiting)
            inflight[waiting.agent][waiting.index] = waiting
            sent += 1
            if on_sent is not None:
                on_sent(sent)
            waiting = next(pending, None)
        try:
            agent, answer = answers.get(timeout=CALL_TIMEOUT_S)
        except queue.Empty:
            raise AssertionError(f"no answer from any agent in {CALL_TIMEOUT_S}s; in flight: {inflight}") from None
        if answer is None:
            raise AssertionError(f"agent {agent} exited; see {agents[agent].log_path}")
        del inflight[agent][answer["id"]]
        outcomes[answer["id"]] = Outcome.from_answer(answer)
    return outcomes


def _may_send(op: Op, running: dict[int, Op], apart: bool) -> bool:
    if len(running) >= CONCURRENCY:
        return False
    if not apart:
        return True
    reading = op.kind in READ_KINDS
    for other in running.values():
        if (other.kind in READ_KINDS) != reading and _touch_same_threads(op, other):
            return False
    return True


def _touch_same_threads(a: Op, b: Op) -> bool:
    if a.kind in EVERY_THREAD_KINDS or b.kind in EVERY_THREAD_KINDS:
        return True
    return bool(set(a.threads()) & set(b.threads()))


def _final_reads(script: Script, agents: int, start: int) -> list[Op]:
    """Every thread read by every agent (the last one is fresh): each namespace's newest, the whole
    history, the graph state; and by each agent a list across threads, so every kind of read is checked
    even when a short run's faults failed all of one kind."""
    ops, index = [], itertools.count(start)
    for agent in range(agents):
        ops.append(Op(next(index), agent, "list_all", {"filter": {"run_id": RUN_IDS[agent % len(RUN_IDS)]}}))
    for agent, thread in itertools.product(range(agents), script.threads):
        for ns in ("", "inner", "call:1"):
            ops.append(Op(next(index), agent, "get_tuple", {"thread": thread, "ns": ns, "checkpoint_id": None}))
        ops.append(Op(next(index), agent, "list", {"thread": thread, "ns": None, "filter": None, "before": None,
                                                    "limit": None}))  # fmt: skip
        ops.append(Op(next(index), agent, "get_state", {"thread": thread}))
    return ops


def _classify(run: Run, ops: list[Op], outcomes: dict[int, Outcome], erased: set[str]) -> None:
    for op in ops:
        out = outcomes[op.index]
        if out.ok:
            continue
        if out.retryable:
            run.failed[op.kind] += 1
        elif out.error_type == "SubjectErasedError" and set(op.threads()) & erased:
            run.failed["refused (erased)"] += 1
        elif op.kind == "turn" and out.error_type == "ThreadWriteRefusedError":
            run.failed["turn refused (one writer)"] += 1
        else:
            run.errors.append(f"op#{op.index} agent {op.agent} {op.kind} {op.args}: {out.error}")


def run_model(stack: DevStack, script: Script, log_dir: Path, apart: bool) -> Run:
    run = Run(script)
    answers: queue.Queue[Any] = queue.Queue()
    env = stack.client_env()
    bounds = [{"GRAPHLEDGER_CLIENT_THREAD_MEMORY_BYTES": str(MEMORY_BYTES[i % 3])} for i in range(AGENTS)]
    agents = [AgentProcess(i, {**os.environ, **env, **bounds[i]}, log_dir, answers) for i in range(AGENTS)]
    ops = script.ops
    faults = {f.at: f for f in script.faults}
    projector = Projector(stack)
    started = time.monotonic()
    try:
        run.outcomes = _run_ops(
            agents, answers, ops, lambda sent: faults.get(sent) and projector.faults.put(faults[sent]), apart
        )
    finally:
        projector.stop()
    run.faults = projector.done
    # The last reads, once a projector runs: by every agent, and by a fresh one.
    agents.append(AgentProcess(AGENTS, {**os.environ, **env}, log_dir, answers))
    final = pending = _final_reads(script, len(agents), len(ops))
    deadline = time.monotonic() + FINAL_READ_DEADLINE_S
    while pending:
        outcomes = _run_ops(agents, answers, pending)
        run.outcomes.update(outcomes)
        run.final.extend(op for op in pending if outcomes[op.index].ok)
        pending = [op for op in pending if outcomes[op.index].retryable]
        run.failed["final reads"] += len(pending)
        assert time.monotonic() < deadline or not pending, f"final reads kept failing: {pending[:3]}"
    stats = [Op(len(ops) + 10**6 + i, i, "stats", {}) for i in range(len(agents))]
    outcomes = _run_ops(agents, answers, stats)
    run.stats = [outcomes[op.index].result for op in stats]
    keys = Op(len(ops) + 2 * 10**6, 0, "keys", {"threads": script.threads})
    thread_keys = _run_ops(agents, answers, [keys])[keys.index].result
    ends: dict[int, int] = {}
    for out in run.outcomes.values():
        for partition, offset in itertools.chain(*out.records):
            ends[partition] = max(ends.get(partition, 0), offset + 1)
    run.erasures = asyncio.run(_erase_records(stack.settings, thread_keys, ends))
    copies = {  # a copy's stage is at its last record (a large copy is chunked)
        out.records[0][-1] for op in ops if op.kind == "copy_thread" and (out := run.outcomes[op.index]).ok
    }
    run.set_aside = asyncio.run(_set_aside(stack.settings, copies))
    # Writes to an erased thread are refused (erasing a thread erases those copied from it too).
    _classify(run, ops, run.outcomes, set(run.erasures))
    _classify(run, final, run.outcomes, set(run.erasures))
    run.seconds = time.monotonic() - started
    for agent in agents:
        agent.close()
    return run


async def _erase_records(
    settings: Settings, keys: dict[str, str], known_ends: dict[int, int]
) -> dict[str, list[tuple[int, int]]]:
    """The `(partition, offset)` of every `thread.erase` record in the checkpoint topic, by thread (its
    record key is the thread's reference, which the agents' sealers compute). Read up to the ends the
    agents' records show, then until the topic has been quiet for a second (tansu's ListOffsets can
    answer short of the end)."""
    threads = {key.encode(): thread for thread, key in keys.items()}
    consumer = raw_consumer(settings)
    await consumer.start()
    try:
        topic = settings.checkpoint_topic
        partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        found: dict[str, list[tuple[int, int]]] = {}
        quiet = False
        while True:
            batch = await consumer.getmany(timeout_ms=1000)
            for tp, records in batch.items():
                for r in records:
                    if header(r.headers, HEADER_TYPE) == b"thread.erase" and r.key in threads:
                        found.setdefault(threads[r.key], []).append((tp.partition, r.offset))
            behind = [tp for tp in partitions if await consumer.position(tp) < known_ends.get(tp.partition, 0)]
            if not batch and not behind:
                if quiet:
                    return found
                quiet = True
    finally:
        await consumer.stop()


async def _set_aside(settings: Settings, copies: set[tuple[int, int]]) -> list[str]:
    """The projection's dead letters and parked subjects (an erasure drops those of its subject), and the
    stages of acknowledged copies (`copies`: their records' positions) no barrier moved into their target:
    once the projection caught up, each copy's barrier has applied, or the target's erasure dropped it."""
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        schema = settings.postgres_schema
        letters = await conn.fetch(
            f'SELECT topic, partition, "offset", event_type, reason FROM {schema}.graphledger_dead_letters'
        )
        parked = await conn.fetch(
            f"SELECT topic, partition, first_offset, cause FROM {schema}.graphledger_parked_subjects"
        )
        stages = await conn.fetch(
            f'SELECT topic, partition, "offset", source_thread_id, target_thread_id '
            f"FROM {schema}.graphledger_copy_stages"
        )
    finally:
        await conn.close()
    return (
        [f"dead letter {r['topic']}:{r['partition']}@{r['offset']} {r['event_type']}: {r['reason']}" for r in letters]
        + [f"parked {r['topic']}:{r['partition']} from {r['first_offset']}: {r['cause']}" for r in parked]
        + [
            f"stage of the copy {r['source_thread_id']} -> {r['target_thread_id']} at {r['topic']}:{r['partition']}"
            f"@{r['offset']} left: its barrier applied without it"
            for r in stages
            if (r["partition"], r["offset"]) in copies
        ]
    )


def _excluded() -> dict[str, str]:
    excluded = {k: "GRAPHLEDGER_MODEL_EXCLUDE" for k in os.environ.get("GRAPHLEDGER_MODEL_EXCLUDE", "").split(",") if k}
    if os.environ.get("GRAPHLEDGER_MODEL_KNOWN_BUGS") != "1":
        excluded.update(KNOWN_BUGS)
    return excluded


def _report(seed: int, run: Run, report: Report, excluded: dict[str, str]) -> str:
    kinds = Counter(op.kind for op in run.script.ops)
    answered, fell_back = Counter[str](), Counter[str]()
    for stats in run.stats:
        answered.update(stats["answered"])
        fell_back.update(stats["fell_back"])
    lines = [
        f"model test seed {seed}: {len(run.script.ops)} operations ({dict(kinds)}) in {run.seconds:.0f}s",
        f"  faults: {dict(run.faults)}; excluded: {excluded or 'none'}",
        f"  reads checked: {report.checked.total()} {dict(report.checked)} (+{len(run.final)} final), "
        f"{report.candidates} candidate states; unchecked: {dict(report.unchecked)}",
        f"  violations: {len(report.violations)}; key order only: {dict(report.key_order)}; anomalies: "
        f"{len(report.anomalies)}; errors: {len(run.errors)}; set aside (dead letters, parked, stages left): "
        f"{len(run.set_aside)}",
        f"  failures (retryable, or writes refused for an erased thread): {dict(run.failed)}",
        f"  turns (LangGraph runs racing on {TURN_THREADS} threads): {dict(report.runs)}; refused by their writer "
        f"though the reference counts them: {report.cautious_refusals}",
        f"  gets answered: {dict(answered)} (folded: other processes' records folded onto what is held); why "
        f"reads went to the read API: {dict(fell_back)}",
        f"  held bytes at the end, by agent: {[s['held_bytes'] for s in run.stats]} (bounds {list(MEMORY_BYTES)}, "
        "then the fresh agent's default)",
    ]
    return "\n".join(lines)


def test_kafka_saver_matches_the_model(stack: DevStack) -> None:
    seed = int(os.environ.get("GRAPHLEDGER_MODEL_SEED") or random.SystemRandom().randrange(10**9))
    count = OPS
    excluded = _excluded()
    print(f"model test seed {seed} (GRAPHLEDGER_MODEL_SEED={seed} replays it), {count} operations", flush=True)
    script = Generator(seed, AGENTS, f"m{seed}", excluded).script(count, FAULTS_EVERY)
    run = run_model(stack, script, stack.log_dir, apart="reads_racing_own_writes" in excluded)
    print(f"operations done in {run.seconds:.0f}s; checking", flush=True)
    history = History(script.ops + run.final, run.outcomes, script.threads, run.erasures)
    report = asyncio.run(history.check())
    summary = _report(seed, run, report, excluded)
    print(summary, flush=True)
    dump = os.environ.get("GRAPHLEDGER_MODEL_DUMP") or str(
        Path(tempfile.gettempdir()) / f"graphledger-model-{seed}.pickle"
    )
    with open(dump, "wb") as f:
        pickle.dump({"script": script, "outcomes": run.outcomes, "final": run.final, "erasures": run.erasures}, f)
    problems = [history.explain(v) for v in report.violations[:5]] + report.anomalies[:10] + run.errors[:10]
    problems += report.wrong_runs[:10]
    problems += run.set_aside[:10]
    assert not problems, f"{summary}\nhistory pickled to {dump}\n" + "\n".join(problems)
    # Every kind of read was checked, and some were answered from what a process holds (the path under test).
    assert all(report.checked[k] for k in READ_KINDS if k not in excluded), summary
    assert sum(stats["answered"].get("held", 0) for stats in run.stats) > 0, summary
    # And each agent held no more than its bound (the last one, fresh, has the default).
    assert all(stats["held_bytes"] <= bound for stats, bound in zip(run.stats, MEMORY_BYTES, strict=False)), summary
