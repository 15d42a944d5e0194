-- Canonical DDL of the consumer inbox on MySQL 8 / MariaDB 10.6+ (InnoDB).
-- {inbox} is replaced by the configured, validated and backtick-quoted name.
-- received_at is DATETIME(6) in UTC, from UTC_TIMESTAMP(6).
CREATE TABLE IF NOT EXISTS {inbox} (
    consumer     VARCHAR(255)  CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    message_id   VARCHAR(255)  CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    received_at  DATETIME(6)   NOT NULL,
    PRIMARY KEY (consumer, message_id),
    INDEX received_at_idx (received_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
