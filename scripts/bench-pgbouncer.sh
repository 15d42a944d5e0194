#!/usr/bin/env bash
# The cost of PgBouncer (pool_mode = transaction, `persistence.pooler: transaction`) against a
# direct connection, in one run: the demo twice on the same PostgreSQL (a fresh database each),
# once direct and once through PgBouncer, each under the same load (CLIENTS clients, a fresh key
# per request, POST /charges: a record, a charge and an outbox event per request) for SECONDS.
# Prints both reports and the ratio. Uses the servers of scripts/services.sh.
#
#   scripts/bench-pgbouncer.sh          # CLIENTS=16 SECONDS_EACH=10 PROFILE=debug|release BIN_DIR=
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/services.sh
ensure_postgres
ensure_pgbouncer
ensure_tools jq curl python3
CLIENTS="${CLIENTS:-16}" SECONDS_EACH="${SECONDS_EACH:-10}" PROFILE="${PROFILE:-release}"
port="${BENCH_DEMO_PORT:-18460}"
if [ -z "${BIN_DIR:-}" ]; then
  flag=(); [ "$PROFILE" = release ] && flag=(--release)
  cargo build -q "${flag[@]}" -p idempotency-demo -p idempotency-load
  BIN_DIR="$(cd "${CARGO_TARGET_DIR:-target}" && pwd)/$PROFILE"
fi
admin="${DATABASE_URL%/*}/postgres"
work="$(mktemp -d)"
demo_pid=""
cleanup() {
  [ -n "$demo_pid" ] && kill "$demo_pid" 2>/dev/null && wait "$demo_pid" 2>/dev/null
  psql "$admin" -qc "DROP DATABASE IF EXISTS idempotency_bench_direct WITH (FORCE)" 2>/dev/null
  psql "$admin" -qc "DROP DATABASE IF EXISTS idempotency_bench_bouncer WITH (FORCE)" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
run() { # NAME URL [VAR=value...]
  local name=$1 url=$2
  shift 2
  psql "$admin" -qc "DROP DATABASE IF EXISTS idempotency_bench_$name WITH (FORCE)"
  psql "$admin" -qc "CREATE DATABASE idempotency_bench_$name"
  env -u REDIS_URL -u NATS_URL RUST_LOG=warn DATABASE_URL="$url/idempotency_bench_$name" \
    SERVER__PORT="$port" DEMO_CONFIG="$PWD/demo/config/demo.yaml" "$@" "$BIN_DIR/idempotency-demo" \
    >"$work/$name.log" 2>&1 &
  demo_pid=$!
  for _ in $(seq 1 150); do curl -fs "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break; sleep 0.2; done
  "$BIN_DIR/idempotency-load" --url "http://127.0.0.1:$port" --endpoint charges --clients "$CLIENTS" \
    --fresh --duration "${SECONDS_EACH}s" --json >"$work/$name.json"
  kill "$demo_pid"; wait "$demo_pid" 2>/dev/null || true; demo_pid=""
  jq -r --arg n "$name" '"\($n): \(.requests) requests, \(.ops_per_s | floor) ops/s, p50 \(.latency_ms.p50) ms, p99 \(.latency_ms.p99) ms, statuses \(.statuses | tojson)"' "$work/$name.json"
}
run direct "${DATABASE_URL%/*}"
run bouncer "${PGBOUNCER_URL%/*}" IDEMPOTENCY__PERSISTENCE__POOLER=transaction OUTBOX__RELAY__WAKE_UP=poll
python3 - "$work" <<'PY'
import json, sys
d = json.load(open(f"{sys.argv[1]}/direct.json")); b = json.load(open(f"{sys.argv[1]}/bouncer.json"))
print(f"through PgBouncer / direct: throughput {b['ops_per_s'] / d['ops_per_s']:.2f}x, "
      f"p50 {b['latency_ms']['p50'] / d['latency_ms']['p50']:.2f}x, p99 {b['latency_ms']['p99'] / d['latency_ms']['p99']:.2f}x")
PY
