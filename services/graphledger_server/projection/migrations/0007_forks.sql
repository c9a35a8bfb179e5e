-- Forks: a checkpoint put whose parent was not its thread namespace's newest checkpoint when the
-- projector applied it (two writers on one thread, or a deliberate branch from an older checkpoint).
-- Written in the batch transaction, keyed by the put's position, so a retried batch adds no second row;
-- `graphledger forks list` and the `graphledger.projector.forks` counter report them.
CREATE TABLE IF NOT EXISTS {schema}.graphledger_forks (
    id BIGINT GENERATED ALWAYS AS IDENTITY,
    thread_id TEXT NOT NULL,
    checkpoint_ns TEXT NOT NULL,
    checkpoint_id TEXT NOT NULL,
    parent_checkpoint_id TEXT,
    -- the thread namespace's newest checkpoint id just before this put applied
    newest_checkpoint_id TEXT NOT NULL,
    -- the put's metadata `source` (loop, input, update, fork): a branch a user asked for says so
    source TEXT,
    topic TEXT NOT NULL,
    partition INT NOT NULL,
    "offset" BIGINT NOT NULL,
    recorded_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (topic, partition, "offset")
);

CREATE INDEX IF NOT EXISTS graphledger_forks_thread_idx ON {schema}.graphledger_forks (thread_id, id);
