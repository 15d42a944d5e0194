#!/usr/bin/env bash
# The demo with a PRIVATE Redis as its L2 cache (timeout 50 ms), under load (20 clients, a
# fresh key per request, so that every request reads Redis after missing the in-process L1),
# on a private PostgreSQL.
#
#   (a) fail-open, Redis killed (SIGKILL):  the demo keeps serving, latency bounded;
#   (b) fail-open, Redis hanging (SIGSTOP): the same;
#   (c) fail-fast, Redis killed, then hanging: 503 cache-unavailable problems and the action
#       does not run (the payment rows do not change).
#
# Bound for (a) and (b): p99 <= baseline p99 + 2 x timeout + 50 ms. A request reads Redis
# before the action and writes it after the commit, each call bounded by the timeout (50 ms);
# once the circuit breaker opens (5 failures) Redis is not called at all for its 5 s cool-down.
# Exit 1 if a guarantee fails.
#
#   scripts/chaos/redis.sh                     # CLIENTS=20 PHASE_SECONDS=10 TIMEOUT_MS=50
SCRIPT=redis
source "$(dirname "$0")/lib.sh"
CLIENTS="${CLIENTS:-20}"
PHASE_SECONDS="${PHASE_SECONDS:-10}"
TIMEOUT_MS="${TIMEOUT_MS:-50}"
MARGIN_MS="${MARGIN_MS:-50}"
need psql jq curl redis-cli

build
pg_private_start
db_url="$PG_URL/demo"
redis_private_start
cache_env=(REDIS_URL="redis://127.0.0.1:$CHAOS_REDIS_PORT"
  IDEMPOTENCY__DISTRIBUTED_CACHE__TIMEOUT="${TIMEOUT_MS}ms")

# Waits until the demo reports its Redis connection UP again.
wait_cache_up() {
  for _ in $(seq 1 100); do
    [ "$(curl -s "$DEMO_URL/health" | jq -r .cache.status)" = UP ] && return 0
    sleep 0.2
  done
  violation "the demo did not reconnect to Redis within 20 s"
}
rows() { psql "$db_url" -Atc "SELECT count(*) FROM payments"; }
phase() { # NAME: fresh keys for PHASE_SECONDS (or $2)
  load "$1" --clients "$CLIENTS" --fresh --duration "${2:-${PHASE_SECONDS}s}" --timeout 5s \
    --key-prefix "redis-$1-$RUN_ID"
  summary "$1"
}
p99() { j "$1" .latency_ms.p99; }
all_201() { # NAME WHAT
  check "$(j "$1" '(.statuses | keys) == ["201"] | if . then 1 else 0 end')" "$2: every request succeeded (201)"
}
bounded() { # NAME BOUND
  check "$(jq -n "$(p99 "$1") <= $2 | if . then 1 else 0 end")" \
    "$1: p99 $(p99 "$1") ms <= $2 ms (max $(j "$1" .latency_ms.max) ms)"
}

demo_start "$db_url" "${cache_env[@]}" IDEMPOTENCY__DISTRIBUTED_CACHE__FAILURE_POLICY=fail-open
say "demo on $DEMO_URL: fail-open, Redis timeout ${TIMEOUT_MS} ms"
wait_cache_up
say "baseline: Redis up"
phase baseline
all_201 baseline baseline
bound=$(jq -n "($(p99 baseline) + 2 * $TIMEOUT_MS + $MARGIN_MS) * 10 | round / 10")

echo
say "(a) fail-open, Redis killed (SIGKILL)"
kill -KILL "$REDIS_PID"; wait "$REDIS_PID" 2>/dev/null || true
phase killed
all_201 killed "(a)"
bounded killed "$bound"
redis_private_start
wait_cache_up

echo
say "(b) fail-open, Redis hanging (SIGSTOP)"
sleep 6 # the breaker, opened in (a), lets a trial call through after its 5 s cool-down
phase warm 2s >/dev/null
kill -STOP "$REDIS_PID"
phase hanging
kill -CONT "$REDIS_PID"
all_201 hanging "(b)"
bounded hanging "$bound"

echo
say "(c) fail-fast"
demo_stop
demo_start "$db_url" "${cache_env[@]}" IDEMPOTENCY__DISTRIBUTED_CACHE__FAILURE_POLICY=fail-fast
wait_cache_up
sleep 1
phase fast-up 3s
all_201 fast-up "fail-fast with Redis up"

fail_fast_phase() { # NAME WHAT
  local before after
  before=$(rows)
  phase "$1" 5s
  after=$(rows)
  check "$(j "$1" '.statuses == {"503": .requests} and .problems == {"503 cache-unavailable": .requests} | if . then 1 else 0 end')" \
    "$2: every request answered 503 cache-unavailable ($(j "$1" '.problems | tojson'))"
  check "$(j "$1" '.server_errors_without_problem == 0 | if . then 1 else 0 end')" "$2: as application/problem+json"
  check "$((before == after))" "$2: the action did not run (payment rows $before before, $after after)"
  check "$(jq -n "$(p99 "$1") <= $TIMEOUT_MS + $MARGIN_MS | if . then 1 else 0 end")" \
    "$2: answered within the timeout: p99 $(p99 "$1") ms <= $((TIMEOUT_MS + MARGIN_MS)) ms (max $(j "$1" .latency_ms.max) ms)"
}
kill -KILL "$REDIS_PID"; wait "$REDIS_PID" 2>/dev/null || true
fail_fast_phase fast-killed "(c) Redis killed"
redis_private_start
wait_cache_up
# The breaker closes after its cool-down: wait until requests succeed again.
for _ in $(seq 1 30); do
  status=$(curl -s -o /dev/null -w '%{http_code}' -X POST "$DEMO_URL/api/payments" -H 'Content-Type: application/json' \
    -H "Idempotency-Key: redis-probe-$RUN_ID-$RANDOM" -d '{"orderId":"probe","recipient":"probe","amount":"1.00"}')
  [ "$status" = 201 ] && break
  sleep 0.5
done
check "$((status == 201))" "fail-fast serves again once Redis is back"
kill -STOP "$REDIS_PID"
fail_fast_phase fast-hanging "(c) Redis hanging"
kill -CONT "$REDIS_PID"
finish
