"""The check of the model-based test: every read against the reference at the log prefixes its time
allows (`tests/acceptance/test_model_based.py` runs the operations; `model_reference.py` is the
reference).

**Log order.** All of a thread's records are on one partition, so a thread's writes are ordered by the
offsets their records landed at (each agent reports them). A write's effect on a thread sits at its
record on the thread's partition: a put, writes, delete or prune at its own record; `copy_thread` at
its barrier on the target's partition, copying the source as of the copy's record on the source's
partition; `delete_for_runs` at its copy on the thread's partition; an erasure at the first
`thread.erase` record of the thread in the log (the test scans the topic for them: an erase also erases
every thread copied from the erased one, each at a record of its own, and an erase that answered
`erasure_incomplete` and was asked again published some of them in the attempt that failed), with the
time of the erase call that erased it. An erasure takes effect when the call destroys the subject's key,
before its record (docs/security.md, "Erase": from then on every reader takes any record of the subject
for its erasure), and writes that land in between are erased with the rest: so a read ending after the
call began may also answer the thread erased. A copy whose source an erase call erases may copy nothing
once that call has begun (the projector may meet the source's records only after its key is gone), so a
read of the copy's target ending after the call began may also see that copy hollow, whichever call
erases the target (each copy from a source being erased, hollow or not).

**Runs.** A `turn` is a LangGraph run; each of its saver writes is an effect of its own, at its record,
with its own times, decided by the reference's one-writer rule from the intent its record carried. A run
that answered ok must have had none of its writes refused (`History.refusals`); one refused by its writer
although the reference counts every write it sent is counted apart (a writer deciding from the log's
headers takes a prune, whose strategy is sealed, for an operation).

**The window.** A read of a thread is correct when it equals the reference after some prefix of the
thread's writes in log order that holds every write acknowledged before the read began and no write
begun after it ended (times from one monotonic clock shared by every process of the machine). A
read across threads (`list` without a thread) is checked thread by thread.

**What is not checked.** A write that failed in a way that leaves unknown whether it landed (a
retryable publish error, an erase that never completed) makes its threads unchecked from its start:
the test counts them; with Kafka up they do not happen.
"""

from __future__ import annotations

import bisect
import itertools
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointTuple

from model_ops import READ_KINDS, WRITE_KINDS, Op, build_graph, unpack
from model_reference import ReferenceSaver

WRITES = frozenset(WRITE_KINDS)
READS = frozenset(READ_KINDS)
NO_EFFECT_ERRORS = frozenset({"SubjectErasedError"})
"""Errors raised before anything is published: the write did not happen."""
REFUSED = "ThreadWriteRefusedError"
"""A run's write the one-writer rule refused: the run reports every write it sent."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """What an agent answered for one operation."""

    ok: bool
    t0: float
    t1: float
    records: list[list[tuple[int, int]]]
    result: Any = None
    error: str | None = None
    error_type: str | None = None
    retryable: bool = False
    calls: list[dict[str, Any]] | None = None
    """A turn's saver writes (`model_agent.py`)."""
    answered: tuple[str, ...] = ()
    """How its thread reads were answered (`model_agent.py`)."""

    @classmethod
    def from_answer(cls, answer: dict[str, Any]) -> Outcome:
        return cls(
            ok=answer["ok"],
            t0=answer["t0"],
            t1=answer["t1"],
            records=[[(p, o) for p, o in event] for event in answer["records"]],
            result=unpack(answer["result"]) if "result" in answer else None,
            error=answer.get("error"),
            error_type=answer.get("error_type"),
            retryable=answer.get("retryable", False),
            calls=unpack(answer["calls"]) if "calls" in answer else None,
            answered=tuple(answer.get("answered", ())),
        )


@dataclass(frozen=True, slots=True)
class Effect:
    """One write's effect on one thread, at its record's place on the thread's partition."""

    thread: str
    partition: int
    offset: int
    op: Op
    outcome: Outcome
    kind: str
    """The operation's kind, or `erase_copy` for a thread erased because it was copied from another."""
    source: tuple[str, int, int] | None = None
    """A copy's source thread and its copy record (partition, offset)."""

    def describe(self, start: float) -> str:
        times = f"[{self.outcome.t0 - start:9.4f}, {self.outcome.t1 - start:9.4f}]"
        detail = {k: v for k, v in self.op.args.items() if k not in ("checkpoint", "writes")}
        if self.op.kind == "put":
            a = self.op.args
            detail = {"ns": a["ns"], "id": a["checkpoint"]["id"], "parent": a["parent"],
                      "run_id": a["metadata"].get("run_id"), "versions": a["new_versions"]}  # fmt: skip
        elif self.op.kind == "put_writes":
            a = self.op.args
            detail = {"ns": a["ns"], "id": a["checkpoint_id"], "task": a["task_id"],
                      "channels": [c for c, _ in a["writes"]]}  # fmt: skip
        source = f" from {self.source}" if self.source else ""
        where = f"@{self.partition}:{self.offset} op#{self.op.index} agent {self.op.agent}"
        return f"{where} {self.kind}{source} {times} {detail}"


@dataclass
class Verdict:
    op: Op
    outcome: Outcome
    thread: str
    window: tuple[int, int]
    answer: Any
    candidates: list[Any]


class _GraphReads(BaseCheckpointSaver[str]):
    """The checkpointer of the graph whose `aget_state` the check computes: its get answers from
    `tuples`, its delta history from `history` (`tuples` when None), and it notes the latter's use."""

    tuples: ReferenceSaver
    history: ReferenceSaver | None = None
    walked = False

    async def aget_tuple(self, config: Any) -> CheckpointTuple | None:
        return self.tuples.get_tuple(config)

    async def aget_delta_channel_history(self, *, config: Any, channels: Any) -> Any:
        self.walked = True
        return (self.history or self.tuples).get_delta_channel_history(config=config, channels=channels)


class History:
    """Every operation with its outcome, the writes ordered by log order per thread."""

    def __init__(
        self,
        ops: list[Op],
        outcomes: dict[int, Outcome],
        threads: list[str],
        erasures: dict[str, list[tuple[int, int]]],
    ) -> None:
        self.ops = ops
        self.outcomes = outcomes
        self.threads = threads
        self.start = min((o.t0 for o in outcomes.values()), default=0.0)
        self.effects: dict[str, list[Effect]] = defaultdict(list)
        self.tainted: dict[str, float] = {}
        """Threads whose writes are not all known, from the time the unknown one began."""
        self.anomalies: list[str] = []
        self._states: dict[tuple[str, frozenset[str]], dict[int, ReferenceSaver]] = defaultdict(dict)
        self.erased_from: dict[str, float] = {}
        """Erased threads, from the time the erase call erasing them began (`_erasures`)."""
        self._erased_by: dict[str, Op] = {}
        broadcasts: list[tuple[int, int, Op, Outcome]] = []
        self.turns: dict[int, list[Effect]] = {}
        """Each turn's writes, by the turn's op index."""
        for op in ops:
            out = outcomes.get(op.index)
            if out is None or op.kind not in WRITES:
                continue
            if op.kind == "turn":
                self._turn(op, out)
                continue
            if not out.ok:
                if out.error_type in NO_EFFECT_ERRORS and op.kind == "prune":
                    # One event per thread, in order: those published before the refused one count.
                    for thread, event in zip(dict.fromkeys(op.args["threads"]), out.records, strict=False):
                        partition, offset = event[-1]
                        self.effects[thread].append(Effect(thread, partition, offset, op, out, "prune"))
                    continue
                if out.error_type in NO_EFFECT_ERRORS and not out.records:
                    continue
                for thread in op.threads() or threads:
                    self.tainted[thread] = min(self.tainted.get(thread, out.t0), out.t0)
                continue
            for thread, (partition, offset), kind, source in _write_effects(op, out):
                if thread is None:
                    broadcasts.append((partition, offset, op, out))
                else:
                    self.effects[thread].append(Effect(thread, partition, offset, op, out, kind, source))
        self.partition: dict[str, int] = {}
        for thread, effects in self.effects.items():
            partitions = {e.partition for e in effects}
            if len(partitions) > 1:
                self.anomalies.append(f"thread {thread}: records on partitions {sorted(partitions)}")
            self.partition[thread] = effects[0].partition
        for partition, offset, op, out in broadcasts:
            for thread, p in self.partition.items():
                if p == partition:
                    self.effects[thread].append(Effect(thread, partition, offset, op, out, op.kind))
        for effects in self.effects.values():
            effects.sort(key=lambda e: e.offset)
        self._graph_reads = _GraphReads()
        self._graph = build_graph(self._graph_reads)
        self._erasures(erasures)

    def _turn(self, op: Op, out: Outcome) -> None:
        """A LangGraph run's writes, each an effect at its record with its own times. Known whenever each
        write either returned or was refused (`ThreadWriteRefusedError`); a run that failed otherwise (a
        read that timed out, a refusal before anything was sent) wrote what it reports."""
        effects = self.turns[op.index] = []
        for call in out.calls or []:
            if call.get("error_type") not in (None, REFUSED):
                thread = op.args["thread"]
                self.tainted[thread] = min(self.tainted.get(thread, call["t0"]), call["t0"])
                continue
            if not call["records"]:
                continue  # refused before it was sent
            partition, offset = call["records"][-1][-1]
            write = Op(op.index, op.agent, call["kind"], {**call["args"], "intent": call["intent"]})
            done = Outcome(True, call["t0"], call["t1"], [[tuple(r) for r in call["records"][-1]]])
            effect = Effect(call["args"]["thread"], partition, offset, write, done, call["kind"])
            self.effects[effect.thread].append(effect)
            effects.append(effect)

    def refusals(self) -> list[str]:
        """The runs whose writes the reference refused, though the run did not fail so (each a violation), and
        the count of runs refused by their writer although the reference counts every one of their writes
        (a writer deciding from the log's headers errs toward refusing: docs/architecture.md)."""
        wrong, cautious = [], 0
        for index, effects in self.turns.items():
            out = self.outcomes[index]
            refused = {(e.partition, e.offset) for e in effects} & self._refused(effects)
            if out.ok and refused:
                wrong.append(f"turn op#{index} answered ok, but the rule refused its writes at {sorted(refused)}")
            elif out.error_type == REFUSED and not refused:
                cautious += 1
        self.cautious_refusals = cautious
        return wrong

    def _refused(self, effects: list[Effect]) -> set[tuple[int, int]]:
        found: set[tuple[int, int]] = set()
        for thread in {e.thread for e in effects}:
            found |= self.state(thread, len(self.effects[thread])).refused
        return found

    def _erasures(self, erasures: dict[str, list[tuple[int, int]]]) -> None:
        """Each erased thread's first `thread.erase` record, as an effect of the erase call that erased
        it: the one naming it, or the first whose thread it was copied from (transitively); and the
        check that exactly those copies were erased that were made before their source's erasure and
        copied something (a copy of a thread holding nothing records no lineage: the projection's rule,
        so that a copy made after its source's erasure is spared by an erase asked again)."""
        calls = [op for op in self.ops if op.kind == "erase" and (o := self.outcomes.get(op.index)) and o.ok]
        calls.sort(key=lambda op: self.outcomes[op.index].t0)
        first = {thread: min(records, key=lambda r: r[1]) for thread, records in erasures.items()}
        copies = [(op.args["source"], op.args["target"], self.outcomes[op.index].records[0][-1]) for op in self.ops
                  if op.kind == "copy_thread" and (o := self.outcomes.get(op.index)) and o.ok]  # fmt: skip
        # A thread is erased at its first thread.erase record whichever call published it, so the states
        # that decide whether a copy copied something are known before the records are attributed.
        stand_ins = {}
        if calls:
            call = calls[0]
            for thread, (partition, offset) in first.items():
                stand_ins[thread] = Effect(thread, partition, offset, call, self.outcomes[call.index], "erase")
                bisect.insort(self.effects[thread], stand_ins[thread], key=lambda e: e.offset)
        expected: dict[str, Op] = {}

        def erase(call: Op, root: str) -> None:
            todo = [root]
            while todo:
                thread = todo.pop()
                if thread in expected:
                    continue
                expected[thread] = call
                if thread not in first:
                    self.anomalies.append(f"thread {thread} was copied from a thread erased by op#{call.index} before "
                                          "that erasure, but has no thread.erase record")  # fmt: skip
                    continue
                _, erased_at = first[thread]
                todo.extend(
                    t for s, t, (p, o) in copies if s == thread and s != t and o < erased_at and self._copied(s, o)
                )

        for call in calls:
            erase(call, call.args["thread"])
        # A copy made before its source's erasure that copied nothing may be erased with the source all
        # the same: the projector met the source's records erased and cannot tell (docs/security.md, "Erase").
        spared = True
        while spared:
            spared = False
            for s, t, (_, o) in copies:
                if t in first and t not in expected and s in expected and s in first and s != t and o < first[s][1]:
                    erase(expected[s], t)
                    spared = True
        for thread, stand_in in stand_ins.items():
            self.effects[thread] = [e for e in self.effects[thread] if e is not stand_in]
        for thread in first.keys() - expected.keys():
            self.anomalies.append(f"thread {thread} was erased (records {erasures[thread]}) by no erase call")
        for thread, call in expected.items():
            if thread not in first:
                continue
            partition, offset = first[thread]
            kind = "erase" if call.args["thread"] == thread else "erase_copy"
            effect = Effect(thread, partition, offset, call, self.outcomes[call.index], kind)
            bisect.insort(self.effects[thread], effect, key=lambda e: e.offset)
        self._states.clear()
        self._erased_by = expected
        for thread, call in expected.items():
            if thread in first:
                self.erased_from[thread] = self.outcomes[call.index].t0

    def _copied(self, source: str, offset: int) -> bool:
        """Whether the copy whose record is at `offset` of `source`'s partition found a checkpoint or a
        write of the source there (what the projection records a copy's lineage for)."""
        effects = self.effects.get(source, [])
        state = self.state(source, bisect.bisect_left([e.offset for e in effects], offset))
        return any(state.storage.get(source, {}).values()) or any(
            rows for (thread, _, _), rows in state.writes.items() if thread == source
        )

    # -- the reference after a prefix ------------------------------------------------------------

    def state(self, thread: str, k: int, hollow: frozenset[str] = frozenset()) -> ReferenceSaver:
        """The reference holding `thread` after its first `k` writes in log order (`hollow`: its copies
        from these sources copied nothing)."""
        memo = self._states[thread, hollow]
        if k in memo:
            return memo[k]
        known = [i for i in memo if i <= k]
        start = max(known, default=0)
        state = memo[start].snapshot() if known else ReferenceSaver()
        effects = self.effects[thread]
        for i in range(start, k):
            self._apply(state, effects[i], hollow)
            if (i + 1) % 32 == 0 and i + 1 < k:
                memo[i + 1] = state.snapshot()
        memo[k] = state
        return state

    def _apply(self, state: ReferenceSaver, effect: Effect, hollow: frozenset[str] = frozenset()) -> None:
        a, thread = effect.op.args, effect.thread
        match effect.kind:
            case "put":
                configurable = {
                    "thread_id": thread,
                    "checkpoint_ns": a["ns"],
                    "checkpoint_id": a["parent"],
                    **a["extra"],
                }
                at, intent = (effect.partition, effect.offset), a.get("intent")
                state.put({"configurable": configurable}, a["checkpoint"], a["metadata"], a["new_versions"], intent, at)
            case "put_writes":
                configurable = {"thread_id": thread, "checkpoint_ns": a["ns"], "checkpoint_id": a["checkpoint_id"]}
                at, intent = (effect.partition, effect.offset), a.get("intent")
                state.put_writes({"configurable": configurable}, a["writes"], a["task_id"], a["task_path"], intent, at)
            case "delete_thread":
                state.delete_thread(thread)
            case "prune":
                state.prune([thread], strategy=a["strategy"])
            case "delete_for_runs":
                state.delete_for_runs(a["run_ids"])
            case "copy_thread":
                assert effect.source is not None
                source, partition, offset = effect.source
                state.copied_onto(thread)
                if source in hollow:
                    return
                if source != thread:
                    source_effects = self.effects.get(source, [])
                    if source_effects and source_effects[0].partition != partition:
                        self.anomalies.append(f"copy op#{effect.op.index}: its record is not on {source}'s partition")
                    before = bisect.bisect_left([e.offset for e in source_effects], offset)
                    state.rows_of(source, self.state(source, before))
                    state.copy_thread(source, thread)
                    state.delete_thread(source)
                    state.erased.discard(source)
            case "erase" | "erase_copy":
                state.erase(thread)
            case kind:
                raise AssertionError(f"no effect for {kind}")

    # -- reads -----------------------------------------------------------------------------------

    def window(self, thread: str, t0: float, t1: float) -> tuple[int, int]:
        """The prefixes (lengths `lo..hi`) a read of `thread` running from `t0` to `t1` may reflect."""
        effects = self.effects.get(thread, [])
        lo = max((i + 1 for i, e in enumerate(effects) if e.outcome.t1 < t0), default=0)
        hi = min((i for i, e in enumerate(effects) if e.outcome.t0 > t1), default=len(effects))
        return lo, hi

    async def candidates(self, op: Op, thread: str, lo: int, hi: int, t1: float = 0.0) -> list[Any]:
        """What the read may answer: the reference's answer after each prefix of `lo..hi` writes, with any
        of its copies hollow whose source a call that began before the read ended erases, and the thread
        erased, when the read ended after the call erasing it began."""
        found = []
        if t1 > self.erased_from.get(thread, float("inf")):
            erasure = next(i for i, e in enumerate(self.effects[thread]) if e.kind in ("erase", "erase_copy"))
            found.extend(await self._answers(op, thread, erasure + 1, erasure + 1, frozenset()))
        for hollow in _subsets(self._hollowing(thread, t1)):
            found.extend(await self._answers(op, thread, lo, hi, hollow))
        return found

    def _hollowing(self, thread: str, t1: float) -> list[str]:
        """The sources of `thread`'s copies that a call begun before `t1` erases."""
        sources = {e.source[0] for e in self.effects.get(thread, []) if e.kind == "copy_thread" and e.source}
        return sorted(
            source
            for source in sources - {thread}
            if (call := self._erased_by.get(source)) is not None and self.outcomes[call.index].t0 < t1
        )

    async def _answers(self, op: Op, thread: str, lo: int, hi: int, hollow: frozenset[str]) -> list[Any]:
        if op.kind != "get_state":
            return [self._answer(op, thread, self.state(thread, k, hollow)) for k in range(lo, hi + 1)]
        # `aget_state` makes two reads: the newest tuple, then (when a channel stores no value there) the
        # delta history of its ancestors, at the same or a later prefix.
        found = []
        for k in range(lo, hi + 1):
            reads = self._graph_reads
            reads.tuples, reads.history, reads.walked = self.state(thread, k, hollow), None, False
            found.append(await self._graph.aget_state({"configurable": {"thread_id": thread}}))
            if reads.walked:
                for later in range(k + 1, hi + 1):
                    reads.history = self.state(thread, later, hollow)
                    found.append(await self._graph.aget_state({"configurable": {"thread_id": thread}}))
        return found

    def _answer(self, op: Op, thread: str, state: ReferenceSaver) -> Any:
        a = op.args
        match op.kind:
            case "get_tuple":
                config = {"thread_id": thread, "checkpoint_ns": a["ns"]}
                if a["checkpoint_id"] is not None:
                    config["checkpoint_id"] = a["checkpoint_id"]
                return state.get_tuple({"configurable": config})
            case "list":
                config = {"thread_id": thread}
                if a["ns"] is not None:
                    config["checkpoint_ns"] = a["ns"]
                before = {"configurable": {"checkpoint_id": a["before"]}} if a["before"] else None
                return list(state.list({"configurable": config}, filter=a["filter"], before=before, limit=a["limit"]))
            case "list_all":
                return list(state.list({"configurable": {"thread_id": thread}}, filter=a["filter"]))
            case kind:
                raise AssertionError(f"not a read: {kind}")

    def reads(self) -> Iterator[tuple[Op, Outcome, str, Any]]:
        """Every successful read, as `(op, outcome, thread, answer for the thread)`."""
        for op in self.ops:
            out = self.outcomes.get(op.index)
            if out is None or not out.ok or op.kind not in READS:
                continue
            if op.kind == "list_all":
                for thread in self.threads:
                    yield op, out, thread, [t for t in out.result if t.config["configurable"]["thread_id"] == thread]
            else:
                yield op, out, op.args["thread"], out.result

    async def check(self) -> Report:
        report = Report()
        for op, out, thread, answer in self.reads():
            if thread in self.tainted and out.t1 >= self.tainted[thread]:
                report.unchecked[op.kind] += 1
                continue
            lo, hi = self.window(thread, out.t0, out.t1)
            report.checked[op.kind] += 1
            report.candidates += max(0, hi - lo + 1)
            if lo > hi:
                self.anomalies.append(f"op#{op.index}: empty window {lo}..{hi} on {thread}")
                continue
            expected = await self.candidates(op, thread, lo, hi, out.t1)
            if not any(answer == e for e in expected):
                report.violations.append(Verdict(op, out, thread, (lo, hi), answer, expected))
            elif op.kind in ("get_tuple", "list") and not any(_ordered(answer) == _ordered(e) for e in expected):
                report.key_order[op.kind] += 1
        report.anomalies = list(self.anomalies)
        report.wrong_runs = self.refusals()
        report.runs = Counter(
            "refused" if (out := self.outcomes[i]).error_type == REFUSED else "ok" if out.ok else "failed"
            for i in self.turns
        )
        report.cautious_refusals = self.cautious_refusals
        return report

    def explain(self, verdict: Verdict) -> str:
        """A violation with the thread's writes around its window, for the failure message."""
        op, out, thread = verdict.op, verdict.outcome, verdict.thread
        lo, hi = verdict.window
        lines = [
            f"VIOLATION op#{op.index} agent {op.agent} {op.kind} {op.args} on {thread} "
            f"[{out.t0 - self.start:.4f}, {out.t1 - self.start:.4f}]: prefixes {lo}..{hi} allowed",
            f"  answered ({', '.join(out.answered) or 'not told'}): {_short(verdict.answer)}",
        ]
        for expected in verdict.candidates:
            lines.append(f"  a reference answer in the window: {_short(expected)}")
        for i, effect in enumerate(self.effects.get(thread, [])):
            marker = ">" if lo <= i + 1 <= hi else " "
            lines.append(f"  {marker} {i + 1:4d} {effect.describe(self.start)}")
        return "\n".join(lines)


@dataclass
class Report:
    checked: Counter[str] = field(default_factory=Counter)
    unchecked: Counter[str] = field(default_factory=Counter)
    key_order: Counter[str] = field(default_factory=Counter)
    """Reads equal to the reference only up to the key order of checkpoint or metadata (jsonb's)."""
    violations: list[Verdict] = field(default_factory=list)
    anomalies: list[str] = field(default_factory=list)
    candidates: int = 0
    wrong_runs: list[str] = field(default_factory=list)
    """LangGraph runs that answered ok although the rule refused one of their writes."""
    runs: Counter[str] = field(default_factory=Counter)
    """The turns by how they ended: `ok`, `refused` (`ThreadWriteRefusedError`), `failed`."""
    cautious_refusals: int = 0
    """Runs their writer refused though the reference counts every write they sent."""


def _write_effects(op: Op, out: Outcome) -> list[tuple[str | None, tuple[int, int], str, Any]]:
    """Per kind: `(thread or None for every thread of the partition, (partition, offset), kind, source)`."""
    last = [event[-1] for event in out.records]
    a = op.args
    match op.kind:
        case "put" | "put_writes" | "delete_thread":
            return [(a["thread"], last[0], op.kind, None)]
        case "prune":
            return [(t, at, "prune", None) for t, at in zip(dict.fromkeys(a["threads"]), last, strict=True)]
        case "copy_thread":
            (cp, co), barrier = last
            return [(a["target"], barrier, "copy_thread", (a["source"], cp, co))]
        case "delete_for_runs":
            return [(None, at, "delete_for_runs", None) for at in last]
        case "erase":
            return []  # at the thread.erase records the test finds in the log (`History._erasures`)
        case kind:
            raise AssertionError(kind)


def _subsets(items: list[str]) -> Iterator[frozenset[str]]:
    """Every subset of `items`, the empty one first."""
    for size in range(len(items) + 1):
        yield from map(frozenset, itertools.combinations(items, size))


def _ordered(value: Any) -> Any:
    """Checkpoint and metadata dicts as item lists, so that key order counts (channel values as a mapping)."""
    if isinstance(value, CheckpointTuple):
        return (value.config, _keys(value.checkpoint), _keys(value.metadata), value.parent_config, value.pending_writes)
    if isinstance(value, list):
        return [_ordered(v) for v in value]
    return value


def _keys(value: Any) -> Any:
    if isinstance(value, dict):
        return [(k, v if k == "channel_values" else _keys(v)) for k, v in value.items()]
    if isinstance(value, list):
        return [_keys(v) for v in value]
    return value


def _short(value: Any) -> str:
    if isinstance(value, CheckpointTuple):
        c, conf = value.checkpoint, value.config["configurable"]
        parent = value.parent_config["configurable"]["checkpoint_id"] if value.parent_config else None
        return (
            f"Tuple(id={conf['checkpoint_id']} ns={conf['checkpoint_ns']!r} "
            f"parent={parent} values={c.get('channel_values')} metadata={value.metadata} "
            f"writes={value.pending_writes})"
        )
    if isinstance(value, list):
        return "[" + ", ".join(_short(v) for v in value) + "]"
    return repr(value)
