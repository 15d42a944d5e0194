-- Canonical DDL of the transactional outbox (PostgreSQL 13+).
-- {table}, {sequences} and the index names are replaced by the configured, validated and quoted names.
-- payload and headers are JSON, not JSONB: the text is kept as enqueued (key order, numbers,
-- the \u0000 escape), so the relay publishes exactly the bytes the application wrote.
CREATE TABLE IF NOT EXISTS {table} (
    id                UUID          PRIMARY KEY,
    aggregate_type    VARCHAR(255)  NOT NULL,
    aggregate_id      VARCHAR(255)  NOT NULL,
    sequence          BIGINT,
    event_type        VARCHAR(255)  NOT NULL,
    payload           JSON          NOT NULL,
    headers           JSON          NOT NULL DEFAULT '{}',
    created_at        TIMESTAMPTZ   NOT NULL DEFAULT clock_timestamp(),
    attempts          INTEGER       NOT NULL DEFAULT 0,
    next_attempt_at   TIMESTAMPTZ   NOT NULL DEFAULT clock_timestamp(),
    claim_token       UUID,
    last_error        VARCHAR(1000),
    published_at      TIMESTAMPTZ,
    dead_lettered_at  TIMESTAMPTZ,
    CHECK (published_at IS NULL OR dead_lettered_at IS NULL)
);
