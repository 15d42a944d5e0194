-- Canonical DDL of the time-partitioned transactional outbox (PostgreSQL 13+,
-- `outbox.partitioning.enabled`). {table}, {sequences}, {default_partition} and the index
-- names are replaced by the configured, validated and quoted names. The table is partitioned
-- by RANGE (created_at), so its primary key must include created_at. The partitions of each
-- interval are created by the store (`PgOutbox::prepare_partitions`), not by this script.
-- payload and headers are JSON, not JSONB: the text is kept as enqueued (key order, numbers,
-- the \u0000 escape), so the relay publishes exactly the bytes the application wrote.
CREATE TABLE IF NOT EXISTS {table} (
    id                UUID          NOT NULL,
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
    CHECK (published_at IS NULL OR dead_lettered_at IS NULL),
    PRIMARY KEY (id, created_at)
) PARTITION BY RANGE (created_at);

-- The safety net: rows whose interval has no partition yet (maintenance fell behind) land
-- here instead of failing the enqueueing transaction. It is never dropped; retention deletes
-- its old rows in batches, and no partition is created over a range it holds rows of.
CREATE TABLE IF NOT EXISTS {default_partition} PARTITION OF {table} DEFAULT;
