-- Canonical DDL of the idempotency records table (SQLite 3.37+: STRICT table, RETURNING).
-- {table}, {expires_index} and {lease_counter} are replaced by the configured, validated and
-- quoted names. lease_token, lease_expires_at and the counter serve leased claims
-- (LeasedClaims, the layer's leased mode); other records leave them NULL.
-- Times are INTEGER milliseconds since the Unix epoch (UTC), from the database clock.
-- result_payload is JSON text, stored exactly as the serializer wrote it.
-- trace_id and span_id name the span of the execution that stored the outcome (feature otel),
-- lower-case hex, for the span link of its replays; NULL without it.
CREATE TABLE IF NOT EXISTS {table} (
    operation        TEXT    NOT NULL CHECK (length(operation) <= 128),
    scope            TEXT    NOT NULL DEFAULT '' CHECK (length(scope) <= 255),
    idempotency_key  TEXT    NOT NULL CHECK (length(idempotency_key) <= 255),
    request_hash     TEXT    NOT NULL CHECK (length(request_hash) <= 128),
    status           TEXT    NOT NULL CHECK (status IN ('PROCESSING', 'COMPLETED', 'REJECTED')),
    result_payload   TEXT    CHECK (json_valid(result_payload)),
    error_code       TEXT    CHECK (length(error_code) <= 128),
    created_at       INTEGER NOT NULL,
    completed_at     INTEGER,
    expires_at       INTEGER,
    lease_token      INTEGER,
    lease_expires_at INTEGER,
    trace_id         TEXT,
    span_id          TEXT,
    PRIMARY KEY (operation, scope, idempotency_key)
) STRICT;

CREATE INDEX IF NOT EXISTS {expires_index} ON {table} (expires_at) WHERE expires_at IS NOT NULL;

CREATE TABLE IF NOT EXISTS {lease_counter} (
    id    INTEGER PRIMARY KEY CHECK (id = 1),
    last  INTEGER NOT NULL
) STRICT;

INSERT INTO {lease_counter} (id, last) VALUES (1, 0) ON CONFLICT (id) DO NOTHING;
