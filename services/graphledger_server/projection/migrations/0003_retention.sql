-- Retention (docs/retention.md): what the sweeper's thread TTL and store refresh need, beside the official layout.

-- A thread's last activity: the newest producer time of its checkpoint puts, writes and copies (the
-- greatest one, so a replay in any batching writes the same value). Threads projected before this
-- migration count as active at the migration. The sweeper pages idle threads by this index.
ALTER TABLE {schema}.graphledger_thread_partitions ADD COLUMN IF NOT EXISTS last_active_at TIMESTAMPTZ;
UPDATE {schema}.graphledger_thread_partitions SET last_active_at = now() WHERE last_active_at IS NULL;
CREATE INDEX IF NOT EXISTS graphledger_thread_partitions_last_active_idx
    ON {schema}.graphledger_thread_partitions(last_active_at);

-- The item's TTL in minutes as the put gave it: the official `ttl_minutes` is an INT, which rounds a
-- fractional TTL (0.02 becomes 0), and a refresh restarts the TTL from this exact value.
ALTER TABLE {schema}.store ADD COLUMN IF NOT EXISTS graphledger_ttl_minutes DOUBLE PRECISION;
