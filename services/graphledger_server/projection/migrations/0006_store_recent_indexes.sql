-- Non-query searches return the most recently updated items first (as AsyncPostgresStore orders
-- them). With these indexes a search reads items newest first and stops after a page of matches,
-- instead of filtering and sorting every item below the namespace: the first serves one namespace,
-- the second a prefix that covers many (Postgres picks by the prefix's share of the table). The
-- official layout has neither (extra indexes do not change what the official store reads).
CREATE INDEX IF NOT EXISTS graphledger_store_recent_idx ON {schema}.store (prefix, updated_at DESC, key);
CREATE INDEX IF NOT EXISTS graphledger_store_updated_idx ON {schema}.store (updated_at DESC);
