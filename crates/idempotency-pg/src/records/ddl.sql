-- Canonical DDL of the idempotency records table (PostgreSQL 13+).
-- {table}, {expires_index} and {lease_sequence} are replaced by the configured, validated and
-- quoted names. lease_token, lease_expires_at and the sequence serve leased claims
-- (LeasedClaims, the layer's leased mode); other records leave them NULL. trace_id and span_id
-- name the span of the execution that stored the outcome (feature otel), for the span link of
-- its replays; NULL without it.
CREATE TABLE IF NOT EXISTS {table} (
    operation        VARCHAR(128) NOT NULL,
    scope            VARCHAR(255) NOT NULL DEFAULT '',
    idempotency_key  VARCHAR(255) NOT NULL,
    request_hash     VARCHAR(128) NOT NULL,
    status           VARCHAR(32)  NOT NULL CHECK (status IN ('PROCESSING', 'COMPLETED', 'REJECTED')),
    result_payload   JSON,
    error_code       VARCHAR(128),
    created_at       TIMESTAMPTZ  NOT NULL DEFAULT now(),
    completed_at     TIMESTAMPTZ,
    expires_at       TIMESTAMPTZ,
    lease_token      BIGINT,
    lease_expires_at TIMESTAMPTZ,
    trace_id         VARCHAR(32),
    span_id          VARCHAR(16),
    PRIMARY KEY (operation, scope, idempotency_key)
);

CREATE INDEX IF NOT EXISTS {expires_index} ON {table} (expires_at) WHERE expires_at IS NOT NULL;

CREATE SEQUENCE IF NOT EXISTS {lease_sequence};
