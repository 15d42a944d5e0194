#!/usr/bin/env bash
# 200 concurrent clients send 20 distinct keys for 30 s to the demo on PostgreSQL.
#
# Guarantees checked (exit 1 if any fails):
#   - exactly 20 business executions: 20 payment rows (one per key, order_id = key) with 20
#     distinct paymentIds, and exactly 20 answers that were 201 without Idempotent-Replayed;
#   - every key saw one paymentId, the one in the database;
#   - every other answer is a replay (201 + Idempotent-Replayed: true) or a 409 in flight;
#   - no 5xx, no timeout, no connection error.
#
# It needs no private server (nothing is killed): a fresh database on the shared PostgreSQL,
# dropped at the end. Also measured: the GET /health baseline at the same concurrency.
#
#   scripts/chaos/load.sh                      # CLIENTS=200 KEYS=20 DURATION=30s
SCRIPT=load
source "$(dirname "$0")/lib.sh"
CLIENTS="${CLIENTS:-200}"
KEYS="${KEYS:-20}"
DURATION="${DURATION:-30s}"
need psql jq curl

build
db_url="$(shared_fresh_db "idempotency_chaos_load_$$")"
demo_start "$db_url"
say "demo on $DEMO_URL, database $db_url"

say "baseline: GET /health, $CLIENTS clients, 5 s"
load health --endpoint health --clients "$CLIENTS" --duration 5s
summary health

say "POST /api/payments: $CLIENTS clients, $KEYS distinct keys, $DURATION"
load payments --clients "$CLIENTS" --keys "$KEYS" --duration "$DURATION" --key-prefix "load-$RUN_ID"
summary payments

rows=$(psql "$db_url" -Atc "SELECT count(*) FROM payments")
distinct_rows=$(psql "$db_url" -Atc "SELECT count(DISTINCT payment_id) FROM payments")
per_key_max=$(psql "$db_url" -Atc "SELECT coalesce(max(n), 0) FROM (SELECT count(*) n FROM payments GROUP BY order_id) t")
requests=$(j payments .requests)
created=$(j payments '.statuses["201"] // 0')
conflicts=$(j payments '.statuses["409"] // 0')
in_flight=$(j payments '.problems["409 request-in-flight"] // 0')
replayed=$(j payments .replayed)
executed=$(j payments .keys.executed)
echo
say "database: $rows payment rows, $distinct_rows distinct payment ids, at most $per_key_max per key"
say "answers: $requests = $created x 201 ($executed executions, $replayed replays) + $conflicts x 409 ($in_flight in flight)"

check "$((rows == KEYS))" "$KEYS payment rows ($rows)"
check "$((distinct_rows == KEYS && per_key_max == 1))" "one row per key, $KEYS distinct paymentIds"
check "$((executed == KEYS))" "$KEYS answers were executions, 201 without Idempotent-Replayed ($executed)"
check "$(j payments '.keys.distinct == '"$KEYS"' and .keys.keys_with_several_payment_ids == 0 and .keys.distinct_payment_ids == '"$KEYS"' | if . then 1 else 0 end')" \
  "each of the $KEYS keys saw exactly one paymentId"
check "$((created + conflicts == requests))" "every answer is a 201 or a 409 (others: $(j payments '.statuses | del(.["201"], .["409"]) | tojson'))"
check "$((created - executed == replayed))" "every other 201 carried Idempotent-Replayed: true ($replayed of $((created - executed)))"
check "$((conflicts == in_flight))" "every 409 is request-in-flight"
check "$(j payments '.server_errors == 0 | if . then 1 else 0 end')" "no 5xx"

check_same "the paymentId every key saw is the stored one" \
  <(psql "$db_url" -Atc "SELECT order_id || ' ' || payment_id FROM payments" | LC_ALL=C sort) \
  <(jq -r '.key + " " + (.payment_ids | join(","))' "$WORK/payments.keys.jsonl" | LC_ALL=C sort)
finish
