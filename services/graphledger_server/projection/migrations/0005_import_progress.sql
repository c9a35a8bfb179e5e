-- Progress of `graphledger import --from-postgres`, one row per source database and stream
-- ('threads', 'store'): everything up to `cursor` (a thread id, or [prefix, key]) in the stream's
-- order is on the topics. An interrupted import resumes after the cursor; a finished one is `done`.
-- It lives beside the projection, not in a local file, so an import run as a Kubernetes Job resumes
-- on whichever pod runs it next.
CREATE TABLE IF NOT EXISTS {schema}.graphledger_imports (
    source TEXT NOT NULL,
    stream TEXT NOT NULL,
    cursor TEXT[],
    done BOOLEAN NOT NULL DEFAULT FALSE,
    events BIGINT NOT NULL DEFAULT 0,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (source, stream)
);
