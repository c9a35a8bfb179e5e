-- Erasure (docs/security.md): what the projector needs to drop an erased subject's rows.

-- Each subject a sealed event named, by its reference (what an erasure event names it by), with its
-- tenant and its name as stored: a thread id, or a namespace prefix as `store.prefix` holds it.
CREATE TABLE IF NOT EXISTS {schema}.graphledger_subjects (
    ref TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    tenant TEXT NOT NULL,
    name TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS graphledger_subjects_name_idx ON {schema}.graphledger_subjects (kind, name);
CREATE INDEX IF NOT EXISTS graphledger_subjects_tenant_idx ON {schema}.graphledger_subjects (tenant, kind);

-- Which thread was copied into which (`copy_thread`): a copy holds its source's data, so erasing the
-- source erases its copies. Kept when either is deleted; dropped when the copy is erased, which the
-- eraser does for each row of an erased source once the source's erasure applied.
CREATE TABLE IF NOT EXISTS {schema}.graphledger_thread_copies (
    source_thread_id TEXT NOT NULL,
    target_thread_id TEXT NOT NULL,
    PRIMARY KEY (source_thread_id, target_thread_id)
);
CREATE INDEX IF NOT EXISTS graphledger_thread_copies_target_idx
    ON {schema}.graphledger_thread_copies (target_thread_id);

-- The subject of a dead letter's and a chunk's record (its gl-subject header), so that erasing the
-- subject drops them too.
ALTER TABLE {schema}.graphledger_dead_letters ADD COLUMN IF NOT EXISTS subject_ref TEXT;
CREATE INDEX IF NOT EXISTS graphledger_dead_letters_subject_idx
    ON {schema}.graphledger_dead_letters (subject_ref) WHERE subject_ref IS NOT NULL;
ALTER TABLE {schema}.graphledger_chunks ADD COLUMN IF NOT EXISTS subject_ref TEXT;
CREATE INDEX IF NOT EXISTS graphledger_chunks_subject_idx
    ON {schema}.graphledger_chunks (subject_ref) WHERE subject_ref IS NOT NULL;
