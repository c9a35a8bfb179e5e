-- Parked subjects (docs/operations.md, "Parked subjects"). A record no projector version can apply (an
-- event of a version this projector does not read, a copy barrier naming a position beyond its log, a
-- barrier whose copy is itself parked) parks its subject instead of stopping its partition: the subject is
-- the partition's records of one record key (a thread, a store item). That record and the subject's
-- later records are kept here, written in the batch transaction that moves the partition's offset past
-- them, until the projector (a version that reads them; a copy applied) or an operator (`graphledger
-- parked release|drop`) applies them, in order, in one transaction that deletes them. Every column is
-- read from the log, so a rebuild from the same log parks the same rows (`replay/checksums.py`).
-- Version 9 is not used: databases may have recorded it for tables no release reads.
CREATE TABLE IF NOT EXISTS {schema}.graphledger_parked_subjects (
    topic TEXT NOT NULL,
    partition INT NOT NULL,
    -- the record that parked it: with topic and partition, the subject's name (`topic:partition@offset`)
    first_offset BIGINT NOT NULL,
    -- the subject: the key of its records; null for a keyless record, which parks alone
    record_key BYTEA,
    -- newer_version, beyond_log or copy_parked
    cause TEXT NOT NULL,
    reason TEXT NOT NULL,
    event_type TEXT,
    -- the first record's gl-subject header: whose data it holds, when sealed
    subject_ref TEXT,
    -- newer_version: the version the record claims, and the version of the projector that parked it
    event_version INT,
    parked_by_version INT NOT NULL,
    -- copy_parked: the position of the copy's record on the same topic
    waits_for_partition INT,
    waits_for_offset BIGINT,
    -- the first record's time in the log (null: the record carries none)
    parked_at TIMESTAMPTZ,
    PRIMARY KEY (topic, partition, first_offset)
);
CREATE UNIQUE INDEX IF NOT EXISTS graphledger_parked_subjects_key_idx
    ON {schema}.graphledger_parked_subjects (topic, partition, record_key) WHERE record_key IS NOT NULL;

-- The records parked subjects hold, as they came (headers: msgpack list of [name, value] pairs, gl-chunk
-- included). `first_offset` names the subject holding the record; null for a keyless record (`runs.delete`,
-- an erasure of a namespace or tenant) that applied to the partition while subjects of it were parked,
-- kept so a release applies it to the released subject too, after that subject's records before it.
CREATE TABLE IF NOT EXISTS {schema}.graphledger_held_records (
    topic TEXT NOT NULL,
    partition INT NOT NULL,
    "offset" BIGINT NOT NULL,
    first_offset BIGINT,
    record_key BYTEA,
    record_value BYTEA,
    record_headers BYTEA NOT NULL,
    record_timestamp BIGINT NOT NULL,
    PRIMARY KEY (topic, partition, "offset")
);
CREATE INDEX IF NOT EXISTS graphledger_held_records_subject_idx
    ON {schema}.graphledger_held_records (topic, partition, first_offset, "offset");

-- What was decided about single records that the log alone cannot tell a later reader: a copy barrier
-- found beyond the end of its copy's partition when it was read (`beyond_log`; the log may have grown past
-- that position since), and a record an operator dropped (`dropped`: dead-lettered, never parked again).
-- A rebuild copies these from the live schema before it applies (`replay/run.py`), so it decides the same.
CREATE TABLE IF NOT EXISTS {schema}.graphledger_record_verdicts (
    topic TEXT NOT NULL,
    partition INT NOT NULL,
    "offset" BIGINT NOT NULL,
    verdict TEXT NOT NULL,
    decided_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (topic, partition, "offset")
);
