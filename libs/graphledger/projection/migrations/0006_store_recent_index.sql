-- Non-query searches return a namespace's most recently updated items first (as AsyncPostgresStore
-- orders them). With this index a search of one namespace reads its items newest first and stops
-- after a page of matches, instead of filtering and sorting the whole namespace; the official
-- layout has no such index (an extra index does not change what the official store reads).
CREATE INDEX IF NOT EXISTS graphledger_store_recent_idx ON {schema}.store (prefix, updated_at DESC, key);
