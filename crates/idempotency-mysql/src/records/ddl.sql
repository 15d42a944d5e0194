-- Canonical DDL of the idempotency records table (MySQL 8.0.16+, MariaDB 10.6+, InnoDB).
-- {table} is replaced by the configured, validated and backtick-quoted name.
-- Key columns use utf8mb4_bin: the default collations (utf8mb4_general_ci, utf8mb4_0900_ai_ci)
-- are case-insensitive and would make `Key` and `key` one record.
-- Times are DATETIME(6) in UTC, from UTC_TIMESTAMP(6).
-- result_payload is LONGTEXT checked with json_valid, not JSON: MySQL's JSON type stores a
-- normalized binary form (keys reordered, numbers rewritten), so replays would not be
-- byte-identical. Index names are per table in MySQL, so they need no table prefix; MySQL
-- names the CHECK constraints `<table>_chk_<n>` (unique per database, at most 64 bytes).
-- trace_id and span_id name the span of the execution that stored the outcome (feature otel),
-- lower-case hex, for the span link of its replays; NULL without it.
CREATE TABLE IF NOT EXISTS {table} (
    operation        VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    scope            VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL DEFAULT '',
    idempotency_key  VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    request_hash     VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    status           VARCHAR(32)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL
                     CHECK (status IN ('PROCESSING', 'COMPLETED', 'REJECTED')),
    result_payload   LONGTEXT     CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL
                     CHECK (result_payload IS NULL OR json_valid(result_payload)),
    error_code       VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    created_at       DATETIME(6)  NOT NULL,
    completed_at     DATETIME(6)  NULL,
    expires_at       DATETIME(6)  NULL,
    trace_id         VARCHAR(32)  CHARACTER SET ascii COLLATE ascii_bin NULL,
    span_id          VARCHAR(16)  CHARACTER SET ascii COLLATE ascii_bin NULL,
    PRIMARY KEY (operation, scope, idempotency_key),
    INDEX expires_at_idx (expires_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
