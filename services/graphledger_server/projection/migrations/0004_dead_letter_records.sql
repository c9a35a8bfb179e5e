-- Dead letters keep the record itself (key, value, headers; a chunked event reassembled), so that
-- `graphledger dlq show` and `replay` need only Postgres: the dead-letter topic may have expired.
-- `id` names a dead letter on the command line; `replayed_at` / `replayed_to` make a replay happen once.
ALTER TABLE {schema}.graphledger_dead_letters
    ADD COLUMN IF NOT EXISTS id BIGINT GENERATED ALWAYS AS IDENTITY,
    ADD COLUMN IF NOT EXISTS record_key BYTEA,
    ADD COLUMN IF NOT EXISTS record_value BYTEA,
    -- msgpack list of [name, value] pairs, without gl-chunk: header names are not text Postgres must accept
    ADD COLUMN IF NOT EXISTS record_headers BYTEA,
    ADD COLUMN IF NOT EXISTS replayed_at TIMESTAMPTZ,
    -- where the replay published it: "topic:partition@offset" of its (last) record
    ADD COLUMN IF NOT EXISTS replayed_to TEXT;

CREATE UNIQUE INDEX IF NOT EXISTS graphledger_dead_letters_id_idx ON {schema}.graphledger_dead_letters (id);

CREATE INDEX IF NOT EXISTS graphledger_dead_letters_outstanding_idx
    ON {schema}.graphledger_dead_letters (topic) WHERE replayed_at IS NULL;
