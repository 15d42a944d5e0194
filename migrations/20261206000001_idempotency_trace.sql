-- The span of the execution that stored each record (issue 47): trace_id (32 lower-case hex
-- digits) and span_id (16), written at completion when the service is built with the `otel`
-- feature inside a sampled span, NULL otherwise; a replay's span carries an OpenTelemetry span
-- link to it. Existing rows keep NULL (their replays carry no link). Adding nullable columns
-- without a default is a catalog change on PostgreSQL 11+ (no table rewrite), under a brief
-- ACCESS EXCLUSIVE lock. Idempotent. For another table name, run it with that name.
ALTER TABLE "idempotency_records" ADD COLUMN IF NOT EXISTS trace_id VARCHAR(32),
                                  ADD COLUMN IF NOT EXISTS span_id VARCHAR(16);
