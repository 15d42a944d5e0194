-- The transactional outbox and the consumer inbox (idempotency-outbox), default names.
-- Generated from crates/idempotency-outbox/src/pg/{outbox,inbox}.sql; a test keeps them equal.
CREATE TABLE IF NOT EXISTS "outbox" (
    id                UUID          PRIMARY KEY,
    aggregate_type    VARCHAR(255)  NOT NULL,
    aggregate_id      VARCHAR(255)  NOT NULL,
    sequence          BIGINT,
    event_type        VARCHAR(255)  NOT NULL,
    payload           JSONB         NOT NULL,
    headers           JSONB         NOT NULL DEFAULT '{}',
    created_at        TIMESTAMPTZ   NOT NULL DEFAULT clock_timestamp(),
    attempts          INTEGER       NOT NULL DEFAULT 0,
    next_attempt_at   TIMESTAMPTZ   NOT NULL DEFAULT clock_timestamp(),
    claim_token       UUID,
    last_error        VARCHAR(1000),
    published_at      TIMESTAMPTZ,
    dead_lettered_at  TIMESTAMPTZ,
    CHECK (published_at IS NULL OR dead_lettered_at IS NULL)
);

-- One counter row per aggregate, locked by the enqueueing transaction until it ends:
-- writers of one aggregate are serialized, so sequence order is commit order.
CREATE TABLE IF NOT EXISTS "outbox_sequences" (
    aggregate_type  VARCHAR(255)  NOT NULL,
    aggregate_id    VARCHAR(255)  NOT NULL,
    last_sequence   BIGINT        NOT NULL,
    PRIMARY KEY (aggregate_type, aggregate_id)
);

-- The claim: an index scan over pending rows only, however many published rows the table holds.
CREATE INDEX IF NOT EXISTS "outbox_pending_idx" ON "outbox" (next_attempt_at)
    WHERE published_at IS NULL AND dead_lettered_at IS NULL;

-- Per-aggregate order: the first pending row of an aggregate.
CREATE INDEX IF NOT EXISTS "outbox_aggregate_idx" ON "outbox" (aggregate_type, aggregate_id, sequence)
    WHERE published_at IS NULL AND dead_lettered_at IS NULL;

-- Retention.
CREATE INDEX IF NOT EXISTS "outbox_published_idx" ON "outbox" (published_at)
    WHERE published_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS "outbox_dead_letter_idx" ON "outbox" (dead_lettered_at)
    WHERE dead_lettered_at IS NOT NULL;

-- The consumer inbox: (consumer, message id) pairs already processed.
CREATE TABLE IF NOT EXISTS "inbox" (
    consumer     VARCHAR(255)  NOT NULL,
    message_id   VARCHAR(255)  NOT NULL,
    received_at  TIMESTAMPTZ   NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);

CREATE INDEX IF NOT EXISTS "inbox_received_at_idx" ON "inbox" (received_at);
