#!/usr/bin/env bash
# The demo behind PgBouncer (pool_mode = transaction, `persistence.pooler: transaction`) on a
# PRIVATE primary with a streaming standby, under load (POST /charges: a record, a charge row
# and a ChargeCreated outbox event per key, in one transaction), while the primary is stopped
# `-m immediate` at FAIL_AT seconds, the standby promoted and PgBouncer repointed to it
# (config rewritten, RELOAD, RECONNECT). The demo's relay publishes to a PRIVATE nats-server
# (JetStream, the demo's stream IDEMPOTENCY_DEMO with its Nats-Msg-Id window) all along. Then
# the relay drains the new primary's outbox, the demo is restarted (its in-process cache
# emptied) and every key is sent again: the client's retry. Last, the relay drains again and
# the stream is read message by message (scripts/nats_stream.py headers).
#
#   scripts/chaos/pg-failover.sh sync    # synchronous_standby_names + synchronous_commit = on
#   scripts/chaos/pg-failover.sh async   # asynchronous streaming replication
#
# Measured (printed, and in $CHAOS_RESULTS/pg-failover-<mode>-*.json): requests failed during
# the switch, time to recover (kill to the last failure, kill to the first success sent after
# it), acknowledged keys (first answer 201) whose record, charge row or outbox event the new
# primary lacks (committed and lost), keys executed twice (an acknowledged key whose retry ran
# the action again instead of replaying), outbox events left pending after the relay drained;
# in the stream, by Nats-Msg-Id against the new primary's outbox rows after the retry: events
# stored twice, committed events missing, events whose row the new primary lacks (published
# from the old primary, their commit lost with it), acknowledged keys whose event is missing,
# and acknowledged keys with the events of two charges (the first run's and the retry's).
#
# Guarantees checked (exit 1 if any fails):
#   - both:  every answer is a 201 or a problem+json 5xx; the switch was observed; every request
#            sent GRACE_MS after the promotion succeeded; no key has two charge rows; every charge
#            row on the new primary has its event, and the relay publishes them all; the stream
#            holds every event of the new primary's outbox, none twice;
#   - sync:  no acknowledged key lost its record, charge or event (in the database or in the
#            stream), no acknowledged key ran twice, and the stream holds no event without its
#            row;
#   - async: the keys lost and run again are counted (reported, not a violation: the commits
#            acknowledged within the replication lag are gone with the old primary).
#
# Needs PostgreSQL's server programs (Debian's postgresql: initdb and pg_ctl are taken from
# /usr/lib/postgresql/<version>/bin), pgbouncer, nats-server, jq, curl, python3: installed with
# apt-get when absent (scripts/services.sh).
#
# Ports: CHAOS_PG_PORT (primary, default 5442), +1 (standby), CHAOS_PGBOUNCER_PORT (6442),
# CHAOS_NATS_PORT (4252), CHAOS_DEMO_PORT. Everything started here is stopped on exit.
# PROFILE=debug to reuse a debug build, CHAOS_BIN_DIR=<dir> to use binaries built already.
# CLIENTS=16 LOAD_SECONDS=20 FAIL_AT=8 GRACE_MS=3000
SCRIPT=pg-failover
MODE="${1:-sync}"
case "$MODE" in sync | async) ;; *) echo "usage: $0 sync|async" >&2; exit 2 ;; esac
export CHAOS_PG_PORT="${CHAOS_PG_PORT:-5442}"
export CHAOS_NATS_PORT="${CHAOS_NATS_PORT:-4252}"
source "$(dirname "$0")/lib.sh"
# shellcheck source=scripts/services.sh
source scripts/services.sh
# PostgreSQL installed (its server programs and psql; the local server is not used here).
ensure_postgres
ensure_tools jq curl python3
[ -n "$(pgbouncer_bin)" ] || apt_install pgbouncer
command -v nats-server >/dev/null || [ -x /usr/sbin/nats-server ] || apt_install nats-server
need psql jq curl python3
PG_BIN="$(pg_server_bin)"
SCRIPT="pg-failover-$MODE"
CLIENTS="${CLIENTS:-16}"
LOAD_SECONDS="${LOAD_SECONDS:-20}"
FAIL_AT="${FAIL_AT:-8}"
GRACE_MS="${GRACE_MS:-3000}"
STANDBY_PORT=$((CHAOS_PG_PORT + 1))
BOUNCER_PORT="${CHAOS_PGBOUNCER_PORT:-6442}"
if [ -n "${CHAOS_BIN_DIR:-}" ]; then # binaries built already (idempotency-demo, idempotency-load)
  DEMO_BIN="$CHAOS_BIN_DIR/idempotency-demo" LOAD_BIN="$CHAOS_BIN_DIR/idempotency-load"
  mkdir -p "$CHAOS_RESULTS"
else
  build
fi
require_free_port "$CHAOS_PG_PORT" CHAOS_PG_PORT
require_free_port "$STANDBY_PORT" "CHAOS_PG_PORT (its standby on +1)"
require_free_port "$BOUNCER_PORT" CHAOS_PGBOUNCER_PORT
require_free_port "$CHAOS_NATS_PORT" CHAOS_NATS_PORT

as=()
[ "$(id -u)" = 0 ] && as=(runuser -u postgres --)
# pg_ctl_for DIR PORT [EXTRA -c SETTINGS]: the pg_ctl command of one server.
pg_ctl_for() {
  local dir=$1 port=$2
  shift 2
  echo "${as[*]} $PG_BIN/pg_ctl -D $dir -l $dir/server.log -w -t 60 -o '-p $port -c listen_addresses=127.0.0.1 -k $dir -c max_connections=100 $*'"
}

PRIMARY="$WORK/primary" STANDBY="$WORK/standby"
mkdir -p "$PRIMARY"
[ "$(id -u)" = 0 ] && chown postgres "$PRIMARY" "$WORK"
"${as[@]}" "$PG_BIN/initdb" -D "$PRIMARY" -U postgres --auth=trust -E UTF8 >"$WORK/initdb.log" 2>&1 ||
  { tail -n 5 "$WORK/initdb.log"; echo "initdb failed" >&2; exit 2; }
PRIMARY_CTL="$(pg_ctl_for "$PRIMARY" "$CHAOS_PG_PORT" -c wal_level=replica -c max_wal_senders=4)"
eval "$PRIMARY_CTL start" >/dev/null
cleanup_later "eval \"\$PRIMARY_CTL stop -m immediate\""
psql "postgres://postgres@127.0.0.1:$CHAOS_PG_PORT/postgres" -qc "CREATE DATABASE demo"

"${as[@]}" "$PG_BIN/pg_basebackup" -h 127.0.0.1 -p "$CHAOS_PG_PORT" -U postgres -D "$STANDBY" -R -X stream \
  >"$WORK/basebackup.log" 2>&1 || { tail -n 5 "$WORK/basebackup.log"; echo "pg_basebackup failed" >&2; exit 2; }
STANDBY_CTL="$(pg_ctl_for "$STANDBY" "$STANDBY_PORT" -c cluster_name=standby1 -c hot_standby=on)"
eval "$STANDBY_CTL start" >/dev/null
cleanup_later "eval \"\$STANDBY_CTL stop -m immediate\""
if [ "$MODE" = sync ]; then
  # Only now that the standby exists: before, every commit would wait for it.
  psql "postgres://postgres@127.0.0.1:$CHAOS_PG_PORT/postgres" -q \
    -c "ALTER SYSTEM SET synchronous_standby_names = 'standby1'" \
    -c "ALTER SYSTEM SET synchronous_commit = on" -c "SELECT pg_reload_conf()" >/dev/null
fi
state=""
for _ in $(seq 1 100); do
  state=$(psql "postgres://postgres@127.0.0.1:$CHAOS_PG_PORT/postgres" -Atc \
    "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'standby1'")
  if [ "$MODE" = sync ]; then [ "$state" = sync ] && break; else [ -n "$state" ] && break; fi
  sleep 0.1
done
say "primary on $CHAOS_PG_PORT, standby on $STANDBY_PORT streaming ($state)"
check "$([ "$MODE" = sync ] && [ "$state" = sync ] || { [ "$MODE" = async ] && [ "$state" = async ]; } && echo 1 || echo 0)" \
  "the standby replicates $MODE (pg_stat_replication.sync_state = $state)"

BOUNCER_DIR="$WORK/pgbouncer"
pgbouncer_start "$BOUNCER_PORT" "$CHAOS_PG_PORT" "$BOUNCER_DIR"
cleanup_later "pgbouncer_stop $BOUNCER_PORT $BOUNCER_DIR"
nats_private_start
STREAM=IDEMPOTENCY_DEMO # the demo's own (it creates it at start, its window the relay's republish window)
db_url="postgres://postgres@127.0.0.1:$BOUNCER_PORT/demo"
demo_env=(IDEMPOTENCY__PERSISTENCE__POOLER=transaction OUTBOX__RELAY__WAKE_UP=poll
  OUTBOX__RELAY__POLL_INTERVAL=100ms NATS_URL="$NATS_URL")
demo_start "$db_url" "${demo_env[@]}"
say "demo on $DEMO_URL through PgBouncer $db_url, its relay to $NATS_URL (stream $STREAM)"

say "load: $CLIENTS clients, fresh keys, POST /charges, ${LOAD_SECONDS}s; the primary dies at ${FAIL_AT}s"
load during --endpoint charges --clients "$CLIENTS" --fresh --duration "${LOAD_SECONDS}s" --timeout 15s \
  --key-prefix "pgf-$RUN_ID" &
load_pid=$!
sleep "$FAIL_AT"
lag=$(psql "postgres://postgres@127.0.0.1:$CHAOS_PG_PORT/postgres" -Atc \
  "SELECT coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn), 0) FROM pg_stat_replication" 2>/dev/null || echo "?")
kill_ms=$(now_ms)
eval "$PRIMARY_CTL stop -m immediate" >/dev/null
eval "$STANDBY_CTL promote" >/dev/null
promoted_ms=$(now_ms)
# Repoint the stable address: the same PgBouncer, its database entry on the new primary.
sed -i "s/port=$CHAOS_PG_PORT\$/port=$STANDBY_PORT/" "$BOUNCER_DIR/pgbouncer.ini"
psql "postgres://postgres@127.0.0.1:$BOUNCER_PORT/pgbouncer" -qc "RELOAD" >/dev/null
psql "postgres://postgres@127.0.0.1:$BOUNCER_PORT/pgbouncer" -qc "RECONNECT" >/dev/null 2>&1 || true
repointed_ms=$(now_ms)
say "primary stopped -m immediate (replay lag then: $lag bytes), standby promoted in $((promoted_ms - kill_ms)) ms, PgBouncer repointed at +$((repointed_ms - kill_ms)) ms"
wait "$load_pid"
summary during

NEW="postgres://postgres@127.0.0.1:$STANDBY_PORT/demo"
# drain: 1 once the relay has published every event of the new primary's outbox (within 30 s).
drain() {
  local _
  for _ in $(seq 1 300); do
    [ "$(psql "$NEW" -Atc "SELECT count(*) FROM outbox WHERE published_at IS NULL")" = 0 ] && { echo 1; return; }
    sleep 0.1
  done
  echo 0
}
drained=$(drain)
psql "$NEW" -At -c "SELECT id FROM charges" >"$WORK/charges.txt"
psql "$NEW" -At -c "SELECT aggregate_id FROM outbox WHERE aggregate_type = 'charge' AND event_type = 'ChargeCreated'" \
  >"$WORK/events.txt"
# A completed record stores the answer, the charge id in it.
psql "$NEW" -At -c "SELECT result_payload::text FROM idempotency_records WHERE status = 'COMPLETED'" \
  >"$WORK/records.txt"

say "restarting the demo (empty in-process cache), sending every key again (the client's retry)"
demo_stop
demo_start "$db_url" "${demo_env[@]}"
load replay --endpoint charges --clients "$CLIENTS" --keys-from "$WORK/during.keys.jsonl" --timeout 15s
summary replay
psql "$NEW" -At -c "SELECT id FROM charges" >"$WORK/charges-after.txt"
psql "$NEW" -At -c "SELECT result_payload::text FROM idempotency_records WHERE status = 'COMPLETED'" \
  >"$WORK/records-after.txt"
drained_after=$(drain)
psql "$NEW" -AtF' ' -c "SELECT id, aggregate_id FROM outbox WHERE aggregate_type = 'charge' AND event_type = 'ChargeCreated'" \
  >"$WORK/outbox-after.txt"
NATS_URL="$NATS_URL" python3 scripts/nats_stream.py headers "$STREAM" >"$WORK/stream.jsonl"
say "the stream holds $(wc -l <"$WORK/stream.jsonl") messages; the new primary's outbox $(wc -l <"$WORK/outbox-after.txt") events"

echo
python3 - "$WORK" "$MODE" "$kill_ms" "$repointed_ms" "$GRACE_MS" "$drained" "$drained_after" \
  "$CHAOS_RESULTS/$SCRIPT-figures.json" >"$WORK/checks.txt" <<'EOF'
import collections, json, re, sys
work, mode = sys.argv[1], sys.argv[2]
kill, repointed, grace, drained, drained_after = map(int, sys.argv[3:8])
figures_path = sys.argv[8]
during = json.load(open(f"{work}/during.json"))
replay = json.load(open(f"{work}/replay.json"))
first = [json.loads(l) for l in open(f"{work}/during.keys.jsonl")]
again = {k["key"]: k for k in map(json.loads, open(f"{work}/replay.keys.jsonl"))}
charges = set(l.strip() for l in open(f"{work}/charges.txt") if l.strip())
events = set(l.strip() for l in open(f"{work}/events.txt") if l.strip())
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
records = set(UUID.findall(open(f"{work}/records.txt").read()))
charges_after = set(l.strip() for l in open(f"{work}/charges-after.txt") if l.strip())
records_after = UUID.findall(open(f"{work}/records-after.txt").read())
# The new primary's ChargeCreated rows after the retry (id -> charge id), and the stream's.
outbox_after = dict(l.split() for l in open(f"{work}/outbox-after.txt") if l.strip())
stream = [m["headers"] for m in map(json.loads, open(f"{work}/stream.jsonl"))
          if m["headers"].get("Outbox-Aggregate-Type") == "charge"
          and m["headers"].get("Outbox-Event-Type") == "ChargeCreated"]
stored = collections.Counter(h.get("Nats-Msg-Id") for h in stream)
streamed_charges = collections.Counter(h.get("Outbox-Aggregate-Id") for h in stream)
start = during["started_unix_ms"]
def out(ok, text): print(("ok|" if ok else "violation|") + text)
def info(text): print("info|" + text)

acked = [k for k in first if k["first_status"] == "201"]
failed = [k for k in first if k["first_status"] != "201"]
sent = lambda k: start + k["first_sent_ms"]
failed_after_kill = [k for k in failed if sent(k) >= kill - 15000]
last_failure = max((sent(k) for k in failed), default=kill)
first_ok_after = min((sent(k) for k in acked if sent(k) > last_failure), default=None)
lost_charge = [k for k in acked if not set(k.get("payment_ids") or []) <= charges]
lost_event = [k for k in acked if not set(k.get("payment_ids") or []) <= events]
lost_record = [k for k in acked if not set(k.get("payment_ids") or []) <= records]
ran_twice = [k for k in acked if k["key"] in again and again[k["key"]]["first_status"] == "201"
             and not again[k["key"]]["first_replayed"]]
stored_twice = [i for i, n in stored.items() if n > 1]
missing_from_stream = [i for i in outbox_after if i not in stored]
without_row = [i for i in stored if i not in outbox_after]
acked_not_streamed = [k for k in acked if not all(streamed_charges[c] for c in k.get("payment_ids") or [])]
# A key's charges as its answers named them: the first run's, and the retry's when it ran again.
def charges_of(k):
    return set(k.get("payment_ids") or []) | set((again.get(k["key"]) or {}).get("payment_ids") or [])
two_in_stream = [k for k in acked if sum(streamed_charges[c] for c in charges_of(k)) > 1]
figures = {
    "mode": mode,
    "requests": during["requests"], "statuses": during["statuses"],
    "failed_during_switch": len(failed),
    "kill_to_last_failure_ms": last_failure - kill if failed else 0,
    "kill_to_first_success_after_ms": (first_ok_after - kill) if first_ok_after else None,
    "repointed_after_ms": repointed - kill,
    "acknowledged": len(acked),
    "acknowledged_records_lost": len(lost_record),
    "acknowledged_charges_lost": len(lost_charge),
    "acknowledged_events_lost": len(lost_event),
    "acknowledged_keys_run_twice": len(ran_twice),
    "charges_on_new_primary": len(charges),
    "charges_without_event": len(charges - events),
    "outbox_drained": bool(drained),
    "outbox_drained_after_retry": bool(drained_after),
    "outbox_events_after_retry": len(outbox_after),
    "stream_messages": len(stream),
    "stream_events_stored_twice": len(stored_twice),
    "committed_events_missing_from_stream": len(missing_from_stream),
    "stream_events_without_row": len(without_row),
    "acknowledged_events_missing_from_stream": len(acked_not_streamed),
    "acknowledged_keys_with_two_events_in_stream": len(two_in_stream),
}
json.dump(figures, open(figures_path, "w"), indent=2)
info(json.dumps(figures))

statuses = during["statuses"]
out(all(s == "201" or s.startswith("5") for s in statuses), f"every answer is a 201 or a 5xx ({json.dumps(statuses)})")
out(during["server_errors_without_problem"] == 0, "every 5xx is application/problem+json")
out(len(failed) > 0, f"the switch was observed: {len(failed)} requests failed, problems {json.dumps(during['problems'])}")
late = [k for k in first if sent(k) > repointed + grace]
out(len(late) > 0 and all(k["first_status"] == "201" for k in late),
    f"every request sent {grace} ms after PgBouncer was repointed succeeded ({len(late)})")
out(len(records_after) == len(set(records_after)) and set(records_after) == charges_after,
    f"one charge per completed record and no charge without one ({len(charges_after)} charges after the retry)")
out(not (charges - events), f"every charge on the new primary has its ChargeCreated event ({len(charges)} charges)")
out(drained == 1, "the relay published every event of the new primary's outbox")
out(replay["statuses"] == {"201": len(first)}, f"every retry answered 201 ({json.dumps(replay['statuses'])})")
out(drained_after == 1, "the relay published every event committed by the retries")
out(not stored_twice, f"no event stored twice in the stream ({len(stream)} messages, "
    f"{len(stored_twice)} ids more than once)")
out(not missing_from_stream, f"every event of the new primary's outbox is in the stream "
    f"({len(outbox_after)} events, {len(missing_from_stream)} missing)")
summary = (f"{len(acked)} acknowledged keys: {len(lost_record)} records, {len(lost_charge)} charges and "
           f"{len(lost_event)} events lost with the old primary; {len(ran_twice)} ran again on retry; "
           f"in the stream {len(acked_not_streamed)} of their events missing, {len(two_in_stream)} with the "
           f"events of two charges, {len(without_row)} events whose row the new primary lacks")
if mode == "sync":
    out(not lost_record and not lost_charge and not lost_event and not ran_twice
        and not acked_not_streamed and not two_in_stream and not without_row, summary)
else:
    info(summary + " (asynchronous: commits acknowledged within the replication lag)")
EOF
while IFS='|' read -r verdict text; do
  case "$verdict" in
    ok) check 1 "$text" ;;
    violation) check 0 "$text" ;;
    *) echo "  $text" ;;
  esac
done <"$WORK/checks.txt"
finish
