-- Canonical DDL of the consumer inbox (PostgreSQL 13+).
-- {inbox} and {inbox_index} are replaced by the configured, validated and quoted names.
CREATE TABLE IF NOT EXISTS {inbox} (
    consumer     VARCHAR(255)  NOT NULL,
    message_id   VARCHAR(255)  NOT NULL,
    received_at  TIMESTAMPTZ   NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);

CREATE INDEX IF NOT EXISTS {inbox_index} ON {inbox} (received_at);
