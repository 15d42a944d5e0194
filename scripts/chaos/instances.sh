#!/usr/bin/env bash
# Many instances over one database: INSTANCES (default 3) release demos on their own ports share
# one fresh database on the shared PostgreSQL, the shared Redis Cluster (REDIS_CLUSTER_URL) as L2
# and a PRIVATE nats-server (JetStream stream IDEMPOTENCY_DEMO, the demo's own, with its 120 s
# Nats-Msg-Id window); the outbox relay runs in every instance (WORKERS workers x batch BATCH).
#
# Under load, all at once, for DURATION:
#   - POST /api/payments, CLIENTS clients, KEYS keys, and POST /charges, CLIENTS clients, KEYS
#     keys (UUID keys derived from them): idempotency-load sends each request to the next
#     instance (--url u1,u2,u3), every key to every instance in turn;
#   - EVENTS events over AGGREGATES aggregates enqueued through the library (`outbox-chaos
#     enqueue`, ordered outbox, the demo's table) in transactions of 100, spread over the run,
#     and a burst of BURST more over BURST_AGGREGATES aggregates (the first AGGREGATES of them
#     the same) 1 s before the kill, so that the relays have a backlog then.
#     They exist because the demo's HTTP events cannot test per-aggregate order: POST /charges
#     emits one ChargeCreated per charge, its aggregate the charge id (one event per aggregate);
#   - from 2 s before the kill, for WINDOW_SECONDS, POST /api/payments with a pool of
#     WINDOW_KEYS keys (taken in turn, to the instances in turn), so that first executions are
#     in flight on the instance when it dies; after the load every key of it is sent once more
#     (a client's retry), to whichever instance comes next;
#   - instance 2 is SIGKILLed after KILL_AFTER s and restarted DOWN_SECONDS later;
#   - two durable JetStream pull consumers with explicit acks (`outbox-chaos consume`) read the
#     stream: `reader` accounts for what it receives; `applier` applies every event through the
#     inbox (PgInbox) and an effects table in one transaction per event, skips the ack of every
#     SKIP_ACK_EVERY-th event after its commit (JetStream redelivers it), and is itself SIGKILLed
#     after CONSUMER_KILL_AFTER s and restarted.
#
# Guarantees checked (exit 1 if any fails):
#   - one business execution per key across the instances: KEYS payment rows (order_id = key)
#     and KEYS charge rows, each key saw one paymentId / charge id, the stored one; in the kill
#     window and its retry one row per key, the one every answer named, also for the keys whose
#     first answer was lost with the killed instance;
#   - every replay identical whichever instance answers: each key's 201 bodies are byte-identical
#     (a digest per body), every key was answered by every instance;
#   - no 5xx; the only answers besides 201 and 409 request-in-flight are connection errors to
#     the killed instance while it was down;
#   - every committed event arrives: the outbox holds KEYS charge events + EVENTS events, all
#     published, each received by `reader` (no id missing, none unknown);
#   - per-aggregate order as `reader` sees it: each aggregate's events arrive with sequences 1,
#     2, 3... (BURST_AGGREGATES aggregates of several events);
#   - duplicates only those the message-id window did not absorb, at most 2 x workers x batch
#     per kill (the bound of relay-kill.sh: each worker of the killed relay may hold the batch it
#     publishes and the previous one, published, its mark in flight): ids stored twice in the
#     stream, counted by `reader`; the rows taken over without a failed attempt (claimed more
#     than once, no `last_error`: the killed relay's leases) and the resends the window absorbed
#     stay within the same bound. Rows retried after a failed publish (a publish that outlived
#     publish-timeout on a saturated machine) are also claimed more than once: counted apart;
#   - each event applied exactly once by `applier` despite its kill and the skipped acks: one
#     effects row per outbox id, a per-aggregate counter equal to the aggregate's event count.
# Also measured: the resends the window absorbed (outbox_broker_duplicates_total of the live
# instances), the distributed-cache hits (replays served across instances by Redis).
#
# Autovacuum is off on the shared PostgreSQL: a loop stands in for it (VACUUM ANALYZE of the
# outbox, ANALYZE of the rest, every MAINTENANCE_SECONDS).
#
#   scripts/chaos/instances.sh         # CLIENTS=30 KEYS=300 DURATION=30s EVENTS=10000 AGGREGATES=100
#   CHAOS_INSTANCES_PORT=18191         # first demo port (then +1, +2); CHAOS_NATS_PORT=4233
SCRIPT=instances
CHAOS_NATS_PORT="${CHAOS_NATS_PORT:-4233}"
source "$(dirname "$0")/lib.sh"
# shellcheck source=scripts/services.sh
source scripts/services.sh
INSTANCES="${INSTANCES:-3}"
BASE_PORT="${CHAOS_INSTANCES_PORT:-18191}"
CLIENTS="${CLIENTS:-30}"
KEYS="${KEYS:-300}"
DURATION="${DURATION:-30s}"
EVENTS="${EVENTS:-10000}"
BURST="${BURST:-5000}"
BURST_AGGREGATES="${BURST_AGGREGATES:-1000}"
MAINTENANCE_SECONDS="${MAINTENANCE_SECONDS:-5}"
WINDOW_KEYS="${WINDOW_KEYS:-2000}"
WINDOW_SECONDS="${WINDOW_SECONDS:-6}"
AGGREGATES="${AGGREGATES:-100}"
WORKERS="${WORKERS:-2}"
BATCH="${BATCH:-100}"
KILL_AFTER="${KILL_AFTER:-10}"
DOWN_SECONDS="${DOWN_SECONDS:-2}"
CONSUMER_KILL_AFTER="${CONSUMER_KILL_AFTER:-15}"
SKIP_ACK_EVERY="${SKIP_ACK_EVERY:-50}"
MAX_DRAIN_SECONDS="${MAX_DRAIN_SECONDS:-120}"
REDIS_CLUSTER_URL="${REDIS_CLUSTER_URL:-redis-cluster://127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002}"
need psql jq curl redis-cli
[ "$INSTANCES" -ge 2 ] || { echo "INSTANCES must be at least 2 (instance 2 is killed)" >&2; exit 2; }
[ "$KILL_AFTER" -ge 2 ] || { echo "KILL_AFTER must be at least 2 s" >&2; exit 2; }

seed_port="${REDIS_CLUSTER_URL#redis-cluster://}"
seed_port="${seed_port%%,*}"
seed_port="${seed_port##*:}"
[ "$(redis_cluster_state "$seed_port")" = ok ] ||
  { echo "the Redis Cluster of REDIS_CLUSTER_URL is not ok (scripts/services.sh redis-cluster start)" >&2; exit 2; }

build
nats_private_start
db_url="$(shared_fresh_db "idempotency_chaos_instances_$$")"
duration_s="${DURATION%s}"
kill_bound=$((2 * WORKERS * BATCH))

instance_env=(REDIS_URL="$REDIS_CLUSTER_URL" NATS_URL="$NATS_URL"
  IDEMPOTENCY__DISTRIBUTED_CACHE__KEY_PREFIX="idempotency:instances-$RUN_ID:"
  IDEMPOTENCY__DISTRIBUTED_CACHE__TTL=10m DATABASE__MAX_CONNECTIONS=10
  OUTBOX__RELAY__WORKERS="$WORKERS" OUTBOX__RELAY__BATCH_SIZE="$BATCH"
  OUTBOX__RELAY__PUBLISH_TIMEOUT=2s OUTBOX__RELAY__LEASE_MARGIN=1s)
# The first instance creates the schema; the others, and the restarted one, validate it, as
# production instances do (`create` runs CREATE INDEX IF NOT EXISTS, which takes a SHARE lock on
# the outbox even when the index exists: a restart would queue every writer of the outbox).
validate=(IDEMPOTENCY__PERSISTENCE__SCHEMA__MODE=validate OUTBOX__SCHEMA__MODE=validate)
PORTS=() PIDS=() URLS=()
for i in $(seq 1 "$INSTANCES"); do
  port=$((BASE_PORT + i - 1))
  if [ "$i" = 1 ]; then demo_start_on "$port" "$db_url" "${instance_env[@]}"; else demo_start_on "$port" "$db_url" "${instance_env[@]}" "${validate[@]}"; fi
  PORTS[i]=$port PIDS[i]=$DEMO_PID URLS[i]="http://127.0.0.1:$port"
done
DEMO_URL="$(IFS=,; echo "${URLS[*]}")" # idempotency-load takes the URLs comma-separated
say "$INSTANCES instances on ports ${PORTS[*]}: database $db_url, L2 $REDIS_CLUSTER_URL, NATS $NATS_URL, relay $WORKERS workers x batch $BATCH each"

stream=IDEMPOTENCY_DEMO
consumer_args=(--database-url "$db_url" --table outbox --nats-url "$NATS_URL" --stream "$stream")
# consumer NAME ARGS...: starts `outbox-chaos consume`, verdict in $WORK/NAME.json; sets CONSUMER_PID.
consumer() {
  local name=$1
  shift
  RUST_LOG=warn "$CHAOS_BIN" consume "${consumer_args[@]}" "$@" >"$WORK/$name.json" 2>"$WORK/$name.log" &
  CONSUMER_PID=$!
  cleanup_later "stop_ours KILL $CONSUMER_PID outbox-chaos"
  for _ in $(seq 1 100); do grep -qs consuming "$WORK/$name.log" && return 0; sleep 0.1; done
  cat "$WORK/$name.log"
  echo "consumer $name did not start" >&2
  exit 2
}
consumer reader --durable reader --duplicate-bound "$kill_bound"
reader_pid=$CONSUMER_PID
applier=(--durable applier --inbox-table chaos_inbox --effects-table chaos_effects
  --skip-ack-every "$SKIP_ACK_EVERY" --duplicate-bound "$kill_bound")
consumer applier-1 "${applier[@]}"
applier_pid=$CONSUMER_PID

# What autovacuum would do (it is off on the shared server): dead rows out of the outbox's
# pending index, fresh statistics for the plans.
maintenance() {
  while sleep "$MAINTENANCE_SECONDS"; do
    psql "$db_url" -qc "VACUUM (ANALYZE) outbox" -c "ANALYZE" 2>/dev/null || true
  done
}
maintenance &
maintenance_pid=$!
cleanup_later "kill $maintenance_pid"

per_tx=100
pause_ms=$((duration_s * 800 / (EVENTS / per_tx)))
say "load for $DURATION: payments and charges, $CLIENTS clients and $KEYS keys each, round-robin over the $INSTANCES instances; $EVENTS events over $AGGREGATES aggregates enqueued through the library"
started=$(now_ms)
load payments --clients "$CLIENTS" --keys "$KEYS" --duration "$DURATION" --key-prefix "inst-pay-$RUN_ID" &
pay_pid=$!
load charges --endpoint charges --clients "$CLIENTS" --keys "$KEYS" --duration "$DURATION" --key-prefix "inst-chg-$RUN_ID" &
chg_pid=$!
"$CHAOS_BIN" enqueue --database-url "$db_url" --table outbox --count "$EVENTS" --aggregates "$AGGREGATES" \
  --per-tx "$per_tx" --pause "${pause_ms}ms" --workers "$WORKERS" --batch-size "$BATCH" >"$WORK/enqueue.json" &
enqueue_pid=$!

# The timeline, in seconds from the start of the load.
at() { local wait_ms=$(($1 * 1000 - ($(now_ms) - started))); [ "$wait_ms" -le 0 ] || sleep "$((wait_ms / 1000)).$(printf '%03d' $((wait_ms % 1000)))"; }
kill_instance() {
  at $((KILL_AFTER - 2))
  load kill-window --clients "$CLIENTS" --keys "$WINDOW_KEYS" --duration "${WINDOW_SECONDS}s" --key-prefix "inst-win-$RUN_ID" &
  window_pid=$!
  at $((KILL_AFTER - 1))
  "$CHAOS_BIN" enqueue --database-url "$db_url" --table outbox --count "$BURST" --aggregates "$BURST_AGGREGATES" \
    --per-tx 500 --workers "$WORKERS" --batch-size "$BATCH" >"$WORK/burst.json" &
  burst_pid=$!
  at "$KILL_AFTER"
  pending_at_kill=$(psql "$db_url" -Atc "SELECT count(*) FROM outbox WHERE published_at IS NULL")
  kill -KILL "${PIDS[2]}"
  killed_ms=$(($(now_ms) - started))
  say "  SIGKILL instance 2 (pid ${PIDS[2]}, port ${PORTS[2]}) at $((killed_ms / 100))00 ms, $pending_at_kill events pending"
  sleep "$DOWN_SECONDS"
  demo_start_on "${PORTS[2]}" "$db_url" "${instance_env[@]}" "${validate[@]}"
  PIDS[2]=$DEMO_PID
  up_ms=$(($(now_ms) - started))
  say "  instance 2 answers again at $((up_ms / 100))00 ms (pid ${PIDS[2]})"
}
kill_consumer() {
  at "$CONSUMER_KILL_AFTER"
  kill -KILL "$applier_pid"
  say "  SIGKILL consumer applier at $((($(now_ms) - started) / 100))00 ms, restarted"
  consumer applier-2 "${applier[@]}" --resumed
  applier_pid=$CONSUMER_PID
}
kill_instance
kill_consumer
wait "$window_pid"
load window-retry --clients "$CLIENTS" --keys-from "$WORK/kill-window.keys.jsonl"
wait "$pay_pid" "$chg_pid" "$enqueue_pid" "$burst_pid"
load_ms=$(($(now_ms) - started))
say "load done in $load_ms ms"
summary payments
summary charges
summary kill-window
summary window-retry

pending() { psql "$db_url" -Atc "SELECT count(*) FROM outbox WHERE published_at IS NULL AND dead_lettered_at IS NULL"; }
for _ in $(seq 1 $((MAX_DRAIN_SECONDS * 5))); do [ "$(pending)" = 0 ] && break; sleep 0.2; done
drained_ms=$(($(now_ms) - started))
say "outbox drained at $drained_ms ms ($(pending) pending)"
absorbed=0 l2_hits=0
for i in $(seq 1 "$INSTANCES"); do
  absorbed=$((absorbed + $(demo_metric "${URLS[i]}" outbox_broker_duplicates_total destination=)))
  l2_hits=$((l2_hits + $(demo_metric "${URLS[i]}" idempotency_lookup_hits_total 'level="distributed"')))
done
kill -TERM "$reader_pid" "$applier_pid"
wait "$reader_pid" || true
wait "$applier_pid" || true
consumed_ms=$(($(now_ms) - started))
say "consumers caught up and stopped at $consumed_ms ms"

echo
say "payments and charges: one execution per key, identical replays from every instance"
key_checks() { # NAME WHAT ROWS_SQL IDS_SQL
  local name=$1 what=$2 rows=$3 ids=$4 executed
  executed=$(j "$name" .keys.executed)
  check "$(("$(psql "$db_url" -Atc "$rows")" == KEYS))" "$what: $KEYS rows for $KEYS keys ($(psql "$db_url" -Atc "$rows"))"
  check "$(j "$name" '.keys.distinct == '"$KEYS"' and .keys.keys_with_several_payment_ids == 0 and .keys.distinct_payment_ids == '"$KEYS"' | if . then 1 else 0 end')" \
    "$what: each of the $KEYS keys saw exactly one id ($(j "$name" '.keys.payment_ids_per_key | tojson') ids per key)"
  check "$((executed <= KEYS))" "$what: $executed answers were executions (201 without Idempotent-Replayed), at most one per key"
  check "$(j "$name" '.keys.keys_with_several_bodies == 0 | if . then 1 else 0 end')" \
    "$what: every 201 of a key is byte-identical ($(j "$name" .replayed) replays)"
  check "$(j "$name" '.keys.keys_answered_by_every_instance == '"$KEYS"' | if . then 1 else 0 end')" \
    "$what: every key was answered by all $INSTANCES instances ($(j "$name" .keys.keys_answered_by_every_instance) keys)"
  check "$(j "$name" '[.instances[].replayed > 0] | all | if . then 1 else 0 end')" \
    "$what: replays from every instance ($(j "$name" '[.instances[].replayed] | map(tostring) | join(", ")'))"
  check "$(j "$name" '.server_errors == 0 | if . then 1 else 0 end')" "$what: no 5xx"
  check "$(j "$name" '(.statuses | del(.["201"], .["409"], .["connection-error"])) == {} and (.statuses["409"] // 0) == (.problems["409 request-in-flight"] // 0) | if . then 1 else 0 end')" \
    "$what: only 201, 409 request-in-flight and connection errors ($(j "$name" '.statuses | tojson'))"
  check "$(j "$name" '[.instances | to_entries[] | select(.key != 1) | .value.statuses["connection-error"] // 0] | add == 0 | if . then 1 else 0 end')" \
    "$what: connection errors only to the killed instance ($(j "$name" '.instances[1].statuses["connection-error"] // 0'))"
  check_same "$what: the ids the keys saw are the stored ones" \
    <(psql "$db_url" -Atc "$ids" | LC_ALL=C sort) <(jq -r '.payment_ids[]' "$WORK/$name.keys.jsonl" | LC_ALL=C sort)
}
key_checks payments payments "SELECT count(*) FROM payments WHERE order_id LIKE 'inst-pay-%'" \
  "SELECT payment_id FROM payments WHERE order_id LIKE 'inst-pay-%'"
check "$(("$(psql "$db_url" -Atc "SELECT coalesce(max(n), 0) FROM (SELECT count(*) n FROM payments GROUP BY order_id) t")" == 1))" \
  "payments: one row per order_id (= key), kill window included"
key_checks charges charges "SELECT count(*) FROM charges" "SELECT id FROM charges"
check "$(j payments '.statuses["connection-error"] // 0' | awk '{print ($1 > 0)}')" \
  "the kill was seen by the clients ($(j payments '.statuses["connection-error"] // 0') + $(j charges '.statuses["connection-error"] // 0') connection errors)"

say "kill window: first executions in flight on the killed instance, then a retry of every key"
win_rows=$(psql "$db_url" -Atc "SELECT count(*) FROM payments WHERE order_id LIKE 'inst-win-%'")
win_keys=$(j kill-window .keys.distinct)
check "$(j kill-window '.server_errors == 0 and ((.statuses | del(.["201"], .["409"], .["connection-error"])) == {}) and ([.instances | to_entries[] | select(.key != 1) | .value.statuses["connection-error"] // 0] | add == 0) | if . then 1 else 0 end')" \
  "kill window: no 5xx, connection errors only to the killed instance ($(j kill-window '.statuses | tojson'))"
check "$(j window-retry '(.statuses | keys) == ["201"] | if . then 1 else 0 end')" \
  "retry: every key of the window answered 201 ($(j window-retry '.statuses | tojson'), $(j window-retry .replayed) replays)"
# Per key, every paymentId seen in the window and in the retry: exactly one, the stored one.
jq -rs 'group_by(.key)[] | "\(.[0].key) \(map(.payment_ids[]) | unique | join(","))"' \
  "$WORK/kill-window.keys.jsonl" "$WORK/window-retry.keys.jsonl" | LC_ALL=C sort >"$WORK/window-seen.txt"
psql "$db_url" -Atc "SELECT order_id || ' ' || payment_id FROM payments WHERE order_id LIKE 'inst-win-%'" |
  LC_ALL=C sort >"$WORK/window-stored.txt"
check_same "kill window: $win_rows rows for $win_keys keys, each the one paymentId its answers named" \
  "$WORK/window-stored.txt" "$WORK/window-seen.txt"
# Rows whose execution no client saw (no 201 without Idempotent-Replayed): committed on the
# killed instance, the answer lost with it, replayed by a later request or the retry.
lost_answers=$((win_rows - $(j kill-window .keys.executed) - $(j window-retry .keys.executed)))
check "$((lost_answers >= 0))" "kill window: $(j kill-window .keys.executed) + $(j window-retry .keys.executed) executions answered (window + retry), $lost_answers committed whose answer was lost with the killed instance and later replayed"

echo
say "outbox: every committed event arrives, in per-aggregate order, duplicates bounded"
r() { jq -r "$1" "$WORK/reader.json"; }
a() { jq -r "$1" "$WORK/applier-2.json"; }
[ -s "$WORK/reader.json" ] || { cat "$WORK/reader.log"; violation "the reader printed no verdict"; }
[ -s "$WORK/applier-2.json" ] || { cat "$WORK/applier-2.log"; violation "the applier printed no verdict"; }
events=$(psql "$db_url" -Atc "SELECT count(*) FROM outbox")
charge_events=$(psql "$db_url" -Atc "SELECT count(*) FROM outbox WHERE aggregate_type = 'charge'")
check "$((charge_events == $(psql "$db_url" -Atc "SELECT count(*) FROM charges") && events == charge_events + EVENTS + BURST))" \
  "the outbox holds one ChargeCreated per charge ($charge_events) + $EVENTS + $BURST enqueued events = $events"
check "$(r '(.arrival.published_rows == .arrival.events and .arrival.pending_rows == 0 and .arrival.dead_lettered_rows == 0) | if . then 1 else 0 end')" \
  "every event published ($(r .arrival.published_rows) of $(r .arrival.events), $(r .arrival.dead_lettered_rows) dead-lettered)"
check "$(r '(.arrival.missing == 0 and .arrival.unknown == 0 and .arrival.events == '"$events"') | if . then 1 else 0 end')" \
  "reader received every committed event: $(r .seen.received) ids, $(r .arrival.missing) missing, $(r .arrival.unknown) unknown"
check "$(r '(.arrival.multi_event_aggregates >= '"$AGGREGATES"' and .seen.order_violations == 0) | if . then 1 else 0 end')" \
  "per-aggregate order held for $(r .arrival.multi_event_aggregates) aggregates of several events ($(r .arrival.events_in_multi_event_aggregates) events): $(r .seen.order_violations) violations $(r '.seen.order_examples | join("; ")')"
check "$(r '(.seen.duplicates <= '"$kill_bound"') | if . then 1 else 0 end')" \
  "duplicates the message-id window did not absorb: $(r .seen.duplicates) <= $kill_bound (2 x workers x batch, 1 kill)"
check "$((absorbed <= kill_bound))" "resends the window absorbed (broker duplicates, live instances): $absorbed <= $kill_bound"
reclaimed=$(psql "$db_url" -Atc "SELECT count(*) FROM outbox WHERE attempts > 1")
retried=$(psql "$db_url" -Atc "SELECT count(*) FROM outbox WHERE attempts > 1 AND last_error IS NOT NULL")
taken_over=$((reclaimed - retried))
check "$((taken_over <= kill_bound))" "rows taken over without a failed attempt (the killed relay's leases, claimed again after publish-timeout + lease-margin): $taken_over <= $kill_bound; $pending_at_kill pending at the kill"
say "  rows claimed more than once: $reclaimed = $taken_over taken over + $retried retried after a failed publish ($(psql "$db_url" -Atc "SELECT coalesce(string_agg(DISTINCT left(last_error, 60), '; '), 'none') FROM outbox WHERE attempts > 1 AND last_error IS NOT NULL"))"
say "  reader: $(r .seen.deliveries) deliveries, $(r .seen.redeliveries) redeliveries; drain after the stop $(r '.drain_seconds * 10 | round / 10') s"

echo
say "inbox: every event applied exactly once"
check "$(a '(.inbox.applied_twice == 0 and .inbox.effects == '"$events"') | if . then 1 else 0 end')" \
  "$(a .inbox.effects) effects rows for $events events, $(a .inbox.applied_twice) applied twice"
check "$(a '(.inbox.not_applied == 0 and .inbox.unknown_effects == 0) | if . then 1 else 0 end')" \
  "every event applied: $(a .inbox.not_applied) not applied, $(a .inbox.unknown_effects) unknown"
check "$(a '(.inbox.counter_mismatches == 0) | if . then 1 else 0 end')" "every aggregate's applied counter equals its event count"
check "$(a '(.inbox.refused_by_inbox > 0) | if . then 1 else 0 end')" \
  "the inbox refused $(a .inbox.refused_by_inbox) deliveries of applied events after the restart ($(a .inbox.acks_skipped) acks skipped after the commit by the restarted consumer)"
say "  applier after its restart: $(a .seen.deliveries) deliveries, $(a .seen.redeliveries) redeliveries, $(a .inbox.applied) applied; application order (a figure, see RELIABILITY.md): $(a .inbox.application_order_violations) events applied after a later one of their aggregate"
[ "$(r '.violations | length')" = 0 ] || violation "reader: $(r '.violations | join("; ")')"
[ "$(a '.violations | length')" = 0 ] || violation "applier: $(a '.violations | join("; ")')"

jq -n --slurpfile pay "$WORK/payments.json" --slurpfile chg "$WORK/charges.json" \
  --slurpfile reader "$WORK/reader.json" --slurpfile applier "$WORK/applier-2.json" \
  --argjson keys "$KEYS" --argjson instances "$INSTANCES" --argjson events "$events" \
  --slurpfile win "$WORK/kill-window.json" --argjson win_rows "$win_rows" --argjson lost "$lost_answers" \
  --argjson reclaimed "$reclaimed" --argjson taken_over "$taken_over" --argjson retried "$retried" \
  --argjson pending_at_kill "$pending_at_kill" \
  --argjson absorbed "$absorbed" --argjson l2_hits "$l2_hits" --argjson bound "$kill_bound" \
  --argjson killed_ms "${killed_ms:-0}" --argjson up_ms "${up_ms:-0}" --argjson load_ms "$load_ms" \
  --argjson drained_ms "$drained_ms" --argjson consumed_ms "$consumed_ms" --argjson violations "$VIOLATIONS" '{
    instances: $instances, keys: $keys,
    payments: {requests: $pay[0].requests, statuses: $pay[0].statuses, executed: $pay[0].keys.executed, replayed: $pay[0].replayed, p99_ms: $pay[0].latency_ms.p99, per_instance: $pay[0].instances},
    charges: {requests: $chg[0].requests, statuses: $chg[0].statuses, executed: $chg[0].keys.executed, replayed: $chg[0].replayed, p99_ms: $chg[0].latency_ms.p99, per_instance: $chg[0].instances},
    kill_window: {requests: $win[0].requests, statuses: $win[0].statuses, keys: $win[0].keys.distinct, executed: $win[0].keys.executed, rows: $win_rows, replayed: $win[0].replayed, answers_lost_then_replayed: $lost},
    distributed_cache_hits: $l2_hits,
    kill: {instance: 2, killed_ms: $killed_ms, up_again_ms: $up_ms, pending_at_kill: $pending_at_kill, rows_claimed_twice: $reclaimed, rows_taken_over: $taken_over, rows_retried_after_a_failure: $retried},
    events: $events, reader: $reader[0], applier: $applier[0],
    broker_duplicates_absorbed: $absorbed, duplicate_bound: $bound,
    load_ms: $load_ms, drained_ms: $drained_ms, consumed_ms: $consumed_ms, violations: $violations}' \
  >"$CHAOS_RESULTS/$SCRIPT-verdict.json"
say "figures: $KEYS + $KEYS keys over $INSTANCES instances; $(j payments .requests) + $(j charges .requests) requests, $(j payments .replayed) + $(j charges .replayed) replays, $l2_hits distributed-cache hits; kill window $win_keys keys, $win_rows rows, $lost_answers answers lost at the kill and replayed by the retry; $events events ($charge_events charges + $((EVENTS + BURST)) enqueued); at the kill $pending_at_kill pending, $reclaimed rows claimed twice ($taken_over taken over, $retried retried after a failed publish), $absorbed resends absorbed by the window; reader: $(r .seen.duplicates) duplicates in the stream, $(r .seen.redeliveries) redeliveries; applier: $(a .inbox.refused_by_inbox) refused by the inbox"
finish
