#!/usr/bin/env bash
# Runs the facade's complete example (crates/idempotency/examples/orders_production.rs with its
# orders.yaml) against the real PostgreSQL, Redis and NATS JetStream, as a user would, and checks
# over HTTP: a retry replays the first answer, a reused key with another body is 422, 20
# concurrent duplicates make one order row, each order's event arrives on NATS, /metrics
# answers, /health/live and /health/ready answer (broker up), SIGTERM shuts it down
# gracefully. Also checks the example's size (issue 48): at most 40 lines of Rust outside its
# business handler, and the whole service (handler included) under 70, where the same service
# wired by hand took 154 (non-blank, non-comment lines).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/services.sh
source scripts/services.sh
ensure_postgres
ensure_redis
ensure_nats

example=crates/idempotency/examples/orders_production.rs
wiring="$(sed '/BEGIN business/,/END business/d' "$example" | grep -cvE '^\s*(//|$)')"
[ "$wiring" -le 40 ] || { echo "$example: $wiring lines of wiring (at most 40)"; exit 1; }
whole="$(grep -cvE '^\s*(//|$)' "$example")"
[ "$whole" -lt 70 ] || { echo "$example: $whole lines in all (under 70)"; exit 1; }

cargo build -q -p idempotency --features postgres,moka,redis,metrics,nats,axum --example orders_production
target="$(cargo metadata --no-deps --format-version 1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"

run="ex$(date +%s)$$"
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
database="${DATABASE_URL%/*}/orders_$run"
psql -q "$DATABASE_URL" -c "CREATE DATABASE orders_$run"
work="$(mktemp -d)"
cleanup() {
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  psql -q "$DATABASE_URL" -c "DROP DATABASE IF EXISTS orders_$run" || true
  python3 scripts/nats_stream.py delete "ORDERS_$run" >/dev/null 2>&1 || true
  rm -rf "$work"
}
pid=""
trap cleanup EXIT

# Everything else comes from orders.yaml: the run's own database, stream, subjects and port.
APP__LISTEN="127.0.0.1:$port" APP__DATABASE_URL="$database" \
  IDEMPOTENCY__DISTRIBUTED_CACHE__URL="${REDIS_URL:-redis://127.0.0.1:6379}" \
  IDEMPOTENCY__DISTRIBUTED_CACHE__SECRET="example-secret-of-at-least-32-bytes-$run" \
  OUTBOX__PUBLISHER__NATS__URL="${NATS_URL:-nats://127.0.0.1:4222}" \
  OUTBOX__PUBLISHER__NATS__STREAM__NAME="ORDERS_$run" \
  OUTBOX__PUBLISHER__NATS__SUBJECT="orders_$run.{aggregate_type}.{event_type}" \
  RUST_LOG=info "$target/debug/examples/orders_production" >"$work/log" 2>&1 &
pid=$!
base="http://127.0.0.1:$port"
for _ in $(seq 1 300); do
  curl -sS -o /dev/null "$base/metrics" 2>/dev/null && break
  if ! kill -0 "$pid" 2>/dev/null; then cat "$work/log"; exit 1; fi
  sleep 0.1
done

post() { # key body
  curl -sS -D - -o /dev/null -X POST "$base/orders" -H 'X-Tenant-Id: alice' \
    -H "Idempotency-Key: $1" -H 'Content-Type: application/json' -d "$2"
}
fail() { echo "$1"; cat "$work/log"; exit 1; }
first="$(post k-1 '{"sku":"A-1"}')"
second="$(post k-1 '{"sku":"A-1"}')"
reused="$(post k-1 '{"sku":"B-2"}')"
grep -q '^HTTP/1.1 200' <<<"$first" || fail "first: $first"
grep -qi '^idempotent-replayed: true' <<<"$first" && fail "first was a replay"
grep -qi '^idempotent-replayed: true' <<<"$second" || fail "second: $second"
grep -q '^HTTP/1.1 422' <<<"$reused" || fail "reused key: $reused"

# 20 concurrent duplicates of a new key: one order.
duplicates=()
for i in $(seq 1 20); do
  post k-2 '{"sku":"C-3"}' >"$work/dup.$i" &
  duplicates+=("$!")
done
wait "${duplicates[@]}"
ok="$(grep -l '^HTTP/1.1 200' "$work"/dup.* | wc -l)"
[ "$ok" -ge 1 ] || fail "no duplicate answered 200"
rows() { psql -tAq "$database" -c "SELECT count(*) FROM orders WHERE body = '$1'"; }
[ "$(rows '{"sku":"A-1"}')" = 1 ] || fail "orders rows for k-1: $(rows '{"sku":"A-1"}')"
[ "$(rows '{"sku":"C-3"}')" = 1 ] || fail "orders rows for k-2: $(rows '{"sku":"C-3"}')"

# Each order's event on NATS: the stream holds exactly two, on the order subjects.
for _ in $(seq 1 100); do
  events="$(python3 scripts/nats_stream.py count "ORDERS_$run")"
  [ "$events" -ge 2 ] && break
  sleep 0.1
done
[ "$events" = 2 ] || fail "events in the stream: $events"
subject="$(python3 scripts/nats_stream.py subject "ORDERS_$run" 1)"
[ "$subject" = "orders_$run.order.OrderCreated" ] || fail "event subject: $subject"

# Read whole before grepping: `grep -q` stops at the first match, and under pipefail the
# curl it closed the pipe on (exit 23, "Failed writing body") would fail the check.
metrics="$(curl -sS "$base/metrics")" || fail "/metrics"
grep -q '^idempotency_' <<<"$metrics" || fail "/metrics has no idempotency meters"
ready="$(curl -sS -w ' %{http_code}' "$base/health/ready")"
[ "${ready##* }" = 200 ] || fail "/health/ready: $ready"
grep -q '"broker":{[^}]*"status":"UP"' <<<"$ready" || fail "/health/ready has no broker UP: $ready"
curl -sSf -o /dev/null "$base/health/live" || fail "/health/live"

kill -TERM "$pid"
for _ in $(seq 1 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$pid" 2>/dev/null && fail "still running 15 s after SIGTERM"
wait "$pid" || fail "exited with $? after SIGTERM"
grep -q 'stopped' "$work/log" || fail "no shutdown report in the log"
echo "example orders_production ($wiring lines of wiring, $whole in all): replayed, 422 on reuse, 20 duplicates -> one row, 2 events on NATS, /metrics, /health ready, SIGTERM    ok"
