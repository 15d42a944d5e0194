-- MySQL 8 / MariaDB 10.6+ (idempotency-mysql): the span of the execution that stored each
-- record (issue 47), for a records table created before the columns existed (by `schema
-- create` or by a copy of the crate's DDL in your migrations). trace_id (32 lower-case hex
-- digits) and span_id (16) are written at completion when the service is built with the `otel`
-- feature inside a sampled span, NULL otherwise; a replay's span carries an OpenTelemetry span
-- link to it. Existing rows keep NULL. An instant ADD COLUMN on MySQL 8.0.29+ / MariaDB 10.3+
-- (no table copy). MySQL has no ADD COLUMN IF NOT EXISTS: apply it once (`schema create` adds
-- the columns itself when they are missing). For another table name, run it with that name.
ALTER TABLE `idempotency_records`
    ADD COLUMN trace_id VARCHAR(32) CHARACTER SET ascii COLLATE ascii_bin NULL,
    ADD COLUMN span_id VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NULL;
