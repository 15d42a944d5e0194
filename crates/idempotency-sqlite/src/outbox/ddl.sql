-- Canonical DDL of the transactional outbox on SQLite (3.37+: STRICT tables).
-- {table}, {sequences} and the index names are replaced by the configured, validated and quoted names.
-- Times are INTEGER milliseconds since the Unix epoch (UTC), from the database clock.
-- Ids and claim tokens are UUIDs as lower-case hyphenated TEXT (v7 ids sort by time).
CREATE TABLE IF NOT EXISTS {table} (
    id                TEXT     NOT NULL PRIMARY KEY CHECK (length(id) = 36),
    aggregate_type    TEXT     NOT NULL CHECK (length(aggregate_type) BETWEEN 1 AND 255),
    aggregate_id      TEXT     NOT NULL CHECK (length(aggregate_id) BETWEEN 1 AND 255),
    sequence          INTEGER,
    event_type        TEXT     NOT NULL CHECK (length(event_type) BETWEEN 1 AND 255),
    payload           TEXT     NOT NULL CHECK (json_valid(payload)),
    headers           TEXT     NOT NULL DEFAULT '{}' CHECK (json_valid(headers)),
    created_at        INTEGER  NOT NULL,
    attempts          INTEGER  NOT NULL DEFAULT 0,
    next_attempt_at   INTEGER  NOT NULL,
    claim_token       TEXT,
    last_error        TEXT     CHECK (length(last_error) <= 1000),
    published_at      INTEGER,
    dead_lettered_at  INTEGER,
    CHECK (published_at IS NULL OR dead_lettered_at IS NULL)
) STRICT;

-- One counter row per aggregate. Enqueue bumps it in the writer's transaction; SQLite has one
-- writer at a time, so sequence order is commit order. Kept when retention deletes the rows.
CREATE TABLE IF NOT EXISTS {sequences} (
    aggregate_type  TEXT     NOT NULL CHECK (length(aggregate_type) BETWEEN 1 AND 255),
    aggregate_id    TEXT     NOT NULL CHECK (length(aggregate_id) BETWEEN 1 AND 255),
    last_sequence   INTEGER  NOT NULL,
    PRIMARY KEY (aggregate_type, aggregate_id)
) STRICT, WITHOUT ROWID;

-- The claim: an index scan over pending rows only, however many published rows the table holds.
CREATE INDEX IF NOT EXISTS {pending_index} ON {table} (next_attempt_at)
    WHERE published_at IS NULL AND dead_lettered_at IS NULL;

-- Per-aggregate order: the first pending row of an aggregate.
CREATE INDEX IF NOT EXISTS {aggregate_index} ON {table} (aggregate_type, aggregate_id, sequence)
    WHERE published_at IS NULL AND dead_lettered_at IS NULL;

-- Retention.
CREATE INDEX IF NOT EXISTS {published_index} ON {table} (published_at)
    WHERE published_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS {dead_letter_index} ON {table} (dead_lettered_at)
    WHERE dead_lettered_at IS NOT NULL;
