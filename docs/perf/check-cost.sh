#!/usr/bin/env bash
# What the records table's CHECK (status IN ('PROCESSING', 'COMPLETED', 'REJECTED')) costs
# PostgreSQL per first execution: N inserts + updates of the records table's shape in one
# backend (a PL/pgSQL loop: no client, no round trips), into a table with the CHECK and into
# the same table without it, in interleaved rounds. Prints each loop's elapsed milliseconds.
#
#   N=20000 ROUNDS=5 docs/perf/check-cost.sh      # DATABASE_URL, else the local test database
set -euo pipefail
db="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}"
n="${N:-20000}"
psql "$db" -q <<'SQL'
DROP SCHEMA IF EXISTS check_cost CASCADE;
CREATE SCHEMA check_cost;
CREATE TABLE check_cost.with_check (
    operation        VARCHAR(128) NOT NULL,
    scope            VARCHAR(255) NOT NULL,
    idempotency_key  VARCHAR(255) NOT NULL,
    request_hash     VARCHAR(128) NOT NULL,
    status           VARCHAR(32)  NOT NULL CHECK (status IN ('PROCESSING', 'COMPLETED', 'REJECTED')),
    result_payload   JSON,
    error_code       VARCHAR(128),
    created_at       TIMESTAMPTZ  NOT NULL DEFAULT now(),
    completed_at     TIMESTAMPTZ,
    expires_at       TIMESTAMPTZ,
    lease_token      BIGINT,
    lease_expires_at TIMESTAMPTZ,
    trace_id         VARCHAR(32),
    span_id          VARCHAR(16),
    PRIMARY KEY (operation, scope, idempotency_key)
);
-- The same columns, defaults, NOT NULLs and primary key; no CHECK.
CREATE TABLE check_cost.without_check (LIKE check_cost.with_check INCLUDING DEFAULTS INCLUDING INDEXES);
SQL
for round in $(seq 1 "${ROUNDS:-5}"); do
  for table in with_check without_check; do
    ms="$(psql "$db" -Atq 2>&1 <<SQL | sed -n 's/^NOTICE: *//p'
TRUNCATE check_cost.$table;
DO \$\$
DECLARE started timestamptz := clock_timestamp(); k text;
BEGIN
  FOR i IN 1..$n LOOP
    k := 'k-' || i;
    INSERT INTO check_cost.$table (operation, scope, idempotency_key, request_hash, status, expires_at)
      VALUES ('PAY', '', k, 'h', 'PROCESSING', now() + interval '1 day');
    UPDATE check_cost.$table SET status = 'COMPLETED', result_payload = '{"paymentId":1}', completed_at = now()
      WHERE operation = 'PAY' AND scope = '' AND idempotency_key = k;
  END LOOP;
  RAISE NOTICE '%', round((extract(epoch FROM clock_timestamp() - started) * 1000)::numeric, 1);
END \$\$;
SQL
)"
    echo "round $round: $table $ms ms for $n inserts + updates"
  done
done
psql "$db" -qc "DROP SCHEMA check_cost CASCADE"
