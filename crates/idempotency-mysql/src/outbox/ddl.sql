-- Canonical DDL of the transactional outbox on MySQL 8.0.16+ / MariaDB 10.6+ (InnoDB).
-- {table} and {sequences} are replaced by the configured, validated and backtick-quoted names.
-- Ids and claim tokens are UUIDs as BINARY(16) (v7 ids sort by time).
-- Times are DATETIME(6) in UTC, from UTC_TIMESTAMP(6).
-- payload and headers are text checked with json_valid, not JSON: MySQL's JSON type
-- normalizes (keys reordered, numbers rewritten), and consumers get the bytes written.
-- There are no partial indexes: pending rows are those with both published_at and
-- dead_lettered_at NULL, so an index leading with those two columns finds them first.
CREATE TABLE IF NOT EXISTS {table} (
    id                BINARY(16)    NOT NULL,
    aggregate_type    VARCHAR(255)  CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    aggregate_id      VARCHAR(255)  CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    sequence          BIGINT        NULL,
    event_type        VARCHAR(255)  CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    payload           LONGTEXT      CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL
                      CHECK (json_valid(payload)),
    headers           MEDIUMTEXT    CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL
                      CHECK (json_valid(headers)),
    created_at        DATETIME(6)   NOT NULL,
    attempts          INT           NOT NULL DEFAULT 0,
    next_attempt_at   DATETIME(6)   NOT NULL,
    claim_token       BINARY(16)    NULL,
    last_error        VARCHAR(1000) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    published_at      DATETIME(6)   NULL,
    dead_lettered_at  DATETIME(6)   NULL,
    PRIMARY KEY (id),
    -- The claim (pending rows by next_attempt_at) and retention (published rows by published_at).
    INDEX pending_idx (published_at, dead_lettered_at, next_attempt_at),
    -- Per-aggregate order: the first pending row of an aggregate.
    INDEX aggregate_idx (aggregate_type, aggregate_id, published_at, dead_lettered_at, sequence),
    INDEX dead_letter_idx (dead_lettered_at),
    CHECK (published_at IS NULL OR dead_lettered_at IS NULL)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- One counter row per aggregate. Enqueue bumps it in the writer's transaction and holds its
-- row lock until commit, so sequence order is commit order. Kept when retention deletes rows.
CREATE TABLE IF NOT EXISTS {sequences} (
    aggregate_type  VARCHAR(255)  CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    aggregate_id    VARCHAR(255)  CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    last_sequence   BIGINT        NOT NULL,
    PRIMARY KEY (aggregate_type, aggregate_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
