-- Copies in flight (`copy_thread`, docs/architecture.md "Consistency"). A `thread.copy` record, applied in
-- its source's partition order, stages the source's rows as they are at its place in the source's log,
-- under the record's position; its `thread.copy.barrier`, applied in the target's partition order (once
-- the copy's record has applied), moves them into the target and drops the stage. So the target's
-- records before the barrier apply before the copy, whichever partition the projector reaches first.
-- Written in the batch transactions that advance those partitions' offsets; a replay stages and moves
-- the same rows. A stage lives from its copy's record to its barrier; one whose barrier never came (the
-- writer died between the two) stays. Erasing the target drops its stages; erasing the source leaves
-- them to the erasure of their targets, which the copy's lineage names to the eraser.

-- One row per staged copy. No index beside the key: it holds only the copies in flight, which an
-- erasure scans.
CREATE TABLE IF NOT EXISTS {schema}.graphledger_copy_stages (
    topic TEXT NOT NULL,
    partition INT NOT NULL,
    "offset" BIGINT NOT NULL,
    source_thread_id TEXT NOT NULL,
    target_thread_id TEXT NOT NULL,
    -- the copy record's time (null: none); the target's activity from its barrier on
    copied_at TIMESTAMPTZ,
    PRIMARY KEY (topic, partition, "offset")
);

-- The staged rows: `checkpoints`, `checkpoint_blobs` and `checkpoint_writes` of the source, keyed by
-- their stage instead of a thread.
CREATE TABLE IF NOT EXISTS {schema}.graphledger_staged_checkpoints (
    topic TEXT NOT NULL,
    partition INT NOT NULL,
    "offset" BIGINT NOT NULL,
    checkpoint_ns TEXT NOT NULL,
    checkpoint_id TEXT NOT NULL,
    parent_checkpoint_id TEXT,
    type TEXT,
    checkpoint JSONB NOT NULL,
    metadata JSONB NOT NULL,
    PRIMARY KEY (topic, partition, "offset", checkpoint_ns, checkpoint_id)
);

CREATE TABLE IF NOT EXISTS {schema}.graphledger_staged_blobs (
    topic TEXT NOT NULL,
    partition INT NOT NULL,
    "offset" BIGINT NOT NULL,
    checkpoint_ns TEXT NOT NULL,
    channel TEXT NOT NULL,
    version TEXT NOT NULL,
    type TEXT NOT NULL,
    blob BYTEA,
    PRIMARY KEY (topic, partition, "offset", checkpoint_ns, channel, version)
);

CREATE TABLE IF NOT EXISTS {schema}.graphledger_staged_writes (
    topic TEXT NOT NULL,
    partition INT NOT NULL,
    "offset" BIGINT NOT NULL,
    checkpoint_ns TEXT NOT NULL,
    checkpoint_id TEXT NOT NULL,
    task_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    channel TEXT NOT NULL,
    type TEXT,
    blob BYTEA NOT NULL,
    task_path TEXT NOT NULL,
    PRIMARY KEY (topic, partition, "offset", checkpoint_ns, checkpoint_id, task_id, idx)
);
