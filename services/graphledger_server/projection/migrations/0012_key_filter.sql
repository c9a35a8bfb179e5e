-- A Bloom filter of each checkpoint partition's record keys (graphledger.log.key_filter): `bits` is word `word`
-- of the partition's filter, which holds the key of every record the projector moved the partition's offset
-- past. A projector batch ORs its records' bits in, in the transaction that advances the offset, so a
-- snapshot of the filter and the offset row agree. Only ever grows: a deleted thread's key stays (its read
-- goes to the read API, as a false positive's does). An index of the log, not a projection: a rebuild
-- makes it again from the same records.
CREATE TABLE IF NOT EXISTS {schema}.graphledger_key_filter (
    topic TEXT NOT NULL,
    partition INT NOT NULL,
    word INT NOT NULL,
    bits BIGINT NOT NULL,
    PRIMARY KEY (topic, partition, word)
);

-- Whether the filter holds every key below next_offset: not for a partition the projector had applied
-- records of before this table existed (the filter lacks their keys until a replay rebuilds the schema);
-- a row made from now on starts with the partition's first record.
ALTER TABLE {schema}.graphledger_offsets ADD COLUMN IF NOT EXISTS key_filter_complete BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE {schema}.graphledger_offsets ALTER COLUMN key_filter_complete SET DEFAULT true;
