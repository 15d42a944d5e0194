#!/usr/bin/env bash
# The outbox relay killed repeatedly: 10,000 events pending in an outbox (a fresh database on
# the shared PostgreSQL), drained by a relay process (`outbox-chaos relay`: the library's Relay
# with the NATS JetStream publisher, on a PRIVATE nats-server with its own stream) that is
# killed with SIGKILL every KILL_EVERY_MS on average (default 300 ms; each life lasts a uniform
# random 50% to 150% of it, so that the kills do not lock onto one phase of the relay's
# claim / publish / mark cycle) and started again, until nothing is pending.
#
# Each relay process tags every copy it publishes with its number (header Chaos-Relay-Life) and
# prints one line per JetStream ack (`<id> <duplicate 0|1>`), so a killed process leaves a
# record of what it had published; a core NATS subscription on the subjects sees every copy that
# reached the server, before JetStream's deduplication, and who sent it.
#
# Guarantees checked by `outbox-chaos verify` (exit 1 if any fails):
#   - none lost: every outbox row is marked published and every outbox id is in the stream;
#   - none stored twice: the stream holds exactly one message per event (Nats-Msg-Id dedup);
#   - duplicates bounded by the in-flight batches: the messages a killed process had sent and
#     a later process sent again are at most 2 x workers x batch-size per kill (each worker may
#     hold the batch it publishes and the previous one, published, its mark in flight).
#
#   scripts/chaos/relay-kill.sh                # EVENTS=10000 WORKERS=2 BATCH=100 KILL_EVERY_MS=300
SCRIPT=relay-kill
source "$(dirname "$0")/lib.sh"
EVENTS="${EVENTS:-10000}"
WORKERS="${WORKERS:-2}"
BATCH="${BATCH:-100}"
KILL_EVERY_MS="${KILL_EVERY_MS:-300}"
MAX_SECONDS="${MAX_SECONDS:-300}"
ORDERING="${ORDERING:-ordered}"
need psql jq

build
nats_private_start
db_url="$(shared_fresh_db "idempotency_chaos_relay_$$")"
stream="CHAOS_RELAY_$$"
prefix="chaos$$"
table=outbox_chaos
outbox=(--database-url "$db_url" --table "$table" --ordering "$ORDERING" --workers "$WORKERS" --batch-size "$BATCH")

"$CHAOS_BIN" stream --nats-url "$NATS_URL" --stream "$stream" --subjects "$prefix.>"
"$CHAOS_BIN" watch --nats-url "$NATS_URL" --subjects "$prefix.>" --out "$WORK/watch.json" 2>"$WORK/watch.log" &
watch_pid=$!
cleanup_later "stop_ours KILL $watch_pid outbox-chaos"
for _ in $(seq 1 100); do grep -q watching "$WORK/watch.log" && break; sleep 0.1; done
grep -q watching "$WORK/watch.log" || { cat "$WORK/watch.log"; echo "the watcher did not start" >&2; exit 2; }

say "enqueueing $EVENTS events ($ORDERING, 1000 aggregates)"
"$CHAOS_BIN" enqueue "${outbox[@]}" --count "$EVENTS" | tee "$WORK/enqueue.json"

pending() {
  psql "$db_url" -Atc "SELECT count(*) FROM $table WHERE published_at IS NULL AND dead_lettered_at IS NULL"
}
mkdir -p "$WORK/acks"
say "relay: $WORKERS workers x batch $BATCH, SIGKILL every $KILL_EVERY_MS ms until nothing is pending"
started=$(now_ms)
# shellcheck disable=SC2016 # expanded when the cleanup runs: the relay alive at that time
cleanup_later 'stop_ours KILL "${relay_pid:-0}" outbox-chaos'
life=0
left=$EVENTS
while [ "$left" -gt 0 ]; do
  if [ $(($(now_ms) - started)) -gt $((MAX_SECONDS * 1000)) ]; then
    violation "$left events still pending after $MAX_SECONDS s"
    break
  fi
  life=$((life + 1))
  RUST_LOG=warn "$CHAOS_BIN" relay "${outbox[@]}" --nats-url "$NATS_URL" \
    --subject "$prefix.{aggregate_type}.{event_type}" --life "$life" >"$WORK/acks/life-$life.acks" 2>>"$WORK/relay.log" &
  relay_pid=$!
  life_ms=$((KILL_EVERY_MS / 2 + RANDOM % (KILL_EVERY_MS + 1)))
  sleep "$(printf '%d.%03d' $((life_ms / 1000)) $((life_ms % 1000)))"
  kill -KILL "$relay_pid" 2>/dev/null || true
  wait "$relay_pid" 2>/dev/null || true
  left=$(pending)
  if [ $((life % 10)) = 0 ]; then say "  $life relay processes killed, $left pending"; fi
done
elapsed=$(($(now_ms) - started))
say "drained in $elapsed ms by $life relay processes, each killed with SIGKILL"
kill -TERM "$watch_pid"
wait "$watch_pid" || true

"$CHAOS_BIN" verify "${outbox[@]}" --nats-url "$NATS_URL" --stream "$stream" \
  --acks-dir "$WORK/acks" --watch "$WORK/watch.json" >"$WORK/verdict.json" || true
jq --argjson ms "$elapsed" '. + {drain_ms: $ms, kill_every_ms: '"$KILL_EVERY_MS"'}' "$WORK/verdict.json" \
  >"$CHAOS_RESULTS/$SCRIPT-verdict.json"
jq . "$WORK/verdict.json"
lives_with_acks=$(find "$WORK/acks" -name '*.acks' -size +0 | wc -l)
say "$lives_with_acks of $life relay processes published something before being killed"
echo
v() { jq -r "$1" "$WORK/verdict.json"; }
check "$(v '(.missing_from_stream == 0 and .published_rows == .events and .pending_rows == 0) | if . then 1 else 0 end')" \
  "none lost: $(v .published_rows) of $(v .events) rows published, $(v .missing_from_stream) missing from the stream"
check "$(v '(.stream_messages == .events and .extra_in_stream == 0) | if . then 1 else 0 end')" \
  "none stored twice: the stream holds $(v .stream_messages) messages"
check "$(v '(.resent_per_kill_max <= .in_flight_bound) | if . then 1 else 0 end')" \
  "resent per kill: max $(v .resent_per_kill_max) (of which acked before the kill: max $(v .acked_then_resent_per_kill_max)), mean $(v '.resent_per_kill_mean * 100 | round / 100') <= bound $(v .in_flight_bound) (2 x workers x batch)"
say "duplicate deliveries before JetStream dedup: $(v .duplicate_deliveries) over $(v .relay_processes) kills; JetStream reported $(v .acks_reported_duplicate) duplicate acks"
[ "$(v '.violations | length')" = 0 ] || violation "verify: $(v '.violations | join("; ")')"
[ "$(v .missing_from_subscription)" = 0 ] || echo "  note: the core subscription missed $(v .missing_from_subscription) ids (it is at-most-once; the stream decides)"
finish
