"""The checkpoint projection: the planned steps of a batch applied in the caller's transaction.

Each `DataRun` goes as one `INSERT ... SELECT FROM unnest(...)` per table (`checkpoint_sql.py`), so a
batch of thousands of events costs a handful of round trips; every other step applies on its own, in
order (`checkpoint_plan.py`).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any, assert_never

import asyncpg

from graphledger.events.checkpoint import CheckpointPut, ThreadCopyBarrier
from graphledger.events.envelope import Envelope
from graphledger.opening import checkpoint_events
from graphledger.opening.checkpoint_events import TimedCheckpointEvent
from graphledger.ownership import Ledger
from graphledger.tenancy import THREAD_SEPARATOR
from graphledger_server.projection import erasure, prune
from graphledger_server.projection.checkpoint_plan import (
    ApplyCopy,
    BatchItem,
    DataRun,
    DeleteRuns,
    DeleteThreads,
    EraseTenant,
    EraseThread,
    ExpireThread,
    Fork,
    Plan,
    PruneKeepLatest,
    StageCopy,
    Step,
    columns,
    find_forks,
    plan_batch,
    thread_of,
)
from graphledger_server.projection.checkpoint_sql import CheckpointStatements, RowInsert
from graphledger_server.projection.report import ApplyReport

log = logging.getLogger(__name__)
PUT = CheckpointPut.TYPE
STAGED_FROM_ROWS = 256
"""Rows of one table in a run from which they go by COPY (`checkpoint_sql.BATCH_TABLES_SQL`): below, the two
round trips cost more than encoding the arrays saves."""


async def apply_steps(conn: asyncpg.Connection, sql: CheckpointStatements, steps: Sequence[Step]) -> list[Fork]:
    """Apply planned steps in order on `conn`, inside the caller's transaction; returns the forks found."""
    forks: list[Fork] = []
    for step in steps:
        match step:
            case DataRun():
                forks.extend(await _apply_run(conn, sql, step))
            case DeleteThreads():
                await conn.execute(sql.delete_threads, list(step.thread_ids))
            case StageCopy():
                await conn.execute(
                    sql.stage_copy, step.source, step.target, step.topic, step.partition, step.offset, step.ts_ms
                )
                await conn.execute(sql.record_copy, step.source, step.target, step.source_erased_later)
            case ApplyCopy():
                staged = await conn.fetchval(
                    sql.apply_copy, step.topic, step.copy_partition, step.copy_offset, step.target, step.partition,
                    step.ts_ms,
                )  # fmt: skip
                if not staged:
                    log.info(
                        "the copy barrier of thread %r on %s:%d found no stage of its copy at %s:%d@%d: the copy's "
                        "record staged nothing (dead-lettered, or skipped as erased)",
                        step.target, step.topic, step.partition, step.topic, step.copy_partition, step.copy_offset,
                    )  # fmt: skip
            case PruneKeepLatest():
                await conn.execute(
                    sql.upsert_thread_partitions, [step.thread_id], [step.topic], [step.partition], [None]
                )
                freed = await prune.keep_latest(conn, sql.prune, step.thread_id, step.keep)
                await gc_blobs(conn, sql, freed)
            case ExpireThread():
                if await conn.fetchval(sql.thread_idle, step.thread_id, step.idle_before_ms):
                    await conn.execute(sql.delete_threads, [step.thread_id])
            case DeleteRuns():
                within = None if step.within_threads is None else list(step.within_threads)
                runs, at = list(step.run_ids), (step.topic, step.partition)
                await conn.execute(sql.open_deleted_runs, runs, *at, within, list(step.planned_threads))
                rows = await conn.fetch(sql.delete_runs, runs, *at, within)
                await gc_blobs(conn, sql, [tuple(r) for r in rows])
            case EraseThread():
                names = await erasure.names_of(conn, sql.erasure, "thread", [step.ref])
                if names:
                    await conn.execute(sql.erase_threads, [name for name, _ in names])
                    await conn.execute(sql.erase_staged_copies, [name for name, _ in names])
                await erasure.delete_traces(conn, sql.erasure, [step.ref])
            case EraseTenant():
                await conn.execute(sql.erase_tenant_threads, step.tenant + THREAD_SEPARATOR)
                await conn.execute(sql.erase_tenant_staged_copies, step.tenant + THREAD_SEPARATOR)
                refs = await erasure.tenant_refs(conn, sql.erasure, "thread", step.tenant)
                await erasure.delete_traces(conn, sql.erasure, refs)
            case _:
                assert_never(step)
    return forks


async def _apply_run(conn: asyncpg.Connection, sql: CheckpointStatements, run: DataRun) -> list[Fork]:
    forks: list[Fork] = []
    if run.puts:
        scopes = list(dict.fromkeys((p.thread_id, p.checkpoint_ns) for p in run.puts))
        rows = await conn.fetch(sql.newest_checkpoints, [t for t, _ in scopes], [ns for _, ns in scopes])
        forks = find_forks(run.puts, {(r["thread_id"], r["checkpoint_ns"]): r["newest"] for r in rows})
    tables = (run.checkpoints, run.blobs, run.writes_insert, run.writes_upsert)
    if any(len(rows) >= STAGED_FROM_ROWS for rows in tables):
        await conn.execute(sql.batch_tables)
    await _insert_rows(conn, sql.upsert_checkpoints, run.checkpoints)
    await _insert_rows(conn, sql.insert_blobs, run.blobs)
    await _insert_rows(conn, sql.insert_writes, run.writes_insert)
    await _insert_rows(conn, sql.upsert_writes, run.writes_upsert)
    if run.threads[0]:
        await conn.execute(sql.upsert_thread_partitions, *run.threads)
    if forks:
        rows = [
            (f.put.thread_id, f.put.checkpoint_ns, f.put.checkpoint_id, f.put.parent_checkpoint_id,
             f.newest_checkpoint_id, f.put.topic, f.put.partition, f.put.offset, f.kind)
            for f in forks
        ]  # fmt: skip
        await conn.execute(sql.insert_forks, *columns(rows, 9))
    return forks


async def _insert_rows(conn: asyncpg.Connection, insert: RowInsert, rows: Sequence[Sequence[Any]]) -> None:
    """`rows` into their table: from `STAGED_FROM_ROWS` on, by COPY into its batch table (created and emptied by
    the caller) and one statement from there; fewer, as arrays in one statement, a round trip less."""
    if not rows:
        return
    if len(rows) < STAGED_FROM_ROWS:
        await conn.execute(insert.arrays, *columns(rows, insert.width))
        return
    await conn.copy_records_to_table(insert.batch, records=rows)
    await conn.execute(insert.staged)


async def read_ledgers(
    conn: asyncpg.Connection, sql: CheckpointStatements, threads: Iterable[str]
) -> dict[str, Ledger[str]]:
    """The rule's state of `threads` as the projection holds it (a thread it knows nothing of is missing)."""
    operations: dict[str, int] = {}
    leads: dict[str, dict[str, bytes]] = {}
    runs: dict[str, dict[str, object]] = {}
    ids: dict[str, dict[str, str]] = {}
    writers: dict[str, dict[str, bytes]] = {}
    for row in await conn.fetch(sql.thread_ledgers, list(threads)):
        thread_id, ns = row["thread_id"], row["checkpoint_ns"]
        if row["operations"] is not None:
            operations[thread_id] = row["operations"]
        if ns is not None:
            leads.setdefault(thread_id, {})[ns] = bytes(row["lead"])
            runs.setdefault(thread_id, {})[ns] = row["lead_run"]
            ids.setdefault(thread_id, {})[ns] = row["lead_id"]
            if row["lead_writer"] is not None:
                writers.setdefault(thread_id, {})[ns] = bytes(row["lead_writer"])
    known = operations.keys() | leads.keys()
    return {
        t: Ledger(operations.get(t, 0), leads.get(t, {}), runs.get(t, {}), ids.get(t, {}), writers.get(t, {}))
        for t in known
    }


async def write_verdicts(conn: asyncpg.Connection, sql: CheckpointStatements, plan: Plan) -> None:
    """What the rule decided, after the plan's steps: the refusals, the writes of refused puts that
    counted before their put, and the ledgers the batch changed."""
    if plan.refusals:
        rows = [
            (r.topic, r.partition, r.offset, r.thread_id, r.checkpoint_ns, r.checkpoint_id, r.event_type, r.reason,
             r.superseded_by)
            for r in plan.refusals
        ]  # fmt: skip
        await conn.execute(sql.insert_refusals, *columns(rows, 9))
        puts = {
            (r.thread_id, r.checkpoint_ns, r.checkpoint_id) for r in plan.refusals if r.event_type == CheckpointPut.TYPE
        }
        if puts:
            await conn.execute(sql.drop_refused_writes, *columns(sorted(puts), 3))
    if plan.ledgers:
        ops = [(thread_id, ledger.operations) for thread_id, ledger in plan.ledgers.items()]
        leads = [
            (
                thread_id,
                ns,
                lead,
                ledger.lead_ids[ns],
                run if isinstance(run := ledger.lead_runs.get(ns), str) else None,
                ledger.lead_writers.get(ns),
            )
            for thread_id, ledger in plan.ledgers.items()
            for ns, lead in ledger.leads.items()
        ]
        await conn.execute(sql.write_ledgers, *columns(ops, 2), *columns(leads, 6))


async def gc_blobs(
    conn: asyncpg.Connection, sql: CheckpointStatements, freed: Sequence[tuple[str, str, str, str]]
) -> None:
    """Delete the freed `(thread_id, checkpoint_ns, channel, version)` blobs no checkpoint references."""
    if freed:
        await conn.execute(sql.gc_blobs, *columns(freed, 4))


class CheckpointProjection:
    """The checkpoint topic's projection, as the batch applier drives it."""

    def __init__(self, schema: str) -> None:
        self.sql = CheckpointStatements(schema)

    async def prepare(self, conn: asyncpg.Connection) -> None:
        """Nothing to read: checkpoint events are checked against no schema state."""

    def to_event(self, env: Envelope, appended_ms: int) -> TimedCheckpointEvent:
        return checkpoint_events.to_event(env, appended_ms)

    def requires(self, event: TimedCheckpointEvent) -> tuple[int, int] | None:
        """A copy barrier applies once the copy's record (partition, offset of this topic) has: its stage
        is committed then (or there is none: the copy was dead-lettered or skipped as erased)."""
        match event.event:
            case ThreadCopyBarrier(source_partition=partition, source_offset=offset):
                return partition, offset
            case _:
                return None

    async def apply(self, conn: asyncpg.Connection, items: Sequence[BatchItem]) -> ApplyReport:
        threads = {thread_id for _, _, _, item in items if (thread_id := thread_of(item)) is not None}
        plan = plan_batch(items, await read_ledgers(conn, self.sql, threads) if threads else {})
        forks = await apply_steps(conn, self.sql, plan.steps)
        await write_verdicts(conn, self.sql, plan)
        for r in plan.refusals:
            log.warning(
                "refused %s on thread %r namespace %r, checkpoint %s (%s:%d@%d): %s",
                r.event_type, r.thread_id, r.checkpoint_ns, r.checkpoint_id, r.topic, r.partition, r.offset, r.reason,
            )  # fmt: skip
        for f in forks:
            p = f.put
            why = (
                "a branch its writer asked for" if f.kind == "branch" else "a writer outside the rule, or a direct put"
            )
            log.warning(
                "%s on thread %r namespace %r: checkpoint %s has parent %s, but the newest checkpoint was %s "
                "(%s:%d@%d): %s",
                f.kind, p.thread_id, p.checkpoint_ns, p.checkpoint_id, p.parent_checkpoint_id, f.newest_checkpoint_id,
                p.topic, p.partition, p.offset, why,
            )  # fmt: skip
        return ApplyReport(
            forks=sum(1 for f in forks if f.kind == "fork"),
            branches=sum(1 for f in forks if f.kind == "branch"),
            refusals=Counter(r.cause for r in plan.refusals),
        )
