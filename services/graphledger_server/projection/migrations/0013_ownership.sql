-- One writer per thread (graphledger.ownership): what the rule keeps of each thread, and the writes it
-- refused. A projection migrated from before the rule knows no writer's intent: its threads start at no
-- operations with every namespace open, exactly where a replay of records without intents leaves them.

-- Each thread's operation count: deletes, prunes that delete, expiries, copies landing on it, a
-- `runs.delete` of a lead's run, and puts made without an intent. Kept when the thread's rows go (a writer
-- that read before a delete must still be refused after it); an erasure drops it with the thread.
CREATE TABLE IF NOT EXISTS {schema}.graphledger_thread_ledgers (
    thread_id TEXT PRIMARY KEY,
    operations BIGINT NOT NULL DEFAULT 0
);

-- Each namespace's lead: the checkpoint hash (as its put's intent names it) of its last counted protected
-- put, that checkpoint's id (writes of a newer one came before their put), its metadata run_id (as
-- `metadata ->> 'run_id'` reads it) and the run that put it (its intent's writer: that run's writes of an
-- older step still count). A namespace without a row is open.
CREATE TABLE IF NOT EXISTS {schema}.graphledger_thread_leads (
    thread_id TEXT NOT NULL,
    checkpoint_ns TEXT NOT NULL,
    lead BYTEA NOT NULL,
    lead_id TEXT NOT NULL,
    lead_run TEXT,
    lead_writer BYTEA,
    PRIMARY KEY (thread_id, checkpoint_ns)
);

-- Each refused put or writes, by its record's position (a retried batch adds no second row); `graphledger
-- forks list` shows them beside the forks, and `graphledger.projector.writes_refused` counts them.
CREATE TABLE IF NOT EXISTS {schema}.graphledger_refusals (
    topic TEXT NOT NULL,
    partition INT NOT NULL,
    "offset" BIGINT NOT NULL,
    thread_id TEXT NOT NULL,
    checkpoint_ns TEXT NOT NULL,
    checkpoint_id TEXT NOT NULL,
    event_type TEXT NOT NULL,
    reason TEXT NOT NULL,
    superseded_by BYTEA,
    recorded_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (topic, partition, "offset")
);

CREATE INDEX IF NOT EXISTS graphledger_refusals_thread_idx ON {schema}.graphledger_refusals (thread_id, checkpoint_ns);

-- A fork's kind: `branch`, a counted put its writer asked for from an older checkpoint (time travel,
-- `update_state` on an older checkpoint); `fork`, a put made without an intent on a namespace whose newest
-- checkpoint is not its parent (a writer outside the rule). Rows from before the rule are forks.
ALTER TABLE {schema}.graphledger_forks ADD COLUMN IF NOT EXISTS kind TEXT NOT NULL DEFAULT 'fork';
