"""The checkpoint projection's plan: a batch cut into steps, pure.

A batch is a list of `(topic, partition, offset, event)` in log order. Planning cuts it into steps: a run
of consecutive data events (`checkpoint.put`, `checkpoint.writes`) becomes one `DataRun` with one array
parameter set per table, deduplicated here with the semantics that applying the events one by one would
have; every other event is a barrier applied on its own, in order. A copy is two of them: its record
stages the source's rows (`StageCopy`), its barrier, on the target's partition, moves them into the
target (`ApplyCopy`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, assert_never

import orjson

from graphledger import ownership
from graphledger.events.checkpoint import (
    CheckpointEvent,
    CheckpointPut,
    CheckpointWrites,
    RunsDelete,
    ThreadCopy,
    ThreadCopyBarrier,
    ThreadDelete,
    ThreadEvent,
    ThreadExpire,
    ThreadPrune,
)
from graphledger.events.erasure import TenantErase, ThreadErase
from graphledger.folds.thread import run_of
from graphledger.opening.checkpoint_events import TimedCheckpointEvent
from graphledger.ownership import Counted, Intent, Ledger, Refused
from graphledger.quick_init import quick_init

BatchItem = tuple[str, int, int, CheckpointEvent | TimedCheckpointEvent]
"""`(topic, partition, offset, event)`: one event at its position in the log (untimed events, as
tests build them, record no thread activity)."""


@dataclass(slots=True)
class DataRun:
    """Consecutive put/writes events as rows of each table (`threads`: column lists, one per `unnest`
    parameter).

    Keys are unique within each statement, merged as sequential application would leave them:
    checkpoints keep the first put's parent and the last put's checkpoint and metadata (the upsert
    updates only those two); blobs keep the first value; a write keeps the last upsert's value if
    any event upserted it, else the first insert's.
    """

    checkpoints: Sequence[Sequence[Any]]
    blobs: Sequence[Sequence[Any]]
    writes_insert: Sequence[Sequence[Any]]
    writes_upsert: Sequence[Sequence[Any]]
    threads: list[list[Any]]
    events: int
    puts: list[Put]
    """Every put of the run in log order, for fork detection (`forks`)."""


@quick_init
@dataclass(frozen=True, slots=True)
class Put:
    """Where a put sits in the log and what it says of its thread namespace's history."""

    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    parent_checkpoint_id: str | None
    topic: str
    partition: int
    offset: int
    protected: bool = False
    """Its writer's intent came with it (`graphledger.ownership`): a fork it makes is a branch it asked for."""
    metadata_json: bytes = b"{}"


@dataclass(frozen=True, slots=True)
class Fork:
    """A put whose parent was not the namespace's newest checkpoint when it applied: a `branch` its writer
    asked for (a protected put, which the rule counted, or `update_state`'s put, which LangGraph makes
    outside any run: metadata source `update` or `fork`), or a `fork` by a writer outside the rule."""

    put: Put
    newest_checkpoint_id: str

    @property
    def kind(self) -> str:
        return "branch" if self.put.protected or _updated(self.put.metadata_json) else "fork"


ASKED_SOURCES: Final = frozenset({"update", "fork"})
"""LangGraph's metadata `source` of the checkpoints `update_state` writes (`fork`: as `__copy__`)."""


def _updated(metadata_json: bytes) -> bool:
    try:
        metadata = orjson.loads(metadata_json)
    except orjson.JSONDecodeError:
        return False
    return isinstance(metadata, dict) and metadata.get("source") in ASKED_SOURCES


@dataclass(frozen=True, slots=True)
class Refusal:
    """A put or writes the rule refused (`graphledger.ownership`): never applied."""

    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    event_type: str
    reason: str
    cause: str
    """`ownership.SUPERSEDED` or `ownership.THREAD_CHANGED`."""
    superseded_by: bytes | None
    topic: str
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class DeleteThreads:
    """Consecutive `thread.delete` / prune `delete` events: deletions commute, so one statement."""

    thread_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class StageCopy:
    """`thread.copy`: the source's rows as they are here, staged under the copy record's position."""

    source: str
    target: str
    topic: str
    partition: int
    offset: int
    ts_ms: int | None = None
    source_erased_later: bool = False


@dataclass(frozen=True, slots=True)
class ApplyCopy:
    """`thread.copy.barrier`: the stage of the copy at `copy_partition`, `copy_offset` (of `topic`) into the
    target, on the barrier's own partition."""

    target: str
    topic: str
    partition: int
    copy_partition: int
    copy_offset: int
    ts_ms: int | None = None


@dataclass(frozen=True, slots=True)
class PruneKeepLatest:
    thread_id: str
    topic: str
    partition: int
    keep: int = 1


@dataclass(frozen=True, slots=True)
class ExpireThread:
    """`thread.expire`: delete the thread if it is still idle at the cutoff."""

    thread_id: str
    idle_before_ms: int


@dataclass(frozen=True, slots=True)
class DeleteRuns:
    run_ids: tuple[str, ...]
    topic: str
    partition: int
    within_threads: tuple[str, ...] | None = None
    """Only these threads (`TimedCheckpointEvent.within_threads`); None: every thread of the partition."""
    planned_threads: tuple[str, ...] = ()
    """The batch's threads on the partition, whose ledgers the plan keeps (`Plan.ledgers`): the others' are
    changed where they are stored."""


@dataclass(frozen=True, slots=True)
class EraseThread:
    """`thread.erase`: every row of the thread the reference names, and its traces."""

    ref: str


@dataclass(frozen=True, slots=True)
class EraseTenant:
    """`tenant.erase`: every thread of the tenant, and the traces of its thread subjects."""

    tenant: str


Step = (
    DataRun
    | DeleteThreads
    | StageCopy
    | ApplyCopy
    | PruneKeepLatest
    | ExpireThread
    | DeleteRuns
    | EraseThread
    | EraseTenant
)


@dataclass(slots=True)
class _RunBuilder:
    """Accumulates one run of data events, merging duplicate keys as they arrive."""

    checkpoints: dict[tuple[str, str, str], list[Any]] = field(default_factory=dict)
    blobs: dict[tuple[str, str, str, str], tuple[Any, ...]] = field(default_factory=dict)
    writes: dict[tuple[str, str, str, str, int], list[Any]] = field(default_factory=dict)
    threads: dict[str, tuple[str, int, int | None]] = field(default_factory=dict)
    puts: list[Put] = field(default_factory=list)
    events: int = 0

    def touch(self, thread_id: str, topic: str, partition: int, ts_ms: int | None) -> None:
        """The thread's partition, and its newest activity time in the run."""
        seen = self.threads.get(thread_id)
        if seen is not None and seen[2] is not None and (ts_ms is None or seen[2] > ts_ms):
            ts_ms = seen[2]
        self.threads[thread_id] = (topic, partition, ts_ms)

    def put(self, topic: str, partition: int, offset: int, e: CheckpointPut, ts_ms: int | None) -> None:
        self.events += 1
        thread_id, ns = e.thread_id, e.checkpoint_ns
        self.puts.append(
            Put(thread_id, ns, e.checkpoint_id, e.parent_checkpoint_id, topic, partition, offset,
                e.intent is not None, e.metadata_json)
        )  # fmt: skip
        self.touch(thread_id, topic, partition, ts_ms)
        key = (thread_id, ns, e.checkpoint_id)
        row = self.checkpoints.get(key)
        if row is None:
            self.checkpoints[key] = [
                thread_id, ns, e.checkpoint_id, e.parent_checkpoint_id,
                e.checkpoint_json.decode(), e.metadata_json.decode(),
            ]  # fmt: skip
        else:
            row[4] = e.checkpoint_json.decode()
            row[5] = e.metadata_json.decode()
        blobs = self.blobs
        for b in e.blobs:
            bkey = (thread_id, ns, b.channel, b.version)
            if bkey not in blobs:
                blobs[bkey] = (thread_id, ns, b.channel, b.version, b.type, b.data)

    def put_writes(self, topic: str, partition: int, e: CheckpointWrites, ts_ms: int | None) -> None:
        self.events += 1
        thread_id, ns, cid, task_id = e.thread_id, e.checkpoint_ns, e.checkpoint_id, e.task_id
        self.touch(thread_id, topic, partition, ts_ms)
        writes = self.writes
        for w in e.writes:
            key = (thread_id, ns, cid, task_id, w.idx)
            row = writes.get(key)
            if row is None:
                writes[key] = [thread_id, ns, cid, task_id, e.task_path, w.idx, w.channel, w.type, w.data, e.upsert]
            elif e.upsert:
                # The upsert replaces channel, type and blob; task_path stays the first insert's.
                row[6], row[7], row[8], row[9] = w.channel, w.type, w.data, True

    def drop_writes_of(self, thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> None:
        """Leave out the run's writes of a checkpoint whose put the rule refused (its writer's, by then)."""
        if (thread_id, checkpoint_ns, checkpoint_id) in self.checkpoints:
            return  # put and counted earlier in the run: a refused copy of it takes nothing away
        self.writes = {k: row for k, row in self.writes.items() if k[:3] != (thread_id, checkpoint_ns, checkpoint_id)}

    def build(self) -> DataRun:
        inserts = [r[:9] for r in self.writes.values() if not r[9]]
        upserts = [r[:9] for r in self.writes.values() if r[9]]
        return DataRun(
            list(self.checkpoints.values()),
            list(self.blobs.values()),
            inserts,
            upserts,
            columns(((t, *tp) for t, tp in self.threads.items()), 4),
            self.events,
            self.puts,
        )


def columns(rows: Any, width: int) -> list[list[Any]]:
    """Rows to column lists (what `unnest($1::t[], $2::u[], ...)` takes)."""
    cols = [list(c) for c in zip(*rows, strict=True)]
    return cols or [[] for _ in range(width)]


@dataclass(frozen=True, slots=True)
class Plan:
    """A batch cut into steps, with what the rule decided (`graphledger.ownership`)."""

    steps: list[Step]
    refusals: list[Refusal]
    ledgers: dict[str, Ledger[str]]
    """The rule's state after the batch of each thread it changed (written back after the steps)."""
    partitions: dict[str, int]
    """The partition each thread the batch names is on (a thread's records share one)."""


def plan_batch(items: Sequence[BatchItem], ledgers: Mapping[str, Ledger[str]] | None = None) -> Plan:
    """Cut a batch into set-based data runs and ordered barrier operations, deciding by the rule which puts
    and writes count from `ledgers` (each thread's state before the batch; missing: none known, no
    operations and every namespace open). Pure."""
    steps: list[Step] = []
    run: _RunBuilder | None = None
    deletes: list[str] = []
    before = dict(ledgers or {})
    now: dict[str, Ledger[str]] = {}
    refusals: list[Refusal] = []
    partitions = {thread_id: p for _, p, _, item in items if (thread_id := thread_of(item)) is not None}

    def ledger(thread_id: str) -> Ledger[str]:
        return now.get(thread_id) or before.get(thread_id) or Ledger()

    def operation(thread_id: str) -> None:
        now[thread_id] = ownership.operation(ledger(thread_id))

    def refuse(event: CheckpointPut | CheckpointWrites, refused: Refused, at: tuple[str, int, int]) -> None:
        names = (event.thread_id, event.checkpoint_ns, event.checkpoint_id, event.TYPE)
        refusals.append(Refusal(*names, refused.reason, refused.cause, refused.superseded_by, *at))

    def flush() -> None:
        nonlocal run
        if run is not None:
            steps.append(run.build())
            run = None
        if deletes:
            steps.append(DeleteThreads(tuple(dict.fromkeys(deletes))))
            deletes.clear()

    def data_run() -> _RunBuilder:
        """The run a put or writes event joins, after the deletions before it."""
        nonlocal run
        if deletes:
            flush()
        if run is None:
            run = _RunBuilder()
        return run

    def delete(thread_id: str) -> None:
        """A deletion joins the others after the run before it (deletions commute with each other)."""
        if run is not None:
            flush()
        deletes.append(thread_id)

    def barrier(step: Step | None) -> None:
        """An operation that depends on the rows it finds: after everything before it."""
        flush()
        if step is not None:
            steps.append(step)

    for topic, partition, offset, item in items:
        event, ts_ms = (item.event, item.ts_ms) if isinstance(item, TimedCheckpointEvent) else (item, None)
        match event:
            case ThreadCopyBarrier():
                # The batch applier held it until the copy had applied (staged). Keyed by the target, it
                # travels on the target's partition: the copy lands among the target's records, in order.
                target, at = event.target_thread_id, (event.source_partition, event.source_offset)
                operation(target)
                barrier(ApplyCopy(target, topic, partition, *at, ts_ms))
            case CheckpointPut():
                intent = _intent(event.intent)
                run_id = _run_of(event) if intent is not None else None
                after, verdict = ownership.put(
                    ledger(event.thread_id), event.checkpoint_ns, intent, run_id, event.checkpoint_id
                )
                match verdict:
                    case Counted():
                        now[event.thread_id] = after
                        data_run().put(topic, partition, offset, event, ts_ms)
                    case Refused():
                        refuse(event, verdict, (topic, partition, offset))
                        if run is not None:
                            run.drop_writes_of(event.thread_id, event.checkpoint_ns, event.checkpoint_id)
                    case _:
                        assert_never(verdict)
            case CheckpointWrites():
                intent = _intent(event.intent)
                verdict = ownership.writes(ledger(event.thread_id), event.checkpoint_ns, intent, event.checkpoint_id)
                match verdict:
                    case Counted():
                        data_run().put_writes(topic, partition, event, ts_ms)
                    case Refused():
                        refuse(event, verdict, (topic, partition, offset))
                    case _:
                        assert_never(verdict)
            case ThreadDelete() | ThreadPrune(strategy="delete"):
                operation(event.thread_id)
                delete(event.thread_id)
            case ThreadPrune():
                barrier(PruneKeepLatest(event.thread_id, topic, partition, event.keep))
            case ThreadCopy():
                source, target = event.source_thread_id, event.target_thread_id
                erased_later = isinstance(item, TimedCheckpointEvent) and item.source_erased_later
                barrier(StageCopy(source, target, topic, partition, offset, ts_ms, erased_later))
                if event.at_record:  # written before copies landed at their barrier: it lands here, as then
                    operation(target)
                    barrier(ApplyCopy(target, topic, partition, partition, offset, ts_ms))
            case ThreadExpire():
                operation(event.thread_id)  # whether or not the thread was idle: its writers cannot tell
                barrier(ExpireThread(event.thread_id, event.idle_before_ms))
            case RunsDelete():
                within = item.within_threads if isinstance(item, TimedCheckpointEvent) else None
                changes = event.run_ids and (within is None or within)
                for thread_id in (
                    t for t, p in partitions.items() if p == partition and (within is None or t in within)
                ):
                    if (runs_deleted := ownership.runs_deleted(ledger(thread_id), event.run_ids)) != ledger(thread_id):
                        now[thread_id] = runs_deleted
                batch_threads = tuple(t for t, p in partitions.items() if p == partition)
                barrier(DeleteRuns(event.run_ids, topic, partition, within, batch_threads) if changes else None)
            case ThreadErase():
                barrier(EraseThread(event.ref))
            case TenantErase():
                barrier(EraseTenant(event.tenant))
            case _:
                assert_never(event)
    flush()
    changed = {thread_id: state for thread_id, state in now.items() if state != before.get(thread_id, Ledger())}
    return Plan(steps, refusals, changed, partitions)


def _intent(raw: bytes | None) -> Intent | None:
    """The intent a validated event carries (`opening/checkpoint_events.py` parsed it once already)."""
    return None if raw is None else Intent.parse(raw)


def _run_of(event: CheckpointPut) -> str | None:
    """The put's metadata `run_id` as `runs.delete` matches it (`metadata ->> 'run_id'`); None: none, or
    one whose text the fold does not reproduce (`folds.thread.run_id_text`), never matched."""
    run = run_of(event)
    return run if isinstance(run, str) else None


def thread_of(item: CheckpointEvent | TimedCheckpointEvent) -> str | None:
    """The thread whose records carry the event (`key`), None for one of every thread or of none."""
    event = item.event if isinstance(item, TimedCheckpointEvent) else item
    return event.key if isinstance(event, ThreadEvent) else None


def find_forks(puts: Sequence[Put], newest: dict[tuple[str, str], str | None]) -> list[Fork]:
    """The puts whose parent is not their namespace's newest checkpoint, applying them in order from
    `newest` (the namespaces' newest ids before them; None: no checkpoint yet). Pure.

    A namespace's first checkpoint and a put of the newest id again (an update of it) are no forks.
    """
    newest = dict(newest)
    forks = []
    for put in puts:
        scope = (put.thread_id, put.checkpoint_ns)
        current = newest.get(scope)
        if current is not None and put.checkpoint_id != current and put.parent_checkpoint_id != current:
            forks.append(Fork(put, current))
        newest[scope] = put.checkpoint_id if current is None else max(current, put.checkpoint_id)
    return forks
