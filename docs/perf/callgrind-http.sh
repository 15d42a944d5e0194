#!/usr/bin/env bash
# Instructions per HTTP request of the release demo (PostgreSQL + Redis), counted by callgrind:
# stable on a shared, noisy machine, where wall-clock figures are not.
#
#   docs/perf/callgrind-http.sh [OUT_DIR] [REQUESTS]
#
# Starts the demo under `valgrind --tool=callgrind`, warms each scenario up (connections open,
# the replayed key in L1), zeroes the counters, sends REQUESTS requests (default 2000, 4
# clients) of one scenario, dumps, and prints the demo's instructions per request
# (`Ir / REQUESTS`, background tasks included: the relay's poll, the cleanup timer) for:
# `unprotected` (POST /api/payments/unprotected), `validate` (POST /api/payments/validate: the
# same request's extraction and checks, no idempotency: the replay's floor), `first` (fresh
# keys), `replay` (one key), and
# `v2replay` (replays of one key of POST /v2/payments, behind IdempotencyLayer, sent by curl over
# one connection). SCENARIOS="replay v2replay" picks some. Only the demo process is counted:
# PostgreSQL's and Redis's own work is not.
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:-${CARGO_TARGET_DIR:-target}/callgrind}"
requests="${2:-2000}"
mkdir -p "$out"
source scripts/services.sh
ensure_services
target="${BIN_DIR:-$(cd "${CARGO_TARGET_DIR:-target}" && pwd)/release}"
admin="${DATABASE_URL%/*}/postgres"
db="idempotency_callgrind_$$"
psql "$admin" -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)"
psql "$admin" -qc "CREATE DATABASE $db"
port=$((18200 + $$ % 500))
env DATABASE_URL="${DATABASE_URL%/*}/$db" REDIS_URL="$REDIS_URL" \
  SERVER__PORT="$port" DEMO_CONFIG="$PWD/demo/config/demo.yaml" RUST_LOG=warn \
  IDEMPOTENCY__DISTRIBUTED_CACHE__KEY_PREFIX="idempotency:callgrind:$$:" \
  valgrind --tool=callgrind --callgrind-out-file="$out/callgrind.%p.out" \
  "$target/idempotency-demo" > "$out/demo.log" 2>&1 &
demo_pid=$!
trap 'kill "$demo_pid" 2>/dev/null || true; psql "$admin" -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" || true' EXIT
for _ in $(seq 1 600); do curl -fs "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break; sleep 0.5; done
client() { "$target/idempotency-load" --url "http://127.0.0.1:$port" --clients 4 --json "$@"; }
# POST /v2/payments COUNT times with one key, over one connection.
v2() {
  local config="$out/v2.curl"
  : > "$config"
  for _ in $(seq 1 "$1"); do printf 'url = "http://127.0.0.1:%s/v2/payments"\noutput = "/dev/null"\n' "$port" >> "$config"; done
  curl -s -o /dev/null -w '%{http_code}\n' -H 'idempotency-key: callgrind-v2-key' \
    -H 'content-type: application/json' \
    -d '{"orderId":"o-1","recipient":"alice","amount":"100.00"}' -K "$config" | sort | uniq -c
}
for name in ${SCENARIOS:-unprotected validate first replay v2replay}; do
  case "$name" in
    unprotected) args=(--endpoint unprotected) ;;
    validate) args=(--endpoint validate) ;;
    first) args=(--fresh) ;;
    replay) args=(--replay "callgrind-replay-key") ;;
  esac
  if [ "$name" = v2replay ]; then
    v2 200 > "$out/warm-$name.txt"
    callgrind_control -z "$demo_pid" > /dev/null
    v2 "$requests" > "$out/run-$name.txt"
  else
    client --requests 200 "${args[@]}" > "$out/warm-$name.json"
    callgrind_control -z "$demo_pid" > /dev/null
    client --requests "$requests" "${args[@]}" > "$out/run-$name.json"
  fi
  callgrind_control -d "$name" "$demo_pid" > /dev/null
  sleep 1
  dump="$(ls -t "$out"/callgrind."$demo_pid".out.* | head -1)"
  mv "$dump" "$out/$name.callgrind"
  ir="$(callgrind_annotate "$out/$name.callgrind" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1; exit}')"
  echo "$name: $((ir / requests)) instructions per request ($ir over $requests requests)"
done
