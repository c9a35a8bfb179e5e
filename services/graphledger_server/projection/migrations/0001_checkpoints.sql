-- The checkpoint projection: langgraph-checkpoint-postgres 3.2's tables and indexes, column for
-- column (its MIGRATIONS 1-9 folded into their final shape), so the official AsyncPostgresSaver reads
-- and writes this schema unchanged. `migrate.py` fills `checkpoint_migrations` so its `setup()` is a
-- no-op. Its indexes are built CONCURRENTLY there; here the schema is new, so plainly, in the
-- migration's transaction. Beside them, graphledger's own bookkeeping tables.

CREATE TABLE IF NOT EXISTS {schema}.checkpoint_migrations (
    v INTEGER PRIMARY KEY
);

CREATE TABLE IF NOT EXISTS {schema}.checkpoints (
    thread_id TEXT NOT NULL,
    checkpoint_ns TEXT NOT NULL DEFAULT '',
    checkpoint_id TEXT NOT NULL,
    parent_checkpoint_id TEXT,
    type TEXT,
    checkpoint JSONB NOT NULL,
    metadata JSONB NOT NULL DEFAULT '{}',
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id)
);

CREATE TABLE IF NOT EXISTS {schema}.checkpoint_blobs (
    thread_id TEXT NOT NULL,
    checkpoint_ns TEXT NOT NULL DEFAULT '',
    channel TEXT NOT NULL,
    version TEXT NOT NULL,
    type TEXT NOT NULL,
    blob BYTEA,
    PRIMARY KEY (thread_id, checkpoint_ns, channel, version)
);

CREATE TABLE IF NOT EXISTS {schema}.checkpoint_writes (
    thread_id TEXT NOT NULL,
    checkpoint_ns TEXT NOT NULL DEFAULT '',
    checkpoint_id TEXT NOT NULL,
    task_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    channel TEXT NOT NULL,
    type TEXT,
    blob BYTEA NOT NULL,
    task_path TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
);

CREATE INDEX IF NOT EXISTS checkpoints_thread_id_idx ON {schema}.checkpoints(thread_id);
CREATE INDEX IF NOT EXISTS checkpoint_blobs_thread_id_idx ON {schema}.checkpoint_blobs(thread_id);
CREATE INDEX IF NOT EXISTS checkpoint_writes_thread_id_idx ON {schema}.checkpoint_writes(thread_id);

-- The next offset to apply per partition, written in the batch transaction that applied the rows
-- before it: the projector's only progress record (Kafka's committed offsets are not used).
CREATE TABLE IF NOT EXISTS {schema}.graphledger_offsets (
    consumer_group TEXT NOT NULL,
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    next_offset BIGINT NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_group, topic, partition)
);

-- Which partition carries a thread, so that each partition's copy of a broadcast `runs.delete`
-- touches only its own threads.
CREATE TABLE IF NOT EXISTS {schema}.graphledger_thread_partitions (
    thread_id TEXT PRIMARY KEY,
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL
);

CREATE INDEX IF NOT EXISTS graphledger_thread_partitions_partition_idx
    ON {schema}.graphledger_thread_partitions(topic, partition);

-- Chunks of an event larger than the broker's message limit, until its last chunk arrives.
CREATE TABLE IF NOT EXISTS {schema}.graphledger_chunks (
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    event_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    count INTEGER NOT NULL,
    data BYTEA NOT NULL,
    "offset" BIGINT NOT NULL,
    PRIMARY KEY (topic, partition, event_id, idx)
);

-- Records sent to the dead-letter topic; the key makes a retried batch add nothing.
CREATE TABLE IF NOT EXISTS {schema}.graphledger_dead_letters (
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    "offset" BIGINT NOT NULL,
    event_type TEXT,
    reason TEXT NOT NULL,
    recorded_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (topic, partition, "offset")
);
