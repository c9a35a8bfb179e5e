"""The checkpoint projection: SQL as named constants, pure batch planning, and the batch apply.

A batch is a list of `(topic, partition, offset, event)` in log order. Planning (pure) cuts it into
steps: a run of consecutive data events (`checkpoint.put`, `checkpoint.writes`) becomes one
`DataRun` with one array parameter set per table, deduplicated here with the semantics that applying
the events one by one would have; every other event is a barrier applied on its own, in order. A copy
is two of them: its record stages the source's rows (`StageCopy`), its barrier, on the target's
partition, moves them into the target (`ApplyCopy`).
Applying (I/O) sends each `DataRun` as one `INSERT ... SELECT FROM unnest(...)` per table, so a
batch of thousands of events costs a handful of round trips.

Checkpoint and metadata JSON arrive as JSON text and go to Postgres as `text` cast to `jsonb`:
never parsed here.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, assert_never

import asyncpg

from graphledger.events.checkpoint import (
    CheckpointEvent,
    CheckpointPut,
    CheckpointWrites,
    RunsDelete,
    ThreadCopy,
    ThreadCopyBarrier,
    ThreadDelete,
    ThreadExpire,
    ThreadPrune,
)
from graphledger.events.envelope import Envelope
from graphledger.events.erasure import TenantErase, ThreadErase
from graphledger.tenancy import THREAD_SEPARATOR
from graphledger_server.opening import checkpoint_events
from graphledger_server.opening.checkpoint_events import TimedCheckpointEvent
from graphledger_server.projection import erasure, prune
from graphledger_server.projection.report import ApplyReport
from graphledger_server.sql import render

log = logging.getLogger(__name__)


BatchItem = tuple[str, int, int, CheckpointEvent | TimedCheckpointEvent]
"""`(topic, partition, offset, event)`: one event at its position in the log (untimed events, as
tests build them, record no thread activity)."""

# --- data runs --------------------------------------------------------------------------------------

# Like the official UPSERT_CHECKPOINTS_SQL: a repeated put replaces checkpoint and metadata only.
# $1..$6 -> unnest(thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint, metadata);
# the JSON columns arrive as text and are cast to jsonb here. Keys are unique (deduplicated in Python):
# ON CONFLICT DO UPDATE cannot touch one row twice in a statement.
UPSERT_CHECKPOINTS_SQL = """
INSERT INTO {schema}.checkpoints
    (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint, metadata)
SELECT u.thread_id, u.checkpoint_ns, u.checkpoint_id, u.parent_checkpoint_id, u.checkpoint::jsonb, u.metadata::jsonb
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[])
    AS u(thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint, metadata)
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id) DO UPDATE SET
    checkpoint = EXCLUDED.checkpoint,
    metadata = EXCLUDED.metadata
"""

# Like UPSERT_CHECKPOINT_BLOBS_SQL: a channel version's value never changes, the first one stays.
# $1..$6 -> unnest(thread_id, checkpoint_ns, channel, version, type, blob).
INSERT_BLOBS_SQL = """
INSERT INTO {schema}.checkpoint_blobs (thread_id, checkpoint_ns, channel, version, type, blob)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bytea[])
ON CONFLICT (thread_id, checkpoint_ns, channel, version) DO NOTHING
"""

# INSERT_CHECKPOINT_WRITES_SQL / UPSERT_CHECKPOINT_WRITES_SQL, set-based.
# $1..$9 -> unnest(thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob).
INSERT_WRITES_SQL = """
INSERT INTO {schema}.checkpoint_writes
    (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::int[], $7::text[],
                     $8::text[], $9::bytea[])
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO NOTHING
"""

UPSERT_WRITES_SQL = """
INSERT INTO {schema}.checkpoint_writes
    (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::int[], $7::text[],
                     $8::text[], $9::bytea[])
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO UPDATE SET
    channel = EXCLUDED.channel,
    type = EXCLUDED.type,
    blob = EXCLUDED.blob
"""

# How an insert into graphledger_thread_partitions (aliased `tp`) meets an existing row: the thread's
# partition is the newest, its activity the greatest ever seen (null: none yet).
MERGE_THREAD_ACTIVITY_SQL = """
ON CONFLICT (thread_id) DO UPDATE SET
    topic = EXCLUDED.topic,
    partition = EXCLUDED.partition,
    last_active_at = greatest(tp.last_active_at, EXCLUDED.last_active_at)
WHERE (tp.topic, tp.partition) IS DISTINCT FROM (EXCLUDED.topic, EXCLUDED.partition)
   OR EXCLUDED.last_active_at > tp.last_active_at
   OR (tp.last_active_at IS NULL AND EXCLUDED.last_active_at IS NOT NULL)
"""

# $1..$4 -> unnest(thread_id, topic, partition, ts_ms): ts_ms is the newest time (the broker's, at each
# event's first append) of the thread's events in the run (null: no activity, e.g. a prune), kept as the
# greatest ever seen, so a replay in any batching writes the same value. The WHERE skips rewriting
# unchanged rows, which would otherwise leave a dead tuple per thread per batch.
UPSERT_THREAD_PARTITIONS_SQL = (
    """
INSERT INTO {schema}.graphledger_thread_partitions AS tp (thread_id, topic, partition, last_active_at)
SELECT u.thread_id, u.topic, u.partition, 'epoch'::timestamptz + u.ts_ms * interval '1 millisecond'
FROM unnest($1::text[], $2::text[], $3::int[], $4::bigint[]) AS u(thread_id, topic, partition, ts_ms)
"""
    + MERGE_THREAD_ACTIVITY_SQL
)

# thread.expire: whether the thread is still idle at the sweeper's cutoff (no activity after it).
# $1 -> thread id, $2 cutoff ms.
THREAD_IDLE_SQL = """
SELECT EXISTS (
    SELECT 1 FROM {schema}.graphledger_thread_partitions
    WHERE thread_id = $1::text
      AND last_active_at <= 'epoch'::timestamptz + $2::bigint * interval '1 millisecond'
)
"""

# --- forks ------------------------------------------------------------------------------------------

# The newest checkpoint id of each thread namespace a run puts into, before the run applies (max, as the
# official saver's latest-first order has it). $1/$2 -> unnest(thread_id, checkpoint_ns).
NEWEST_CHECKPOINTS_SQL = """
SELECT u.thread_id, u.checkpoint_ns,
       (SELECT max(c.checkpoint_id) FROM {schema}.checkpoints c
        WHERE c.thread_id = u.thread_id AND c.checkpoint_ns = u.checkpoint_ns) AS newest
FROM unnest($1::text[], $2::text[]) AS u(thread_id, checkpoint_ns)
"""

# After the run applied: one row per fork, with the put's metadata source.
# $1..$8 -> unnest(thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, newest_checkpoint_id,
# topic, partition, offset).
INSERT_FORKS_SQL = """
INSERT INTO {schema}.graphledger_forks
    (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, newest_checkpoint_id, source, topic,
     partition, "offset")
SELECT u.thread_id, u.checkpoint_ns, u.checkpoint_id, u.parent_checkpoint_id, u.newest, c.metadata ->> 'source',
       u.topic, u.partition, u."offset"
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::int[], $8::bigint[])
    AS u(thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, newest, topic, partition, "offset")
LEFT JOIN {schema}.checkpoints c
    ON c.thread_id = u.thread_id AND c.checkpoint_ns = u.checkpoint_ns AND c.checkpoint_id = u.checkpoint_id
ON CONFLICT (topic, partition, "offset") DO NOTHING
"""

# --- operations -------------------------------------------------------------------------------------

# delete_thread (and prune "delete"): every namespace of every listed thread. $1 -> thread ids.
# The partition row goes too: a thread without rows needs no routing of `runs.delete`.
DELETE_THREADS_SQL = """
WITH c AS (DELETE FROM {schema}.checkpoints WHERE thread_id = ANY($1::text[])),
     b AS (DELETE FROM {schema}.checkpoint_blobs WHERE thread_id = ANY($1::text[])),
     w AS (DELETE FROM {schema}.checkpoint_writes WHERE thread_id = ANY($1::text[]))
DELETE FROM {schema}.graphledger_thread_partitions WHERE thread_id = ANY($1::text[])
"""

# copy_thread, in two steps (docs/architecture.md, "copy_thread"). The copy's record, on the source's
# partition, stages the source's rows as they are at its place in the source's log, under the record's
# position; the copy's barrier, on the target's partition, moves them into the target. So the copy applies
# to the target among the target's own records, in their log order, whichever partition the projector
# reaches first; the barrier waits for the stage (`CheckpointProjection.holds`).

# thread.copy: the stage. A copy onto itself stages no rows (it would change nothing at its barrier, and
# the official saver's rule for it is none). The source is recorded on the partition that carried this
# event (its own); the target is not touched here. A stage already there (a redelivery) stays.
# $1 source, $2 target, $3 topic, $4 partition, $5 offset (the copy's record), $6 its time (ms, null: none).
STAGE_COPY_SQL = (
    """
WITH stage AS (
    INSERT INTO {schema}.graphledger_copy_stages
        (topic, partition, "offset", source_thread_id, target_thread_id, copied_at)
    VALUES ($3::text, $4::int, $5::bigint, $1::text, $2::text,
            'epoch'::timestamptz + $6::bigint * interval '1 millisecond')
    ON CONFLICT DO NOTHING
), c AS (
    INSERT INTO {schema}.graphledger_staged_checkpoints
        (topic, partition, "offset", checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint, metadata)
    SELECT $3::text, $4::int, $5::bigint, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint,
           metadata
    FROM {schema}.checkpoints WHERE thread_id = $1::text AND $1::text <> $2::text
    ON CONFLICT DO NOTHING
), b AS (
    INSERT INTO {schema}.graphledger_staged_blobs
        (topic, partition, "offset", checkpoint_ns, channel, version, type, blob)
    SELECT $3::text, $4::int, $5::bigint, checkpoint_ns, channel, version, type, blob
    FROM {schema}.checkpoint_blobs WHERE thread_id = $1::text AND $1::text <> $2::text
    ON CONFLICT DO NOTHING
), w AS (
    INSERT INTO {schema}.graphledger_staged_writes
        (topic, partition, "offset", checkpoint_ns, checkpoint_id, task_id, idx, channel, type, blob, task_path)
    SELECT $3::text, $4::int, $5::bigint, checkpoint_ns, checkpoint_id, task_id, idx, channel, type, blob, task_path
    FROM {schema}.checkpoint_writes WHERE thread_id = $1::text AND $1::text <> $2::text
    ON CONFLICT DO NOTHING
)
INSERT INTO {schema}.graphledger_thread_partitions AS tp (thread_id, topic, partition, last_active_at)
VALUES ($1::text, $3::text, $4::int, NULL::timestamptz)
"""
    + MERGE_THREAD_ACTIVITY_SQL
)

# thread.copy.barrier: the stage of the copy it names (with this target: a barrier moves no other
# thread's stage) into the target, keeping whatever the target has by now, as a copy onto a thread with
# rows always did; then the stage goes. Taking the stage's rows with DELETE ... RETURNING moves each row
# once, even against a tenant's erasure on another partition deleting them at the same time (the row
# lock decides). The target is recorded on this partition (its own), active at the later of the copy's
# time and the barrier's (the barrier's alone when no stage is left). Answers whether a stage was there:
# none is left only when the copy's record staged nothing (dead-lettered, or skipped as erased).
# $1 topic, $2 the copy record's partition, $3 its offset, $4 target, $5 this partition, $6 this
# record's time (ms, null: none).
APPLY_COPY_SQL = (
    """
WITH stage AS (
    DELETE FROM {schema}.graphledger_copy_stages
    WHERE topic = $1::text AND partition = $2::int AND "offset" = $3::bigint AND target_thread_id = $4::text
    RETURNING copied_at
), c AS (
    DELETE FROM {schema}.graphledger_staged_checkpoints s USING stage
    WHERE s.topic = $1::text AND s.partition = $2::int AND s."offset" = $3::bigint
    RETURNING s.checkpoint_ns, s.checkpoint_id, s.parent_checkpoint_id, s.type, s.checkpoint, s.metadata
), b AS (
    DELETE FROM {schema}.graphledger_staged_blobs s USING stage
    WHERE s.topic = $1::text AND s.partition = $2::int AND s."offset" = $3::bigint
    RETURNING s.checkpoint_ns, s.channel, s.version, s.type, s.blob
), w AS (
    DELETE FROM {schema}.graphledger_staged_writes s USING stage
    WHERE s.topic = $1::text AND s.partition = $2::int AND s."offset" = $3::bigint
    RETURNING s.checkpoint_ns, s.checkpoint_id, s.task_id, s.task_path, s.idx, s.channel, s.type, s.blob
), ci AS (
    INSERT INTO {schema}.checkpoints
        (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint, metadata)
    SELECT $4::text, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint, metadata FROM c
    ON CONFLICT DO NOTHING
), bi AS (
    INSERT INTO {schema}.checkpoint_blobs (thread_id, checkpoint_ns, channel, version, type, blob)
    SELECT $4::text, checkpoint_ns, channel, version, type, blob FROM b
    ON CONFLICT DO NOTHING
), wi AS (
    INSERT INTO {schema}.checkpoint_writes
        (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob)
    SELECT $4::text, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob FROM w
    ON CONFLICT DO NOTHING
), active AS (
    INSERT INTO {schema}.graphledger_thread_partitions AS tp (thread_id, topic, partition, last_active_at)
    SELECT $4::text, $1::text, $5::int,
           greatest((SELECT copied_at FROM stage), 'epoch'::timestamptz + $6::bigint * interval '1 millisecond')
"""
    + MERGE_THREAD_ACTIVITY_SQL
    + """
)
SELECT EXISTS (SELECT 1 FROM stage) AS staged
"""
)

# A copy's lineage, for erasing the source's copies with it: recorded with the stage, in the source's
# log order, so an erasure of the source that follows the copy there finds it, whether or not the
# barrier has moved the stage yet. Only when the copy copied something (a source with no rows, erased
# among them, leaves nothing of it in the target, which a later erasure of the source must then spare),
# or when the source was erased only after the copy ($3: the projector met the source's records after
# its key was destroyed, so it holds nothing of what the copy copied).
# $1 source, $2 target, $3 the source was erased after the copy.
RECORD_COPY_SQL = """
INSERT INTO {schema}.graphledger_thread_copies (source_thread_id, target_thread_id)
SELECT $1::text, $2::text
WHERE $1::text <> $2::text
  AND ($3::bool OR EXISTS (SELECT 1 FROM {schema}.checkpoints WHERE thread_id = $1::text)
       OR EXISTS (SELECT 1 FROM {schema}.checkpoint_writes WHERE thread_id = $1::text))
ON CONFLICT DO NOTHING
"""

# Erasure: everything of the listed threads ($1 -> thread ids), forks included, and their lineage as
# copies. Their lineage as sources stays: the eraser reads it once this applied, to erase each copy
# (whose erasure then drops that row). A dropped row S -> T (T erased) passes T's copies on to S first:
# S -> U for each T -> U, so an erase of S asked again after an attempt that erased T and failed before
# U (`ErasureIncompleteError`) still finds U, which holds S's rows through T. The lineage left once every
# copy is erased is the same: U's erasure drops S -> U with T -> U. (None S -> S: a thread is no copy of itself.)
ERASE_THREADS_SQL = """
WITH c AS (DELETE FROM {schema}.checkpoints WHERE thread_id = ANY($1::text[])),
     b AS (DELETE FROM {schema}.checkpoint_blobs WHERE thread_id = ANY($1::text[])),
     w AS (DELETE FROM {schema}.checkpoint_writes WHERE thread_id = ANY($1::text[])),
     p AS (DELETE FROM {schema}.graphledger_thread_partitions WHERE thread_id = ANY($1::text[])),
     f AS (DELETE FROM {schema}.graphledger_forks WHERE thread_id = ANY($1::text[])),
     l AS (
         INSERT INTO {schema}.graphledger_thread_copies (source_thread_id, target_thread_id)
         SELECT s.source_thread_id, t.target_thread_id
         FROM {schema}.graphledger_thread_copies s
         JOIN {schema}.graphledger_thread_copies t ON t.source_thread_id = s.target_thread_id
         WHERE s.target_thread_id = ANY($1::text[])
           AND t.target_thread_id <> ALL($1::text[])
           AND s.source_thread_id <> t.target_thread_id
         ON CONFLICT DO NOTHING
     )
DELETE FROM {schema}.graphledger_thread_copies WHERE target_thread_id = ANY($1::text[])
"""
# Erasure of a tenant: every thread whose stored id starts with $1 (`<tenant>/`; starts_with, not
# LIKE, as a tenant name may hold `_`).
ERASE_TENANT_THREADS_SQL = """
WITH c AS (DELETE FROM {schema}.checkpoints WHERE starts_with(thread_id, $1::text)),
     b AS (DELETE FROM {schema}.checkpoint_blobs WHERE starts_with(thread_id, $1::text)),
     w AS (DELETE FROM {schema}.checkpoint_writes WHERE starts_with(thread_id, $1::text)),
     p AS (DELETE FROM {schema}.graphledger_thread_partitions WHERE starts_with(thread_id, $1::text)),
     f AS (DELETE FROM {schema}.graphledger_forks WHERE starts_with(thread_id, $1::text))
DELETE FROM {schema}.graphledger_thread_copies
WHERE starts_with(source_thread_id, $1::text) OR starts_with(target_thread_id, $1::text)
"""

# The copies in flight an erasure drops: the stages matching {where}, with their staged rows.
_DROP_STAGES_SQL = """
WITH erased AS (
    SELECT topic, partition, "offset" FROM {schema}.graphledger_copy_stages WHERE {where}
), c AS (
    DELETE FROM {schema}.graphledger_staged_checkpoints s USING erased e
    WHERE (s.topic, s.partition, s."offset") = (e.topic, e.partition, e."offset")
), b AS (
    DELETE FROM {schema}.graphledger_staged_blobs s USING erased e
    WHERE (s.topic, s.partition, s."offset") = (e.topic, e.partition, e."offset")
), w AS (
    DELETE FROM {schema}.graphledger_staged_writes s USING erased e
    WHERE (s.topic, s.partition, s."offset") = (e.topic, e.partition, e."offset")
)
DELETE FROM {schema}.graphledger_copy_stages WHERE {where}
"""
# Erasure of threads ($1 -> thread ids): the stages into an erased thread (whose barriers, sealed with its
# key, are skipped from now on). A stage from an erased thread stays: the copy's lineage names its target
# (`RECORD_COPY_SQL`, at the copy's record), which the eraser erases next, dropping the stage, as it
# erases the rows an earlier copy landed there. So what a copy lands does not depend on whether the
# source's erasure applied before its barrier or after.
ERASE_STAGED_COPIES_SQL = _DROP_STAGES_SQL.replace("{where}", "target_thread_id = ANY($1::text[])")
# The same for a tenant: every stage whose source or target starts with $1 (`<tenant>/`; a tenant's
# erasure follows no lineage, and its threads are all erased at once).
ERASE_TENANT_STAGED_COPIES_SQL = _DROP_STAGES_SQL.replace(
    "{where}", "(starts_with(source_thread_id, $1::text) OR starts_with(target_thread_id, $1::text))"
)

# delete_for_runs, one partition's copy: checkpoints of this partition's threads whose metadata
# run_id is listed, with their writes. Returns the channel versions they referenced, so that
# GC_BLOBS_SQL (a second statement, which sees the deletion) can drop the blobs left unreferenced.
# $1 -> run ids, $2 topic, $3 partition, $4 -> thread ids it may change (null: every one).
DELETE_RUNS_SQL = """
WITH deleted AS (
    DELETE FROM {schema}.checkpoints c
    USING {schema}.graphledger_thread_partitions tp
    WHERE tp.topic = $2::text AND tp.partition = $3::int
      AND c.thread_id = tp.thread_id
      AND c.metadata ->> 'run_id' = ANY($1::text[])
      AND ($4::text[] IS NULL OR c.thread_id = ANY($4::text[]))
    RETURNING c.thread_id, c.checkpoint_ns, c.checkpoint_id, c.checkpoint -> 'channel_versions' AS versions
), w AS (
    DELETE FROM {schema}.checkpoint_writes cw
    USING deleted d
    WHERE cw.thread_id = d.thread_id AND cw.checkpoint_ns = d.checkpoint_ns AND cw.checkpoint_id = d.checkpoint_id
)
SELECT DISTINCT d.thread_id, d.checkpoint_ns, v.key AS channel, v.value AS version
FROM deleted d
CROSS JOIN LATERAL jsonb_each_text(d.versions) AS v
"""

# Blobs that deleted checkpoints referenced and no remaining checkpoint of their thread and
# namespace does. $1..$4 -> unnest(thread_id, checkpoint_ns, channel, version) of the freed versions.
# EXCEPT (a hash set operation) rather than a NOT EXISTS per freed blob, which would rescan a
# thread's checkpoints once per blob.
GC_BLOBS_SQL = """
WITH freed AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[])
        AS f(thread_id, checkpoint_ns, channel, version)
), scopes AS (
    SELECT DISTINCT thread_id, checkpoint_ns FROM freed
), referenced AS (
    SELECT c.thread_id, c.checkpoint_ns, v.key AS channel, v.value AS version
    FROM scopes s
    JOIN {schema}.checkpoints c ON c.thread_id = s.thread_id AND c.checkpoint_ns = s.checkpoint_ns
    CROSS JOIN LATERAL jsonb_each_text(c.checkpoint -> 'channel_versions') AS v
), garbage AS (
    SELECT * FROM freed EXCEPT SELECT * FROM referenced
)
DELETE FROM {schema}.checkpoint_blobs b
USING garbage g
WHERE b.thread_id = g.thread_id AND b.checkpoint_ns = g.checkpoint_ns
  AND b.channel = g.channel AND b.version = g.version
"""


# --- plan -------------------------------------------------------------------------------------------


@dataclass(slots=True)
class DataRun:
    """Consecutive put/writes events as column lists, one list per `unnest` parameter.

    Keys are unique within each statement, merged as sequential application would leave them:
    checkpoints keep the first put's parent and the last put's checkpoint and metadata (the upsert
    updates only those two); blobs keep the first value; a write keeps the last upsert's value if
    any event upserted it, else the first insert's.
    """

    checkpoints: list[list[Any]]
    blobs: list[list[Any]]
    writes_insert: list[list[Any]]
    writes_upsert: list[list[Any]]
    threads: list[list[Any]]
    events: int
    puts: list[Put]
    """Every put of the run in log order, for fork detection (`forks`)."""


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


@dataclass(frozen=True, slots=True)
class Fork:
    """A put whose parent was not the namespace's newest checkpoint when it applied."""

    put: Put
    newest_checkpoint_id: str


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
        self.puts.append(Put(thread_id, ns, e.checkpoint_id, e.parent_checkpoint_id, topic, partition, offset))
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

    def build(self) -> DataRun:
        inserts = [r[:9] for r in self.writes.values() if not r[9]]
        upserts = [r[:9] for r in self.writes.values() if r[9]]
        return DataRun(
            _columns(self.checkpoints.values(), 6),
            _columns(self.blobs.values(), 6),
            _columns(inserts, 9),
            _columns(upserts, 9),
            _columns(((t, *tp) for t, tp in self.threads.items()), 4),
            self.events,
            self.puts,
        )


def _columns(rows: Any, width: int) -> list[list[Any]]:
    """Rows to column lists (what `unnest($1::t[], $2::u[], ...)` takes)."""
    cols = [list(c) for c in zip(*rows, strict=True)]
    return cols or [[] for _ in range(width)]


def plan_batch(items: Sequence[BatchItem]) -> list[Step]:
    """Cut a batch into set-based data runs and ordered barrier operations. Pure."""
    steps: list[Step] = []
    run: _RunBuilder | None = None
    deletes: list[str] = []

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
                barrier(ApplyCopy(target, topic, partition, *at, ts_ms))
            case CheckpointPut():
                data_run().put(topic, partition, offset, event, ts_ms)
            case CheckpointWrites():
                data_run().put_writes(topic, partition, event, ts_ms)
            case ThreadDelete() | ThreadPrune(strategy="delete"):
                delete(event.thread_id)
            case ThreadPrune():
                barrier(PruneKeepLatest(event.thread_id, topic, partition, event.keep))
            case ThreadCopy():
                source, target = event.source_thread_id, event.target_thread_id
                erased_later = isinstance(item, TimedCheckpointEvent) and item.source_erased_later
                barrier(StageCopy(source, target, topic, partition, offset, ts_ms, erased_later))
                if event.at_record:  # written before copies landed at their barrier: it lands here, as then
                    barrier(ApplyCopy(target, topic, partition, partition, offset, ts_ms))
            case ThreadExpire():
                barrier(ExpireThread(event.thread_id, event.idle_before_ms))
            case RunsDelete():
                within = item.within_threads if isinstance(item, TimedCheckpointEvent) else None
                changes = event.run_ids and (within is None or within)
                barrier(DeleteRuns(event.run_ids, topic, partition, within) if changes else None)
            case ThreadErase():
                barrier(EraseThread(event.ref))
            case TenantErase():
                barrier(EraseTenant(event.tenant))
            case _:
                assert_never(event)
    flush()
    return steps


# --- apply ------------------------------------------------------------------------------------------


class CheckpointStatements:
    """The projection's statements rendered for one schema (once per worker, not per batch)."""

    def __init__(self, schema: str) -> None:
        self.schema = schema
        self.upsert_checkpoints = render(UPSERT_CHECKPOINTS_SQL, schema)
        self.insert_blobs = render(INSERT_BLOBS_SQL, schema)
        self.insert_writes = render(INSERT_WRITES_SQL, schema)
        self.upsert_writes = render(UPSERT_WRITES_SQL, schema)
        self.upsert_thread_partitions = render(UPSERT_THREAD_PARTITIONS_SQL, schema)
        self.thread_idle = render(THREAD_IDLE_SQL, schema)
        self.delete_threads = render(DELETE_THREADS_SQL, schema)
        self.stage_copy = render(STAGE_COPY_SQL, schema)
        self.apply_copy = render(APPLY_COPY_SQL, schema)
        self.record_copy = render(RECORD_COPY_SQL, schema)
        self.erase_threads = render(ERASE_THREADS_SQL, schema)
        self.erase_tenant_threads = render(ERASE_TENANT_THREADS_SQL, schema)
        self.erase_staged_copies = render(ERASE_STAGED_COPIES_SQL, schema)
        self.erase_tenant_staged_copies = render(ERASE_TENANT_STAGED_COPIES_SQL, schema)
        self.erasure = erasure.ErasureStatements(schema)
        self.delete_runs = render(DELETE_RUNS_SQL, schema)
        self.gc_blobs = render(GC_BLOBS_SQL, schema)
        self.newest_checkpoints = render(NEWEST_CHECKPOINTS_SQL, schema)
        self.insert_forks = render(INSERT_FORKS_SQL, schema)
        self.prune = prune.PruneStatements(schema)


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
                rows = await conn.fetch(sql.delete_runs, list(step.run_ids), step.topic, step.partition, within)
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


async def _apply_run(conn: asyncpg.Connection, sql: CheckpointStatements, run: DataRun) -> list[Fork]:
    forks: list[Fork] = []
    if run.puts:
        scopes = list(dict.fromkeys((p.thread_id, p.checkpoint_ns) for p in run.puts))
        rows = await conn.fetch(sql.newest_checkpoints, [t for t, _ in scopes], [ns for _, ns in scopes])
        forks = find_forks(run.puts, {(r["thread_id"], r["checkpoint_ns"]): r["newest"] for r in rows})
    if run.checkpoints[0]:
        await conn.execute(sql.upsert_checkpoints, *run.checkpoints)
    if run.blobs[0]:
        await conn.execute(sql.insert_blobs, *run.blobs)
    if run.writes_insert[0]:
        await conn.execute(sql.insert_writes, *run.writes_insert)
    if run.writes_upsert[0]:
        await conn.execute(sql.upsert_writes, *run.writes_upsert)
    if run.threads[0]:
        await conn.execute(sql.upsert_thread_partitions, *run.threads)
    if forks:
        rows = [
            (f.put.thread_id, f.put.checkpoint_ns, f.put.checkpoint_id, f.put.parent_checkpoint_id,
             f.newest_checkpoint_id, f.put.topic, f.put.partition, f.put.offset)
            for f in forks
        ]  # fmt: skip
        await conn.execute(sql.insert_forks, *_columns(rows, 8))
    return forks


async def gc_blobs(
    conn: asyncpg.Connection, sql: CheckpointStatements, freed: Sequence[tuple[str, str, str, str]]
) -> None:
    """Delete the freed `(thread_id, checkpoint_ns, channel, version)` blobs no checkpoint references."""
    if freed:
        await conn.execute(sql.gc_blobs, *_columns(freed, 4))


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
        forks = await apply_steps(conn, self.sql, plan_batch(items))
        for f in forks:
            p = f.put
            log.warning(
                "fork on thread %r namespace %r: checkpoint %s has parent %s, but the newest checkpoint was %s "
                "(%s:%d@%d); two writers on one thread, or a branch from an older checkpoint",
                p.thread_id, p.checkpoint_ns, p.checkpoint_id, p.parent_checkpoint_id, f.newest_checkpoint_id,
                p.topic, p.partition, p.offset,
            )  # fmt: skip
        return ApplyReport(forks=len(forks))
