"""The checkpoint projection's SQL, as named constants, and the statements rendered for one schema.

Like the official saver's `base.py`: each statement names what its `$n` parameters become
(`-> unnest(...)`). Checkpoint and metadata JSON arrive as JSON text and go to Postgres as `text` cast to
`jsonb`: never parsed here.
"""

from __future__ import annotations

from dataclasses import dataclass

from graphledger_server.projection import erasure, prune
from graphledger_server.sql import render

# --- data runs --------------------------------------------------------------------------------------

# A run's rows reach each table in one of two ways (`checkpoints._insert_rows`): as `unnest` arrays in one
# statement, or, from `STAGED_FROM_ROWS` rows, by a binary COPY into the table's temporary batch table and
# one statement that inserts them from it (asyncpg encodes a COPY's rows several times faster than arrays,
# whose every element it tests against three abstract base classes). The batch tables are the session's
# own, created and emptied before each run that stages rows (a batch may hold several runs) and emptied at
# commit, so a rolled-back batch leaves nothing. Keys are unique within a run (deduplicated in Python):
# ON CONFLICT DO UPDATE cannot touch one row twice in a statement.
_WRITES_BATCH_COLUMNS = """(
    thread_id text, checkpoint_ns text, checkpoint_id text, task_id text, task_path text, idx int, channel text,
    type text, blob bytea
) ON COMMIT DELETE ROWS"""
BATCH_TABLES_SQL = f"""
CREATE TEMP TABLE IF NOT EXISTS graphledger_batch_checkpoints (
    thread_id text, checkpoint_ns text, checkpoint_id text, parent_checkpoint_id text, checkpoint text,
    metadata text
) ON COMMIT DELETE ROWS;
CREATE TEMP TABLE IF NOT EXISTS graphledger_batch_blobs (
    thread_id text, checkpoint_ns text, channel text, version text, type text, blob bytea
) ON COMMIT DELETE ROWS;
CREATE TEMP TABLE IF NOT EXISTS graphledger_batch_writes {_WRITES_BATCH_COLUMNS};
CREATE TEMP TABLE IF NOT EXISTS graphledger_batch_write_upserts {_WRITES_BATCH_COLUMNS};
DELETE FROM graphledger_batch_checkpoints;
DELETE FROM graphledger_batch_blobs;
DELETE FROM graphledger_batch_writes;
DELETE FROM graphledger_batch_write_upserts
"""

# Like the official UPSERT_CHECKPOINTS_SQL: a repeated put replaces checkpoint and metadata only.
# $1..$6 -> unnest(thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint, metadata);
# the JSON columns arrive as text and are cast to jsonb here.
_CHECKPOINT_COLUMNS = "thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint, metadata"
_INSERT_CHECKPOINTS = f"""
INSERT INTO {{schema}}.checkpoints ({_CHECKPOINT_COLUMNS})
SELECT u.thread_id, u.checkpoint_ns, u.checkpoint_id, u.parent_checkpoint_id, u.checkpoint::jsonb, u.metadata::jsonb
"""
_CHECKPOINTS_CONFLICT = """
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id) DO UPDATE SET
    checkpoint = EXCLUDED.checkpoint,
    metadata = EXCLUDED.metadata
"""
UPSERT_CHECKPOINTS_SQL = f"""{_INSERT_CHECKPOINTS}
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[]) AS u({_CHECKPOINT_COLUMNS})
{_CHECKPOINTS_CONFLICT}"""
UPSERT_BATCH_CHECKPOINTS_SQL = f"""{_INSERT_CHECKPOINTS} FROM graphledger_batch_checkpoints u {_CHECKPOINTS_CONFLICT}"""

# Like UPSERT_CHECKPOINT_BLOBS_SQL: a channel version's value never changes, the first one stays.
# $1..$6 -> unnest(thread_id, checkpoint_ns, channel, version, type, blob).
_INSERT_BLOBS = "INSERT INTO {schema}.checkpoint_blobs (thread_id, checkpoint_ns, channel, version, type, blob)"
_BLOBS_CONFLICT = "ON CONFLICT (thread_id, checkpoint_ns, channel, version) DO NOTHING"
INSERT_BLOBS_SQL = f"""
{_INSERT_BLOBS}
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bytea[])
{_BLOBS_CONFLICT}
"""
INSERT_BATCH_BLOBS_SQL = f"{_INSERT_BLOBS} SELECT * FROM graphledger_batch_blobs {_BLOBS_CONFLICT}"

# INSERT_CHECKPOINT_WRITES_SQL / UPSERT_CHECKPOINT_WRITES_SQL, set-based.
# $1..$9 -> unnest(thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob).
_INSERT_WRITES = """
INSERT INTO {schema}.checkpoint_writes
    (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob)
"""
_WRITES_ARRAYS = """SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::int[],
                     $7::text[], $8::text[], $9::bytea[])"""
_WRITES_INSERT_CONFLICT = "ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO NOTHING"
_WRITES_UPSERT_CONFLICT = """
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO UPDATE SET
    channel = EXCLUDED.channel,
    type = EXCLUDED.type,
    blob = EXCLUDED.blob
"""
INSERT_WRITES_SQL = f"{_INSERT_WRITES}{_WRITES_ARRAYS}\n{_WRITES_INSERT_CONFLICT}\n"
INSERT_BATCH_WRITES_SQL = f"{_INSERT_WRITES}SELECT * FROM graphledger_batch_writes {_WRITES_INSERT_CONFLICT}\n"
UPSERT_WRITES_SQL = f"{_INSERT_WRITES}{_WRITES_ARRAYS}{_WRITES_UPSERT_CONFLICT}"
UPSERT_BATCH_WRITES_SQL = f"{_INSERT_WRITES}SELECT * FROM graphledger_batch_write_upserts {_WRITES_UPSERT_CONFLICT}"

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
# $1..$9 -> unnest(thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, newest_checkpoint_id,
# topic, partition, offset, kind: `branch` for a protected put, `fork` for one without an intent).
INSERT_FORKS_SQL = """
INSERT INTO {schema}.graphledger_forks
    (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, newest_checkpoint_id, source, topic,
     partition, "offset", kind)
SELECT u.thread_id, u.checkpoint_ns, u.checkpoint_id, u.parent_checkpoint_id, u.newest, c.metadata ->> 'source',
       u.topic, u.partition, u."offset", u.kind
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::int[], $8::bigint[],
            $9::text[])
    AS u(thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, newest, topic, partition, "offset", kind)
LEFT JOIN {schema}.checkpoints c
    ON c.thread_id = u.thread_id AND c.checkpoint_ns = u.checkpoint_ns AND c.checkpoint_id = u.checkpoint_id
ON CONFLICT (topic, partition, "offset") DO NOTHING
"""

# --- one writer per thread (graphledger.ownership) -----------------------------------------------

# The rule's state of the batch's threads before it: each thread's operation count (null: none recorded)
# and one row per lead (null namespace: none). $1 -> thread ids.
THREAD_LEDGERS_SQL = """
SELECT u.thread_id, g.operations, l.checkpoint_ns, l.lead, l.lead_id, l.lead_run, l.lead_writer
FROM unnest($1::text[]) AS u(thread_id)
LEFT JOIN {schema}.graphledger_thread_ledgers g ON g.thread_id = u.thread_id
LEFT JOIN {schema}.graphledger_thread_leads l ON l.thread_id = u.thread_id
"""

# The rule's state after the batch of the threads it changed, in one statement: their operation counts,
# their leads replaced by the ones listed (a lead not listed is open). $1/$2 -> unnest(thread_id, operations);
# $3..$8 -> unnest(thread_id, checkpoint_ns, lead, lead_id, lead_run, lead_writer) of the leads they have now.
WRITE_LEDGERS_SQL = """
WITH ops AS (
    INSERT INTO {schema}.graphledger_thread_ledgers AS g (thread_id, operations)
    SELECT * FROM unnest($1::text[], $2::bigint[])
    ON CONFLICT (thread_id) DO UPDATE SET operations = EXCLUDED.operations
    WHERE g.operations IS DISTINCT FROM EXCLUDED.operations
), opened AS (
    DELETE FROM {schema}.graphledger_thread_leads l
    WHERE l.thread_id = ANY($1::text[])
      AND (l.thread_id, l.checkpoint_ns) NOT IN (SELECT * FROM unnest($3::text[], $4::text[]))
)
INSERT INTO {schema}.graphledger_thread_leads AS l (thread_id, checkpoint_ns, lead, lead_id, lead_run, lead_writer)
SELECT * FROM unnest($3::text[], $4::text[], $5::bytea[], $6::text[], $7::text[], $8::bytea[])
ON CONFLICT (thread_id, checkpoint_ns) DO UPDATE
    SET lead = EXCLUDED.lead, lead_id = EXCLUDED.lead_id, lead_run = EXCLUDED.lead_run,
        lead_writer = EXCLUDED.lead_writer
WHERE (l.lead, l.lead_id, l.lead_run, l.lead_writer)
    IS DISTINCT FROM (EXCLUDED.lead, EXCLUDED.lead_id, EXCLUDED.lead_run, EXCLUDED.lead_writer)
"""

# runs.delete, one partition's copy, for the threads of the partition the batch does not plan (`planned`):
# a lead of a listed run opens its namespace, and counts an operation of its thread. $1 -> run ids,
# $2 topic, $3 partition, $4 -> thread ids it may change (null: every one), $5 -> the batch's threads.
OPEN_DELETED_RUNS_SQL = """
WITH opened AS (
    DELETE FROM {schema}.graphledger_thread_leads l
    USING {schema}.graphledger_thread_partitions tp
    WHERE tp.topic = $2::text AND tp.partition = $3::int AND l.thread_id = tp.thread_id
      AND l.lead_run = ANY($1::text[])
      AND ($4::text[] IS NULL OR l.thread_id = ANY($4::text[]))
      AND l.thread_id <> ALL($5::text[])
    RETURNING l.thread_id
)
INSERT INTO {schema}.graphledger_thread_ledgers AS g (thread_id, operations)
SELECT DISTINCT thread_id, 1 FROM opened
ON CONFLICT (thread_id) DO UPDATE SET operations = g.operations + 1
"""

# The puts and writes the rule refused, by position. $1..$9 -> unnest(topic, partition, offset, thread_id,
# checkpoint_ns, checkpoint_id, event_type, reason, superseded_by).
INSERT_REFUSALS_SQL = """
INSERT INTO {schema}.graphledger_refusals
    (topic, partition, "offset", thread_id, checkpoint_ns, checkpoint_id, event_type, reason, superseded_by)
SELECT * FROM unnest($1::text[], $2::int[], $3::bigint[], $4::text[], $5::text[], $6::text[], $7::text[],
                     $8::text[], $9::bytea[])
ON CONFLICT (topic, partition, "offset") DO NOTHING
"""

# The writes of refused puts' checkpoints that counted before their put (applied in an earlier run or
# batch), unless the checkpoint counted after all (a copy of a counted put refused on a retry). $1..$3 ->
# unnest(thread_id, checkpoint_ns, checkpoint_id).
DROP_REFUSED_WRITES_SQL = """
DELETE FROM {schema}.checkpoint_writes w
USING unnest($1::text[], $2::text[], $3::text[]) AS u(thread_id, checkpoint_ns, checkpoint_id)
WHERE w.thread_id = u.thread_id AND w.checkpoint_ns = u.checkpoint_ns AND w.checkpoint_id = u.checkpoint_id
  AND NOT EXISTS (
      SELECT 1 FROM {schema}.checkpoints c
      WHERE c.thread_id = u.thread_id AND c.checkpoint_ns = u.checkpoint_ns AND c.checkpoint_id = u.checkpoint_id
  )
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
     g AS (DELETE FROM {schema}.graphledger_thread_ledgers WHERE thread_id = ANY($1::text[])),
     ld AS (DELETE FROM {schema}.graphledger_thread_leads WHERE thread_id = ANY($1::text[])),
     r AS (DELETE FROM {schema}.graphledger_refusals WHERE thread_id = ANY($1::text[])),
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
     f AS (DELETE FROM {schema}.graphledger_forks WHERE starts_with(thread_id, $1::text)),
     g AS (DELETE FROM {schema}.graphledger_thread_ledgers WHERE starts_with(thread_id, $1::text)),
     ld AS (DELETE FROM {schema}.graphledger_thread_leads WHERE starts_with(thread_id, $1::text)),
     r AS (DELETE FROM {schema}.graphledger_refusals WHERE starts_with(thread_id, $1::text))
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


@dataclass(frozen=True, slots=True)
class RowInsert:
    """One table's insert of a run's rows: from `unnest` arrays, or moved from its batch table (`batch`)."""

    arrays: str
    staged: str
    batch: str
    width: int
    """Columns of a row (and `unnest` parameters of `arrays`)."""


class CheckpointStatements:
    """The projection's statements rendered for one schema (once per worker, not per batch)."""

    def __init__(self, schema: str) -> None:
        self.schema = schema
        self.upsert_checkpoints = RowInsert(
            render(UPSERT_CHECKPOINTS_SQL, schema), render(UPSERT_BATCH_CHECKPOINTS_SQL, schema),
            "graphledger_batch_checkpoints", 6,
        )  # fmt: skip
        self.insert_blobs = RowInsert(
            render(INSERT_BLOBS_SQL, schema), render(INSERT_BATCH_BLOBS_SQL, schema), "graphledger_batch_blobs", 6
        )
        self.insert_writes = RowInsert(
            render(INSERT_WRITES_SQL, schema), render(INSERT_BATCH_WRITES_SQL, schema), "graphledger_batch_writes", 9
        )
        self.upsert_writes = RowInsert(
            render(UPSERT_WRITES_SQL, schema), render(UPSERT_BATCH_WRITES_SQL, schema),
            "graphledger_batch_write_upserts", 9,
        )  # fmt: skip
        self.batch_tables = BATCH_TABLES_SQL
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
        self.thread_ledgers = render(THREAD_LEDGERS_SQL, schema)
        self.write_ledgers = render(WRITE_LEDGERS_SQL, schema)
        self.open_deleted_runs = render(OPEN_DELETED_RUNS_SQL, schema)
        self.insert_refusals = render(INSERT_REFUSALS_SQL, schema)
        self.drop_refused_writes = render(DROP_REFUSED_WRITES_SQL, schema)
        self.prune = prune.PruneStatements(schema)
