-- Canonical DDL of the consumer inbox on SQLite (3.37+: STRICT tables).
-- {inbox} and {inbox_index} are replaced by the configured, validated and quoted names.
-- received_at is INTEGER milliseconds since the Unix epoch (UTC), from the database clock.
CREATE TABLE IF NOT EXISTS {inbox} (
    consumer     TEXT     NOT NULL CHECK (length(consumer) BETWEEN 1 AND 255),
    message_id   TEXT     NOT NULL CHECK (length(message_id) BETWEEN 1 AND 255),
    received_at  INTEGER  NOT NULL,
    PRIMARY KEY (consumer, message_id)
) STRICT, WITHOUT ROWID;

CREATE INDEX IF NOT EXISTS {inbox_index} ON {inbox} (received_at);
