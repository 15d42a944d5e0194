#!/usr/bin/env bash
# The demo on a PRIVATE PostgreSQL, under load (20 clients, a fresh key per request), while
# PostgreSQL is restarted twice: `pg_ctl restart -m fast` at 8 s, then stopped (-m fast) at
# 16 s and started again 8 s later (an outage longer than the demo's 5 s pool acquire timeout,
# so that waiting requests hit it). Then the demo is
# restarted (its in-process cache emptied, so the database answers) and EVERY key that was sent
# is sent again.
#
# Guarantees checked (exit 1 if any fails):
#   - during the outages requests fail with 5xx application/problem+json (500, or 503
#     store-unavailable), never with a timeout or a dropped connection, and the outage was seen;
#   - no request takes longer than BOUND_MS (default 7000 = the demo's pool acquire timeout of
#     5 s + 2 s margin); the load tool's own timeout is 15 s so a hang would show;
#   - requests sent before the first restart, and from 2 s after PostgreSQL is back, all
#     succeed (201): the demo's connection pool recovers by itself;
#   - replaying every key: each key has at most one payment row (exactly one after the
#     replay); a key whose first answer was a 201 replays 201 + Idempotent-Replayed with the
#     same paymentId, the stored one; a key whose first request failed may run on replay
#     (nothing was stored) or replay (it had committed before its answer was lost), and its
#     replay's paymentId is the stored one.
#
#   scripts/chaos/postgres-restart.sh          # CLIENTS=20 LOAD_SECONDS=35 OUTAGE_SECONDS=8
SCRIPT=postgres-restart
source "$(dirname "$0")/lib.sh"
CLIENTS="${CLIENTS:-20}"
LOAD_SECONDS="${LOAD_SECONDS:-35}"
RESTART_AT="${RESTART_AT:-8}"
OUTAGE_AT="${OUTAGE_AT:-16}"
OUTAGE_SECONDS="${OUTAGE_SECONDS:-8}"
BOUND_MS="${BOUND_MS:-7000}"
GRACE_MS="${GRACE_MS:-2000}"
need psql jq curl python3

build
pg_private_start
db_url="$PG_URL/demo"
demo_start "$db_url"
say "demo on $DEMO_URL, private database $db_url"

say "load: $CLIENTS clients, fresh keys, ${LOAD_SECONDS}s"
load during --clients "$CLIENTS" --fresh --duration "${LOAD_SECONDS}s" --timeout 15s \
  --key-prefix "pgr-$RUN_ID" &
load_pid=$!
sleep "$RESTART_AT"
restart_start=$(now_ms)
"${PG_CTL[@]}" restart -m fast >/dev/null
restart_end=$(now_ms)
say "pg_ctl restart -m fast took $((restart_end - restart_start)) ms"
sleep "$((OUTAGE_AT - RESTART_AT))"
outage_start=$(now_ms)
"${PG_CTL[@]}" stop -m fast >/dev/null
sleep "$OUTAGE_SECONDS"
"${PG_CTL[@]}" start >/dev/null
outage_end=$(now_ms)
say "PostgreSQL stopped for $((outage_end - outage_start)) ms"
wait "$load_pid"
summary during
jq -r '.timeline[] | "    \(.second)s \(.statuses | tojson)"' "$WORK/during.json"

say "restarting the demo (empty in-process cache), replaying every key once"
demo_stop
demo_start "$db_url"
load replay --clients "$CLIENTS" --keys-from "$WORK/during.keys.jsonl" --timeout 15s
summary replay
psql "$db_url" -AtF ' ' -c "SELECT order_id, count(*), string_agg(payment_id::text, ',') FROM payments GROUP BY 1" \
  >"$WORK/rows.txt"

echo
python3 - "$WORK" "$restart_start" "$restart_end" "$outage_start" "$outage_end" "$BOUND_MS" "$GRACE_MS" \
  >"$WORK/checks.txt" <<'EOF'
import json, sys
work, r0, r1, o0, o1, bound, grace = sys.argv[1], *map(int, sys.argv[2:])
during = json.load(open(f"{work}/during.json"))
replay = json.load(open(f"{work}/replay.json"))
first = [json.loads(l) for l in open(f"{work}/during.keys.jsonl")]
again = {k["key"]: k for k in map(json.loads, open(f"{work}/replay.keys.jsonl"))}
rows = {}
for line in open(f"{work}/rows.txt"):
    key, n, ids = line.split()
    rows[key] = (int(n), ids.split(","))
start = during["started_unix_ms"]
def out(ok, text): print(("ok|" if ok else "violation|") + text)

windows = {"before the restart": [], "restart and outage": [], "after recovery": []}
for k in first:
    sent = start + k["first_sent_ms"]
    if sent < r0 - 1000: windows["before the restart"].append(k)
    elif sent > o1 + grace: windows["after recovery"].append(k)
    else: windows["restart and outage"].append(k)
for name, keys in windows.items():
    counts = {}
    for k in keys: counts[k["first_status"]] = counts.get(k["first_status"], 0) + 1
    print(f"info|{name}: {len(keys)} keys, first statuses {json.dumps(counts, sort_keys=True)}")

failed = [k for k in first if k["first_status"] != "201"]
statuses = during["statuses"]
out(all(s == "201" or s.startswith("5") for s in statuses),
    f"every answer is a 201 or a 5xx (statuses {json.dumps(statuses)})")
out(during["server_errors_without_problem"] == 0, "every 5xx is application/problem+json")
out(len(failed) > 0, f"the outage was observed: {len(failed)} requests failed, problems {json.dumps(during['problems'])}")
out(during["latency_ms"]["max"] <= bound,
    f"no request took longer than {bound} ms (max {during['latency_ms']['max']} ms, p99 {during['latency_ms']['p99']} ms)")
out(all(k["first_status"] == "201" for k in windows["before the restart"]), "every request before the restart succeeded")
out(len(windows["after recovery"]) > 0 and all(k["first_status"] == "201" for k in windows["after recovery"]),
    f"every request from {grace} ms after PostgreSQL was back succeeded: the pool recovered")

# Replays: no double execution, same paymentId.
several = [k for k, (n, _) in rows.items() if n > 1]
out(not several, f"at most one payment row per key ({len(rows)} keys with a row, {len(several)} with more)")
unknown = [k for k in rows if k not in again and k not in {f['key'] for f in first}]
out(not unknown, f"no payment row for a key that was never sent ({len(unknown)})")
bad_replays, ran_on_replay, committed_before_failure = [], 0, 0
for k in first:
    r = again.get(k["key"])
    n, ids = rows.get(k["key"], (0, []))
    if r is None or r["first_status"] != "201" or n != 1 or r["payment_ids"] != ids:
        bad_replays.append((k["key"], k["first_status"], r and r["first_status"], n))
        continue
    if k["first_status"] == "201":
        if not r["first_replayed"] or r["payment_ids"] != [k["first_payment_id"]]:
            bad_replays.append((k["key"], "201", "replay differs", n))
    elif r["first_replayed"]:
        committed_before_failure += 1
    else:
        ran_on_replay += 1
ok201 = sum(1 for k in first if k["first_status"] == "201")
out(not bad_replays, f"{len(first)} keys replayed: {ok201} first-201 keys replayed the same stored paymentId; "
    f"{ran_on_replay} failed keys ran on replay, {committed_before_failure} failed keys had committed and replayed"
    + (f"; wrong: {bad_replays[:5]}" if bad_replays else ""))
out(replay["statuses"] == {"201": len(first)}, f"every replay answered 201 (statuses {json.dumps(replay['statuses'])})")
EOF
while IFS='|' read -r verdict text; do
  case "$verdict" in
    ok) check 1 "$text" ;;
    violation) check 0 "$text" ;;
    *) echo "  $text" ;;
  esac
done <"$WORK/checks.txt"
grep -c "pool timed out\|PoolTimedOut" "$WORK"/demo-1.log | sed 's/^/  demo log lines mentioning the pool timeout: /' || true
finish
