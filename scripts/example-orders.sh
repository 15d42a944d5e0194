#!/usr/bin/env bash
# Runs the facade's SQLite example as a user would (crates/idempotency/examples/orders_sqlite.rs
# with its orders.yaml) and checks over HTTP that a retried POST replays the first answer.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build -q -p idempotency --features sqlite,axum --example orders_sqlite
target="$(cargo metadata --no-deps --format-version 1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
work="$(mktemp -d)"
(cd "$work" && exec "$target/debug/examples/orders_sqlite") >"$work/log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 1 100); do
  # Any HTTP answer means the example listens.
  curl -sS -o /dev/null -X POST localhost:3000/orders 2>/dev/null && break
  if ! kill -0 "$pid" 2>/dev/null; then cat "$work/log"; exit 1; fi
  sleep 0.1
done
post() {
  # The example scopes keys by the authenticated caller (its stand-in: a bearer token).
  curl -sS -D - -o "$work/body" -X POST localhost:3000/orders -H 'Authorization: Bearer alice-token' \
    -H 'Idempotency-Key: example-1' -H 'Content-Type: application/json' -d "$1"
}
first="$(post '{"sku":"A-1"}')"
second="$(post '{"sku":"A-1"}')"
reused="$(post '{"sku":"B-2"}')"
grep -q '^HTTP/1.1 200' <<<"$first" || { echo "first: $first"; exit 1; }
grep -qi '^idempotent-replayed: true' <<<"$first" && { echo "first was a replay"; exit 1; }
grep -qi '^idempotent-replayed: true' <<<"$second" || { echo "second: $second"; exit 1; }
grep -q '^HTTP/1.1 422' <<<"$reused" || { echo "reused key: $reused"; exit 1; }
rows="$(python3 -c 'import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute("select count(*) from orders").fetchone()[0])' "$work/orders.db")"
[ "$rows" = 1 ] || { echo "orders rows: $rows"; exit 1; }
echo "example orders_sqlite: first 200, retry replayed, reused key 422, one order row    ok"
