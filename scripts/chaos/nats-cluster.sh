#!/usr/bin/env bash
# The outbox relay on a three-node JetStream cluster, under a steady enqueue load, through two
# failures: the node the relay is connected to dies, then the stream's leader dies. Each node is
# SIGKILLed and started again on its store after DOWN_SECONDS.
#
# A PRIVATE cluster (services.sh's nats_cluster_*: clients on CHAOS_NATS_CLUSTER_PORT .. +2,
# routes on port + 2000, monitoring on port + 4000, stores under the run's work directory), a
# stream with replicas: 3 and a 10-minute duplicate window, a fresh database on the shared
# PostgreSQL. One relay process (`outbox-chaos relay`: the library's Relay and NatsPublisher,
# relay.max-attempts 10 as the library's default) is given every node's URL, the node it is to
# be on first, and reconnects from that list; `outbox-chaos enqueue` commits RATE events a second
# all along.
#
#   baseline      BASELINE_SECONDS of load on the healthy cluster;
#   (b) publisher the relay's node (a follower of the stream) SIGKILLed; restarted after
#                 DOWN_SECONDS; SETTLE_SECONDS;
#   (a) leader    the stream's leader SIGKILLed (the relay is on another node); restarted after
#                 DOWN_SECONDS; SETTLE_SECONDS; then the load stops and the relay drains.
#
# Guarantees checked (exit 1 if any fails):
#   - every committed event is in the stream exactly once (by Nats-Msg-Id), none pending;
#   - no dead letter (the publish errors of the failures are retried);
#   - the duplicate window holds across the leader change: the 200 earliest events, published
#     again after it, are all acked as duplicates and none is stored again;
#   - the relay moved to another node of its list when its own died.
# Figures (RELIABILITY.md): commit-to-ack p50/p99/max per phase (published_at - created_at of
# the rows: the mark follows the ack), the time without a stream leader, the time the relay was
# without a connection, the publish errors by kind.
#
#   scripts/chaos/nats-cluster.sh              # RATE=400 DOWN_SECONDS=10 ...
#   CHAOS_NATS_CLUSTER_PORT=4242               # first client port of its three nodes
SCRIPT=nats-cluster
source "$(dirname "$0")/lib.sh"
# shellcheck source=scripts/services.sh
source scripts/services.sh
RATE="${RATE:-400}"
BASELINE_SECONDS="${BASELINE_SECONDS:-6}"
DOWN_SECONDS="${DOWN_SECONDS:-10}"
SETTLE_SECONDS="${SETTLE_SECONDS:-8}"
WORKERS="${WORKERS:-2}"
BATCH="${BATCH:-100}"
REPUBLISH="${REPUBLISH:-200}"
BASE="${CHAOS_NATS_CLUSTER_PORT:-4242}"
# The shared PostgreSQL (the run's database is a fresh one there) up, the tools installed.
ensure_postgres
ensure_tools jq curl
command -v nats-server >/dev/null || [ -x /usr/sbin/nats-server ] || apt_install nats-server
need psql jq curl

build
CLUSTER_DIR="$WORK/nats-cluster"
for i in 0 1 2; do
  for port in $((BASE + i)) $((BASE + i + 2000)) $((BASE + i + 4000)); do require_free_port "$port" CHAOS_NATS_CLUSTER_PORT; done
done
cleanup_later "nats_cluster_stop $BASE $CLUSTER_DIR"
nats_cluster_start "$BASE" "$CLUSTER_DIR"
url_of() { echo "nats://127.0.0.1:$((BASE + $1))"; }
ALL_URLS="$(nats_cluster_url "$BASE")"

db_url="$(shared_fresh_db "idempotency_chaos_natscluster_$$")"
stream="CHAOS_CLUSTER_$$"
prefix="chaos$$"
subject="$prefix.{aggregate_type}.{event_type}"
table=outbox_chaos
outbox=(--database-url "$db_url" --table "$table" --workers "$WORKERS" --batch-size "$BATCH")
"$CHAOS_BIN" stream --nats-url "$ALL_URLS" --stream "$stream" --subjects "$prefix.>" --replicas 3

# stream_leader: the node that says it leads the stream (n0, n1, n2) and that the other nodes
# answering name too; nothing when there is none.
stream_leader() {
  local i views=()
  for i in 0 1 2; do
    views[i]=$(nats_cluster_jsz "$BASE" "$i" '?accounts=true&streams=true' |
      jq -r --arg s "$stream" '.account_details[]?.stream_detail[]? | select(.name == $s) | .cluster.leader // empty' 2>/dev/null || true)
  done
  for i in 0 1 2; do
    [ "${views[i]}" = "n$i" ] || continue
    [ "${views[0]:-n$i}" = "n$i" ] && [ "${views[1]:-n$i}" = "n$i" ] && [ "${views[2]:-n$i}" = "n$i" ] && echo "n$i"
    return
  done
}
# relay_node: the node the relay's connection is on, nothing when it is on none.
relay_node() {
  local i
  for i in 0 1 2; do
    if curl -fs -m 1 "http://127.0.0.1:$((BASE + i + 4000))/connz" 2>/dev/null |
      jq -e '.connections[]? | select(.name == "outbox-chaos relay 1")' >/dev/null 2>&1; then
      echo "n$i"
      return
    fi
  done
}
for _ in $(seq 1 100); do [ -n "$(stream_leader)" ] && break; sleep 0.1; done
leader="$(stream_leader)"
[ -n "$leader" ] || { echo "the stream has no leader" >&2; exit 2; }
L=${leader#n}
others=()
for i in 0 1 2; do [ "$i" = "$L" ] || others+=("$i"); done
X=${others[0]} # the relay's node, killed in (b)
Y=${others[1]} # where the relay is to go then
say "private NATS cluster on $BASE-$((BASE + 2)); stream $stream (replicas 3) led by n$L; the relay on n$X"

"$CHAOS_BIN" watch --nats-url "$(url_of "$Y"),$(url_of "$L"),$(url_of "$X")" --subjects "$prefix.>" \
  --out "$WORK/watch.json" 2>"$WORK/watch.log" &
watch_pid=$!
cleanup_later "stop_ours KILL $watch_pid outbox-chaos"
for _ in $(seq 1 100); do grep -qs watching "$WORK/watch.log" && break; sleep 0.1; done
grep -q watching "$WORK/watch.log" || { cat "$WORK/watch.log"; echo "the watcher did not start" >&2; exit 2; }

# The load: RATE events a second, 10 per transaction, over the whole run.
total_seconds=$((BASELINE_SECONDS + 2 * (DOWN_SECONDS + SETTLE_SECONDS) + 4))
events=$((RATE * total_seconds))
pause_ms=$((10 * 1000 / RATE))
say "load: $events events over ~${total_seconds}s ($RATE/s, 10 per transaction); relay $WORKERS workers x batch $BATCH, max-attempts 10"
"$CHAOS_BIN" enqueue "${outbox[@]}" --count "$events" --per-tx 10 --pause "${pause_ms}ms" >"$WORK/enqueue.json" 2>"$WORK/enqueue.log" &
enqueue_pid=$!
cleanup_later "stop_ours KILL $enqueue_pid outbox-chaos"
for _ in $(seq 1 100); do
  [ "$(psql "$db_url" -Atc "SELECT to_regclass('$table') IS NOT NULL")" = t ] && break
  sleep 0.1
done
t0=$(now_ms)
mkdir -p "$WORK/acks"
RUST_LOG=warn "$CHAOS_BIN" relay "${outbox[@]}" --nats-url "$(url_of "$X"),$(url_of "$Y"),$(url_of "$L")" \
  --subject "$subject" --max-attempts 10 >"$WORK/acks/life-1.acks" 2>"$WORK/relay.log" &
relay_pid=$!
cleanup_later "stop_ours KILL $relay_pid outbox-chaos"

# The timeline: every 100 ms, "ms relay-node" ("-" for none).
poll() {
  while :; do
    printf '%s %s\n' "$(now_ms)" "$(relay_node || echo -)"
    sleep 0.1
  done >"$WORK/timeline.txt"
}
poll &
poll_pid=$!
cleanup_later "kill $poll_pid"
for _ in $(seq 1 50); do [ "$(relay_node)" = "n$X" ] && break; sleep 0.1; done
[ "$(relay_node)" = "n$X" ] || violation "the relay is not on n$X, the first node of its list (on: $(relay_node))"

kill_node() { # I: SIGKILL node I
  local pid
  pid="$(nats_cluster_node_pid "$CLUSTER_DIR" "$1")"
  kill -KILL "$pid"
  for _ in $(seq 1 50); do port_in_use $((BASE + $1)) || break; sleep 0.1; done
}
sleep_s() { sleep "$1"; }

sleep_s "$BASELINE_SECONDS"
say "(b) SIGKILL n$X, the relay's node"
t_bk=$(now_ms)
kill_node "$X"
sleep_s "$DOWN_SECONDS"
say "(b) restarting n$X"
t_br=$(now_ms)
nats_cluster_node_start "$BASE" "$CLUSTER_DIR" "$X"
nats_cluster_wait "$BASE" 60 || violation "the cluster has no meta leader 60 s after n$X restarted"
sleep_s "$SETTLE_SECONDS"

leader="$(stream_leader)"
[ "$leader" = "n$L" ] || say "  note: the stream is now led by ${leader:-nobody}, not n$L"
L=${leader#n}
[ "$(relay_node)" != "n$L" ] || violation "the relay is on the stream's leader n$L: phase (a) would not separate the two"
say "(a) SIGKILL n$L, the stream's leader (the relay on $(relay_node))"
t_ak=$(now_ms)
kill_node "$L"
sleep_s "$DOWN_SECONDS"
say "(a) restarting n$L"
t_ar=$(now_ms)
nats_cluster_node_start "$BASE" "$CLUSTER_DIR" "$L"
nats_cluster_wait "$BASE" 60 || violation "the cluster has no meta leader 60 s after n$L restarted"
sleep_s "$SETTLE_SECONDS"

say "waiting for the load to end and the relay to drain"
wait "$enqueue_pid" || violation "the enqueue failed: $(tail -n 3 "$WORK/enqueue.log")"
t_end=$(now_ms)
pending() { psql "$db_url" -Atc "SELECT count(*) FROM $table WHERE published_at IS NULL AND dead_lettered_at IS NULL"; }
for _ in $(seq 1 600); do [ "$(pending)" = 0 ] && break; sleep 0.1; done
kill "$poll_pid" 2>/dev/null || true

say "publishing the $REPUBLISH earliest events again, after the leader change"
"$CHAOS_BIN" republish "${outbox[@]}" --nats-url "$ALL_URLS" --subject "$subject" --count "$REPUBLISH" \
  >"$WORK/republish.json" 2>"$WORK/republish.log" || violation "republish failed: $(tail -n 3 "$WORK/republish.log")"

kill -TERM "$relay_pid"
wait "$relay_pid" || true
kill -TERM "$watch_pid"
wait "$watch_pid" || true
"$CHAOS_BIN" verify "${outbox[@]}" --nats-url "$ALL_URLS" --stream "$stream" \
  --acks-dir "$WORK/acks" --watch "$WORK/watch.json" >"$WORK/verdict.json" || true

# ---------------------------------------------------------------- figures
# phase NAME FROM TO: commit-to-ack of the events committed in [FROM, TO) (ms since epoch).
phase() {
  psql "$db_url" -AtF' ' -c "
    SELECT '$1', count(*),
      coalesce(round((percentile_cont(0.5) WITHIN GROUP (ORDER BY ms))::numeric), 0),
      coalesce(round((percentile_cont(0.99) WITHIN GROUP (ORDER BY ms))::numeric), 0),
      coalesce(round(max(ms)::numeric), 0)
    FROM (SELECT extract(epoch FROM published_at - created_at) * 1000 AS ms FROM $table
          WHERE created_at >= to_timestamp($2 / 1000.0) AND created_at < to_timestamp($3 / 1000.0)
            AND published_at IS NOT NULL) s"
}
{
  phase baseline "$t0" "$t_bk"
  phase publisher-node-down "$t_bk" "$t_br"
  phase after-publisher-node "$t_br" "$t_ak"
  phase leader-down "$t_ak" "$t_ar"
  phase after-leader "$t_ar" "$t_end"
} >"$WORK/phases.txt"
# The time without a stream leader: from the kill to the line "new stream leader for ..." the
# next leader logs (the nodes' /jsz views lag behind the election: a follower may still name
# itself or the dead leader for seconds).
elected_ms=$(grep -h "new stream leader for '\$G > $stream'" "$CLUSTER_DIR"/n*/nats.log |
  sed -E 's/^\[[0-9]+\] ([0-9/]+ [0-9:.]+) .*/\1/' | while read -r stamp; do
  date -d "$(tr / - <<<"${stamp% *}") ${stamp#* }" +%s%3N
done | sort -n | awk -v t="$t_ak" '$1 > t { print; exit }')
no_leader_ms=$([ -n "$elected_ms" ] && echo $((elected_ms - t_ak)) || echo unknown)
# The time the relay was on no node: from the kill to the first sample that finds it elsewhere.
relay_off_ms=$(awk -v t0="$t_bk" -v killed="n$X" '$1 >= t0 && $2 != "-" && $2 != killed { print $1 - t0; exit }' "$WORK/timeline.txt")
relay_off_ms=${relay_off_ms:-unknown}
relay_after=$(awk -v t="$t_br" '$1 < t && $2 != "-" { n = $2 } END { print n }' "$WORK/timeline.txt")
psql "$db_url" -AtF' | ' -c "SELECT count(*), left(regexp_replace(last_error, '[0-9a-f-]{36}', '<id>', 'g'), 120)
  FROM $table WHERE last_error IS NOT NULL GROUP BY 2 ORDER BY 1 DESC" >"$WORK/errors.txt"
max_attempts=$(psql "$db_url" -Atc "SELECT coalesce(max(attempts), 0) FROM $table")
retried_rows=$(psql "$db_url" -Atc "SELECT count(*) FROM $table WHERE last_error IS NOT NULL")
transient_logged=$(grep -c "failed on the broker's side" "$WORK/relay.log" || true)
counted_logged=$(grep -c "outbox publish failed; will retry" "$WORK/relay.log" || true)

v() { jq -r "$1" "$WORK/verdict.json"; }
r() { jq -r "$1" "$WORK/republish.json"; }
jq -n --rawfile phases "$WORK/phases.txt" --rawfile errors "$WORK/errors.txt" \
  --slurpfile verdict "$WORK/verdict.json" --slurpfile republish "$WORK/republish.json" \
  --arg no_leader "$no_leader_ms" --arg relay_off "$relay_off_ms" --argjson rate "$RATE" \
  --argjson down "$DOWN_SECONDS" --argjson max_attempts "$max_attempts" --argjson retried "$retried_rows" \
  '{rate: $rate, down_seconds: $down, no_stream_leader_ms: $no_leader, relay_without_node_ms: $relay_off,
    max_attempts_of_a_row: $max_attempts, rows_that_failed_a_publish: $retried,
    phases: ($phases | split("\n") | map(select(length > 0) | split(" ") | {phase: .[0], events: (.[1] | tonumber), p50_ms: (.[2] | tonumber), p99_ms: (.[3] | tonumber), max_ms: (.[4] | tonumber)})),
    errors: ($errors | split("\n") | map(select(length > 0))), verdict: $verdict[0], republish: $republish[0]}' \
  >"$CHAOS_RESULTS/$SCRIPT-verdict.json"

echo
say "commit-to-ack (published_at - created_at), by when the event was committed:"
awk '{ printf "  %-22s %6d events  p50 %6d ms  p99 %6d ms  max %6d ms\n", $1, $2, $3, $4, $5 }' "$WORK/phases.txt"
say "(b) the relay was without a node for ${relay_off_ms} ms, then on $relay_after (its list: n$X, n$Y, ...)"
say "(a) the stream had no leader for ${no_leader_ms} ms after n$L died (to the new leader's log line)"
say "publish errors: $retried_rows rows failed at least once (max attempts of a row: $max_attempts); relay log: $transient_logged broker-side (not counted), $counted_logged counted towards max-attempts"
sed 's/^/    /' "$WORK/errors.txt"
echo
check "$(v '(.missing_from_stream == 0 and .published_rows == .events and .pending_rows == 0) | if . then 1 else 0 end')" \
  "none lost: $(v .published_rows) of $(v .events) rows published, $(v .missing_from_stream) missing from the stream, $(v .pending_rows) pending"
check "$(v '(.stream_messages == .events and .extra_in_stream == 0) | if . then 1 else 0 end')" \
  "none stored twice: the stream holds $(v .stream_messages) messages for $(v .events) events ($(v .acks_reported_duplicate) acks reported duplicates)"
check "$(v '(.dead_lettered_rows == 0) | if . then 1 else 0 end')" "no dead letter: $(v .dead_lettered_rows)"
check "$(r "(.sent == $REPUBLISH and .duplicates == .sent and .stored_again == 0) | if . then 1 else 0 end")" \
  "the duplicate window held across the leader change: $(r .duplicates) of $(r .sent) copies sent again acked as duplicates, $(r .stored_again) stored again, $(r .failed) failed"
check "$([ -n "$relay_after" ] && [ "$relay_after" != "n$X" ] && echo 1 || echo 0)" \
  "the relay reconnected to another node of its list when n$X died (to ${relay_after:-none})"
[ "$counted_logged" = 0 ] || echo "  note: $counted_logged publish failures were counted towards max-attempts (see the errors above)"
finish
