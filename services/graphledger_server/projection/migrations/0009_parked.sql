-- Parked subjects (docs/operations.md, "Parked subjects"): a record no projector version can apply (an
-- event from a newer graphledger, a copy barrier that cannot be met) sets its subject aside instead of
-- stopping its partition. The subject is the partition's records of one record key: that record and the
-- later ones of the same key are kept here, in the batch transaction that moves the partition's offset
-- past them, until the projector releases them (a copy barrier's copy applied) or an operator does
-- (`graphledger parked release|skip`). A keyless record is a subject of its own.
CREATE TABLE IF NOT EXISTS {schema}.graphledger_parked (
    topic TEXT NOT NULL,
    partition INT NOT NULL,
    -- the record that parked it: with topic and partition, the subject's name on the command line
    first_offset BIGINT NOT NULL,
    -- SHA-256 of the record key (record keys are the writer's, of any length); null: a keyless record
    subject_key BYTEA,
    -- newer_version, beyond_log, copy_parked (an operator acts), or waiting (released by the projector)
    cause TEXT NOT NULL,
    reason TEXT NOT NULL,
    event_type TEXT,
    -- the first record's gl-subject header: whose data it holds, if sealed
    subject_ref TEXT,
    -- a waiting copy barrier: the position of its copy's record on the same topic
    wait_partition INT,
    wait_offset BIGINT,
    -- what an operator asked (release, skip), carried out by the projector that owns the partition
    action TEXT,
    parked_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (topic, partition, first_offset)
);
CREATE UNIQUE INDEX IF NOT EXISTS graphledger_parked_subject_idx
    ON {schema}.graphledger_parked (topic, partition, subject_key) WHERE subject_key IS NOT NULL;

-- The records of each parked subject, as they came (headers: msgpack list of [name, value] pairs).
CREATE TABLE IF NOT EXISTS {schema}.graphledger_parked_records (
    topic TEXT NOT NULL,
    partition INT NOT NULL,
    "offset" BIGINT NOT NULL,
    first_offset BIGINT NOT NULL,
    record_key BYTEA,
    record_value BYTEA,
    record_headers BYTEA NOT NULL,
    record_timestamp BIGINT NOT NULL,
    PRIMARY KEY (topic, partition, "offset")
);
CREATE INDEX IF NOT EXISTS graphledger_parked_records_subject_idx
    ON {schema}.graphledger_parked_records (topic, partition, first_offset, "offset");

-- Records an operator skipped (`graphledger parked skip`): dead-lettered, never parked again. A replay
-- carries them over from the live schema, so it decides as the live projection did.
CREATE TABLE IF NOT EXISTS {schema}.graphledger_parked_skips (
    topic TEXT NOT NULL,
    partition INT NOT NULL,
    "offset" BIGINT NOT NULL,
    skipped_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (topic, partition, "offset")
);

-- The offset of the first record of a waiting subject of the partition (null: none): a read counts the
-- partition as applied up to here only, as it did when a copy barrier held its whole partition.
ALTER TABLE {schema}.graphledger_offsets ADD COLUMN IF NOT EXISTS waits_from BIGINT;
