-- Canonical DDL of the idempotency records table (PostgreSQL 13+), for `sqlx migrate run`.
-- Generated from crates/idempotency-pg/src/ddl.sql; a test keeps the two equal.
CREATE TABLE IF NOT EXISTS "idempotency_records" (
    operation        VARCHAR(128) NOT NULL,
    scope            VARCHAR(255) NOT NULL DEFAULT '',
    idempotency_key  VARCHAR(255) NOT NULL,
    request_hash     VARCHAR(128) NOT NULL,
    status           VARCHAR(32)  NOT NULL CHECK (status IN ('PROCESSING', 'COMPLETED', 'REJECTED')),
    result_payload   JSONB,
    error_code       VARCHAR(128),
    created_at       TIMESTAMPTZ  NOT NULL DEFAULT now(),
    completed_at     TIMESTAMPTZ,
    expires_at       TIMESTAMPTZ,
    PRIMARY KEY (operation, scope, idempotency_key)
);

CREATE INDEX IF NOT EXISTS "idempotency_records_expires_at_idx" ON "idempotency_records" (expires_at) WHERE expires_at IS NOT NULL;
