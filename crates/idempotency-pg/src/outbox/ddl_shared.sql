-- The outbox's companions, after its table in both layouts (ddl.sql, ddl_partitioned.sql):
-- the per-aggregate counters and the indexes the relay's queries rely on.

-- One counter row per aggregate, locked by the enqueueing transaction until it ends:
-- writers of one aggregate are serialized, so sequence order is commit order.
CREATE TABLE IF NOT EXISTS {sequences} (
    aggregate_type  VARCHAR(255)  NOT NULL,
    aggregate_id    VARCHAR(255)  NOT NULL,
    last_sequence   BIGINT        NOT NULL,
    PRIMARY KEY (aggregate_type, aggregate_id)
);

-- The claim: an index scan over pending rows only, however many published rows the table holds.
CREATE INDEX IF NOT EXISTS {pending_index} ON {table} (next_attempt_at)
    WHERE published_at IS NULL AND dead_lettered_at IS NULL;

-- Per-aggregate order: the first pending row of an aggregate.
CREATE INDEX IF NOT EXISTS {aggregate_index} ON {table} (aggregate_type, aggregate_id, sequence)
    WHERE published_at IS NULL AND dead_lettered_at IS NULL;

-- Retention.
CREATE INDEX IF NOT EXISTS {published_index} ON {table} (published_at)
    WHERE published_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS {dead_letter_index} ON {table} (dead_lettered_at)
    WHERE dead_lettered_at IS NOT NULL;
