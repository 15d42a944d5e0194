#!/usr/bin/env bash
# The demo with a PRIVATE six-node Redis Cluster as its L2 cache (timeout 50 ms, breaker 5
# failures / 5 s cool-down), named as an operator would: REDIS_URL=redis-cluster://127.0.0.1:<the
# first master> (one seed, the node that dies in (a)). The in-process L1 is off, so that every
# request reads Redis and every replay comes from it. Fresh database on the shared PostgreSQL.
#
#   baseline  the keys spread over the three masters;
#   (a) fail-open, the seed master SIGKILLed under load (CLIENTS clients, fresh keys): no 5xx,
#       p99 <= baseline p99 + 2 x timeout + MARGIN_MS; after the replica is promoted
#       (cluster_state:ok) /health says cache UP, no cache error is counted any more, and
#       replays are served from Redis (distributed hits);
#   (b) fail-fast, another master SIGKILLed under load: only 201 and 503 cache-unavailable
#       problems, 503s during the failover only, then 201s again.
#
# Timeline figures (kill -> cluster_state:ok -> last cache error counted) come from a poller that
# samples the cluster, /health and /metrics every 100 ms. Exit 1 if a guarantee fails.
#
#   scripts/chaos/redis-cluster.sh             # CLIENTS=20 PHASE_SECONDS=20 TIMEOUT_MS=50
#   CHAOS_REDIS_CLUSTER_PORT=7300              # first of its six ports (bus ports + 10000)
#   REDIS_CLUSTER_NODE_TIMEOUT=2000            # cluster-node-timeout of its nodes, ms
SCRIPT=redis-cluster
source "$(dirname "$0")/lib.sh"
# shellcheck source=scripts/services.sh
source scripts/services.sh
CLIENTS="${CLIENTS:-20}"
PHASE_SECONDS="${PHASE_SECONDS:-20}"
KILL_AFTER="${KILL_AFTER:-4}"
TIMEOUT_MS="${TIMEOUT_MS:-50}"
MARGIN_MS="${MARGIN_MS:-50}"
BASE="${CHAOS_REDIS_CLUSTER_PORT:-7300}"
need psql jq curl redis-cli redis-server

build
db_url="$(shared_fresh_db "idempotency_chaos_cluster_$$")"
CLUSTER_DIR="$WORK/cluster"
for port in $(redis_cluster_ports "$BASE"); do require_free_port "$port" CHAOS_REDIS_CLUSTER_PORT; done
cleanup_later "redis_cluster_stop $BASE"
redis_cluster_start "$BASE" "$CLUSTER_DIR"
say "private Redis Cluster on $BASE-$((BASE + 5)) (cluster-node-timeout ${REDIS_CLUSTER_NODE_TIMEOUT:-2000} ms)"

# The ports of the masters that serve slots, the first one first.
masters() {
  redis-cli -p "$(live_port)" cluster nodes | awk '$3 ~ /master/ && $3 !~ /fail/ && NF > 8 { split($2, a, "[:@]"); print a[2] }' | sort -n
}
KILLED=()
live_port() {
  local port
  for port in $(redis_cluster_ports "$BASE"); do
    [[ " ${KILLED[*]} " == *" $port "* ]] && continue
    echo "$port"
    return
  done
}
kill_node() { # PORT: SIGKILL
  kill -KILL "$(cat "$CLUSTER_DIR/$1/redis.pid")"
  KILLED+=("$1")
}
metric() { demo_metric "$DEMO_URL" "$@"; } # NAME KIND-LABEL-FILTER: sum of a counter of /metrics
cache_errors() { metric idempotency_cache_errors_total 'level="distributed"'; }
l2_hits() { metric idempotency_lookup_hits_total 'level="distributed"'; }

# poll FILE PORT: every 100 ms "ms cluster_state(PORT) health_cache cache_errors" until killed.
poll() {
  while :; do
    printf '%s %s %s %s\n' "$(now_ms)" "$(redis_cluster_state "$2" || echo none)" \
      "$(curl -s -m 1 "$DEMO_URL/health" | jq -r .cache.status 2>/dev/null || echo none)" "$(cache_errors)"
    sleep 0.1
  done >"$1"
}
# timeline FILE KILLED_AT: sets OK_MS (kill -> cluster_state:ok), UP_MS (kill -> health UP for
# good), LAST_ERROR_MS (kill -> last increase of the cache error counter).
timeline() {
  read -r OK_MS UP_MS LAST_ERROR_MS < <(awk -v t0="$2" '
    $1 < t0 { prev = $4; next }
    { if ($2 == "ok" && ok == "") ok = $1 - t0; if ($2 != "ok") ok = "" }
    { if ($3 == "UP" && up == "") up = $1 - t0; if ($3 != "UP") up = "" }
    { if ($4 > prev) last = $1 - t0; prev = $4 }
    END { print (ok == "" ? -1 : ok), (up == "" ? -1 : up), (last == "" ? 0 : last) }' "$1")
}

phase() { # NAME SECONDS [load args]
  local name=$1 seconds=$2
  shift 2
  load "$name" --clients "$CLIENTS" --duration "${seconds}s" --timeout 5s "$@"
  summary "$name"
}
fresh() { phase "$1" "$2" --fresh --key-prefix "cluster-$1-$RUN_ID"; }
p99() { j "$1" .latency_ms.p99; }
wait_cache_up() {
  for _ in $(seq 1 100); do
    [ "$(curl -s "$DEMO_URL/health" | jq -r .cache.status)" = UP ] && return 0
    sleep 0.2
  done
  violation "the demo did not report the cache UP within 20 s"
}
wait_cluster_ok() {
  for _ in $(seq 1 600); do
    [ "$(redis_cluster_state "$(live_port)")" = ok ] && [ "$(masters | wc -l)" = 3 ] && return 0
    sleep 0.1
  done
  violation "the cluster did not return to cluster_state:ok within 60 s"
}
cache_env=(IDEMPOTENCY__DISTRIBUTED_CACHE__TIMEOUT="${TIMEOUT_MS}ms"
  IDEMPOTENCY__LOCAL_CACHE__ENABLED=false)

mapfile -t first_masters < <(masters)
seed=${first_masters[0]}
demo_start "$db_url" REDIS_URL="redis-cluster://127.0.0.1:$seed" "${cache_env[@]}" \
  IDEMPOTENCY__DISTRIBUTED_CACHE__FAILURE_POLICY=fail-open
say "demo on $DEMO_URL: fail-open, REDIS_URL=redis-cluster://127.0.0.1:$seed, timeout ${TIMEOUT_MS} ms, L1 off"
wait_cache_up
fresh baseline 10
check "$(j baseline '(.statuses | keys) == ["201"] | if . then 1 else 0 end')" "baseline: every request succeeded (201)"
spread=()
for port in "${first_masters[@]}"; do spread+=("$port:$(redis-cli -p "$port" dbsize)"); done
say "keys per master: ${spread[*]}"
check "$(for s in "${spread[@]}"; do [ "${s#*:}" -gt 0 ] || echo 0; done | grep -q 0 && echo 0 || echo 1)" \
  "the keys spread over the three masters (${spread[*]})"
bound=$(jq -n "($(p99 baseline) + 2 * $TIMEOUT_MS + $MARGIN_MS) * 10 | round / 10")

echo
say "(a) fail-open: SIGKILL the seed master $seed after ${KILL_AFTER}s of a ${PHASE_SECONDS}s load"
poll "$WORK/poll-a.txt" "${first_masters[1]}" &
POLL_PID=$!
cleanup_later "kill $POLL_PID"
fresh failover-open "$PHASE_SECONDS" &
LOAD_PID=$!
sleep "$KILL_AFTER"
killed_at=$(now_ms)
kill_node "$seed"
wait "$LOAD_PID"
wait_cluster_ok
sleep 1
kill "$POLL_PID"
timeline "$WORK/poll-a.txt" "$killed_at"
say "timeline: cluster_state:ok after ${OK_MS} ms, health UP for good after ${UP_MS} ms, last cache error counted after ${LAST_ERROR_MS} ms"
check "$(j failover-open '(.statuses | keys) == ["201"] | if . then 1 else 0 end')" "(a) every request succeeded (201, no 5xx)"
check "$(jq -n "$(p99 failover-open) <= $bound | if . then 1 else 0 end")" \
  "(a) p99 $(p99 failover-open) ms <= $bound ms (max $(j failover-open .latency_ms.max) ms)"
check "$((OK_MS >= 0))" "(a) the replica was promoted (cluster_state:ok)"
wait_cache_up
errors_before=$(cache_errors)
fresh after-open 5
errors_after=$(cache_errors)
check "$((errors_after == errors_before))" "(a) after the failover no cache error is counted ($((errors_after - errors_before)) in 5 s)"
hits_before=$(l2_hits)
load replay-open --clients "$CLIENTS" --keys-from "$WORK/after-open.keys.jsonl" --timeout 5s
summary replay-open
hits=$(($(l2_hits) - hits_before))
check "$((hits == $(j replay-open .requests)))" "(a) replays come from Redis again ($hits distributed hits for $(j replay-open .requests) replays)"
A_OK_MS=$OK_MS A_LAST_ERROR_MS=$LAST_ERROR_MS

# The killed node rejoins as a replica, so that (b) has a replica for every master again.
redis_cluster_node_start "$seed" "$CLUSTER_DIR"
KILLED=()
for _ in $(seq 1 300); do redis_cluster_ok "$BASE" && break; sleep 0.2; done
redis_cluster_ok "$BASE" || violation "the killed node did not rejoin"

echo
say "(b) fail-fast: SIGKILL another master under load"
demo_stop
demo_start "$db_url" REDIS_URL="redis-cluster://127.0.0.1:$seed" "${cache_env[@]}" \
  IDEMPOTENCY__DISTRIBUTED_CACHE__FAILURE_POLICY=fail-fast
wait_cache_up
victim=$(masters | grep -vx "$seed" | head -n1)
poll "$WORK/poll-b.txt" "$seed" &
POLL_PID=$!
cleanup_later "kill $POLL_PID"
rows_before=$(psql "$db_url" -Atc "SELECT count(*) FROM payments")
fresh failover-fast "$PHASE_SECONDS" &
LOAD_PID=$!
sleep "$KILL_AFTER"
killed_at=$(now_ms)
kill_node "$victim"
wait "$LOAD_PID"
wait_cluster_ok
sleep 1
kill "$POLL_PID"
timeline "$WORK/poll-b.txt" "$killed_at"
say "timeline: cluster_state:ok after ${OK_MS} ms, last cache error counted after ${LAST_ERROR_MS} ms"
rows_after=$(psql "$db_url" -Atc "SELECT count(*) FROM payments")
created=$(j failover-fast '.statuses["201"] // 0')
refused=$(j failover-fast '.statuses["503"] // 0')
check "$(j failover-fast '(.statuses | keys - ["201", "503"]) == [] | if . then 1 else 0 end')" \
  "(b) only 201 and 503 ($(j failover-fast '.statuses | tojson'))"
check "$(j failover-fast '(.problems["503 cache-unavailable"] // 0) == (.statuses["503"] // 0) and .server_errors_without_problem == 0 | if . then 1 else 0 end')" \
  "(b) every 503 is a cache-unavailable problem+json ($(j failover-fast '.problems | tojson'))"
check "$((rows_after - rows_before == created))" "(b) a refused request did not run the action ($created created, $((rows_after - rows_before)) rows)"
check "$((refused > 0))" "(b) the failover was seen ($refused x 503)"
window=$(j failover-fast '[.timeline[] | select(.statuses["503"] != null) | .second] | if length == 0 then "none" else "\(min)-\(max)" end')
last_second=$(j failover-fast '[.timeline[].second] | max')
say "(b) seconds of the run with 503s: $window (master killed at ${KILL_AFTER} s, run of $last_second s)"
check "$(j failover-fast "[.timeline[] | select(.second < $KILL_AFTER and .statuses[\"503\"] != null)] | length == 0 | if . then 1 else 0 end")" \
  "(b) no 503 before the kill"
check "$(j failover-fast "[.timeline[] | select(.second >= $last_second - 2 and .statuses[\"503\"] != null)] | length == 0 | if . then 1 else 0 end")" \
  "(b) no 503 in the last seconds of the run: 503s during the failover only"
fresh after-fast 5
check "$(j after-fast '(.statuses | keys) == ["201"] | if . then 1 else 0 end')" "(b) after the failover every request succeeds again (201)"

echo
say "figures: (a) fail-open p99 $(p99 failover-open) ms (baseline $(p99 baseline) ms, bound $bound ms), max $(j failover-open .latency_ms.max) ms, 5xx $(j failover-open .server_errors); cluster_state:ok ${A_OK_MS} ms after the kill, last cache error ${A_LAST_ERROR_MS} ms after it"
say "figures: (b) fail-fast $refused x 503 of $(j failover-fast .requests) requests, in seconds $window of the run (kill at ${KILL_AFTER} s); cluster_state:ok ${OK_MS} ms after the kill, last cache error ${LAST_ERROR_MS} ms after it"
finish
