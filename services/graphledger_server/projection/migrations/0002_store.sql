-- The store projection: langgraph-checkpoint-postgres 3.2's `store` table and indexes, column for
-- column (its store MIGRATIONS 0-3 folded into their final shape), so the official AsyncPostgresStore
-- reads this schema unchanged; `migrate.py` fills `store_migrations` so its `setup()` is a no-op.
-- `store_vectors` is not here: its column type depends on GRAPHLEDGER_STORE_VECTOR_DIMS, so
-- `vector_index.py` creates it (when configured) and records its shape in `graphledger_store_index`.

CREATE TABLE IF NOT EXISTS {schema}.store_migrations (
    v INTEGER PRIMARY KEY
);

CREATE TABLE IF NOT EXISTS {schema}.store (
    prefix text NOT NULL,
    key text NOT NULL,
    value jsonb NOT NULL,
    created_at TIMESTAMP WITH TIME ZONE DEFAULT CURRENT_TIMESTAMP,
    updated_at TIMESTAMP WITH TIME ZONE DEFAULT CURRENT_TIMESTAMP,
    expires_at TIMESTAMP WITH TIME ZONE,
    ttl_minutes INT,
    PRIMARY KEY (prefix, key)
);

CREATE INDEX IF NOT EXISTS store_prefix_idx ON {schema}.store USING btree (prefix text_pattern_ops);

CREATE INDEX IF NOT EXISTS idx_store_expires_at ON {schema}.store (expires_at)
WHERE expires_at IS NOT NULL;

-- The shape `store_vectors` was built with (at most one row); absent: the schema has no vector table.
CREATE TABLE IF NOT EXISTS {schema}.graphledger_store_index (
    singleton BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (singleton),
    dims INTEGER NOT NULL,
    vector_type TEXT NOT NULL,
    distance TEXT NOT NULL,
    index_kind TEXT NOT NULL,
    hnsw_m INTEGER NOT NULL,
    hnsw_ef_construction INTEGER NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
