-- SQLite (idempotency-sqlite): the span of the execution that stored each record (issue 47),
-- for a records table created before the columns existed (by `schema create` or by a copy of
-- the crate's DDL in your migrations). trace_id (32 lower-case hex digits) and span_id (16) are
-- written at completion when the service is built with the `otel` feature inside a sampled
-- span, NULL otherwise; a replay's span carries an OpenTelemetry span link to it. Existing rows
-- keep NULL. SQLite has no ADD COLUMN IF NOT EXISTS: apply it once (`schema create` adds the
-- columns itself when they are missing). For another table name, run it with that name.
ALTER TABLE "idempotency_records" ADD COLUMN trace_id TEXT;
ALTER TABLE "idempotency_records" ADD COLUMN span_id TEXT;
