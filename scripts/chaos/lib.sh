#!/usr/bin/env bash
# Shared helpers of the chaos scripts: build, private servers, the demo, verdicts, cleanup.
# Source it from a script under scripts/chaos/; it cds to the workspace root.
#
# Private servers run on their own ports and data directories and are stopped on exit. The
# shared servers (PostgreSQL 5432, Redis 6379, NATS 4222, RabbitMQ 5672) are never stopped,
# restarted or paused: only fresh databases are created there, and dropped on exit.
#
# Environment:
#   PROFILE=release|debug          build profile of the demo and the tools (default release)
#   CHAOS_PG_PORT=5433             private PostgreSQL
#   CHAOS_REDIS_PORT=6380          private Redis
#   CHAOS_NATS_PORT=4223           private NATS (JetStream)
#   CHAOS_DEMO_PORT=18181          the demo
#   SHARED_DATABASE_URL            shared PostgreSQL (default postgres://postgres@127.0.0.1:5432)
#   CHAOS_RESULTS=target/chaos     where measurements are written
# shellcheck disable=SC2034 # variables set here are read by the scripts that source this file
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

PROFILE="${PROFILE:-release}"
CHAOS_PG_PORT="${CHAOS_PG_PORT:-5433}"
CHAOS_REDIS_PORT="${CHAOS_REDIS_PORT:-6380}"
CHAOS_NATS_PORT="${CHAOS_NATS_PORT:-4223}"
CHAOS_DEMO_PORT="${CHAOS_DEMO_PORT:-18181}"
SHARED_DATABASE_URL="${SHARED_DATABASE_URL:-postgres://postgres@127.0.0.1:5432}"
CHAOS_RESULTS="${CHAOS_RESULTS:-target/chaos}"
DEMO_URL="http://127.0.0.1:$CHAOS_DEMO_PORT"

WORK="$(mktemp -d /tmp/chaos.XXXXXX)"
chmod 755 "$WORK"
RUN_ID="$(date +%s)-$$"
VIOLATIONS=0
CLEANUPS=()

say() { printf '[%s] %s\n' "$(date +%T)" "$*"; }
now_ms() { date +%s%3N; }

# violation MESSAGE: records a broken guarantee (the script exits 1 at the end).
violation() { VIOLATIONS=$((VIOLATIONS + 1)); printf '  VIOLATION: %s\n' "$*"; }
# check CONDITION-EXIT-CODE MESSAGE: `check "$((a == b))" "a equals b"` style, 1 = holds.
check() { if [ "$1" = 1 ]; then printf '  ok: %s\n' "$2"; else violation "$2"; fi; }
# check_same MESSAGE FILE-A FILE-B: a check that two (sorted) lists are the same; prints the
# start of their diff when they are not. `check_same "ids" <(psql ...) <(jq ...)`.
check_same() {
  if diff "$2" "$3" >"$WORK/check-same.diff"; then
    check 1 "$1"
  else
    check 0 "$1: they differ"
    head -n 10 "$WORK/check-same.diff"
  fi
}

on_exit() {
  local status=$?
  local i
  for ((i = ${#CLEANUPS[@]} - 1; i >= 0; i--)); do eval "${CLEANUPS[$i]}" >/dev/null 2>&1 || true; done
  drop_shared_dbs
  if [ "${KEEP_WORK:-0}" = 1 ] || [ "$status" != 0 ]; then
    echo "work files kept in $WORK"
  else
    rm -rf "$WORK"
  fi
  exit "$status"
}
trap on_exit EXIT
trap 'exit 130' INT TERM
cleanup_later() { CLEANUPS+=("$1"); }
# stop_ours SIGNAL PID PATTERN: signals PID only if it is still the process this script started
# (its command line matches PATTERN), never a process that reused the id.
stop_ours() {
  [ -r "/proc/$2/cmdline" ] && tr '\0' ' ' <"/proc/$2/cmdline" | grep -q -- "$3" && kill "-$1" "$2"
}

need() {
  local tool
  for tool in "$@"; do
    command -v "$tool" >/dev/null || { echo "missing tool: $tool" >&2; exit 2; }
  done
}

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
require_free_port() {
  if port_in_use "$1"; then echo "port $1 is in use; set ${2:-the port variable} to a free port" >&2; exit 2; fi
}

# Builds the demo and the tools; sets DEMO_BIN, LOAD_BIN, CHAOS_BIN.
build() {
  local flag=()
  [ "$PROFILE" = release ] && flag=(--release)
  say "building idempotency-demo and idempotency-load ($PROFILE)"
  cargo build -q "${flag[@]}" -p idempotency-demo -p idempotency-load
  local dir
  dir="$(cd "${CARGO_TARGET_DIR:-target}" && pwd)/$PROFILE"
  DEMO_BIN="$dir/idempotency-demo"
  LOAD_BIN="$dir/idempotency-load"
  CHAOS_BIN="$dir/outbox-chaos"
  mkdir -p "$CHAOS_RESULTS"
}

# ---------------------------------------------------------------- PostgreSQL

# pg_server_bin: the directory of PostgreSQL's server programs (initdb, pg_ctl, postgres,
# pg_basebackup, one version). Debian keeps them off PATH, in /usr/lib/postgresql/<version>/bin
# (the newest is taken); elsewhere they are on PATH (a link there is followed to its directory).
pg_server_bin() {
  local dir candidates=()
  if command -v initdb >/dev/null; then candidates+=("$(dirname "$(readlink -f "$(command -v initdb)")")"); fi
  while read -r dir; do candidates+=("$dir"); done < <(find /usr/lib/postgresql -mindepth 2 -maxdepth 2 -name bin 2>/dev/null | sort -rV)
  for dir in "${candidates[@]}"; do
    if [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ] && [ -x "$dir/pg_basebackup" ]; then echo "$dir"; return; fi
  done
  echo "missing tools: initdb, pg_ctl and pg_basebackup (PostgreSQL's server programs), neither on PATH nor in /usr/lib/postgresql/*/bin" >&2
  exit 2
}

# Starts a private PostgreSQL (initdb into $WORK/pg, trust auth, 127.0.0.1:$CHAOS_PG_PORT, its
# own socket directory) and creates database `demo`. Sets PG_URL. Stopped and removed on exit.
pg_private_start() {
  local bin
  bin="$(pg_server_bin)"
  require_free_port "$CHAOS_PG_PORT" CHAOS_PG_PORT
  PG_DATA="$WORK/pg"
  mkdir -p "$PG_DATA"
  local as=()
  if [ "$(id -u)" = 0 ]; then chown postgres "$PG_DATA"; as=(runuser -u postgres --); fi
  "${as[@]}" "$bin/initdb" -D "$PG_DATA" -U postgres --auth=trust -E UTF8 >"$WORK/initdb.log" 2>&1
  PG_CTL=("${as[@]}" "$bin/pg_ctl" -D "$PG_DATA" -l "$PG_DATA/server.log" -w -t 60
    -o "-p $CHAOS_PG_PORT -c listen_addresses=127.0.0.1 -k $PG_DATA -c max_connections=100 -c fsync=off")
  "${PG_CTL[@]}" start >/dev/null
  # shellcheck disable=SC2016 # expanded when the cleanup runs
  cleanup_later '"${PG_CTL[@]}" stop -m immediate'
  PG_URL="postgres://postgres@127.0.0.1:$CHAOS_PG_PORT"
  psql "$PG_URL/postgres" -qc "CREATE DATABASE demo"
  say "private PostgreSQL on port $CHAOS_PG_PORT ($PG_DATA)"
}

# Creates a fresh database on the shared server, dropped on exit. Prints its URL.
# Called as `db_url="$(shared_fresh_db NAME)"`, it runs in a subshell, where a cleanup_later
# would be lost: the name goes to a file that on_exit reads (drop_shared_dbs).
shared_fresh_db() {
  local name="$1"
  PGOPTIONS="-c client_min_messages=warning" psql "$SHARED_DATABASE_URL/postgres" -qc "DROP DATABASE IF EXISTS $name WITH (FORCE)" >&2
  echo "$name" >>"$WORK/shared-dbs"
  psql "$SHARED_DATABASE_URL/postgres" -qc "CREATE DATABASE $name" >&2
  echo "$SHARED_DATABASE_URL/$name"
}

# Drops the databases shared_fresh_db created (after the other cleanups stopped their users).
drop_shared_dbs() {
  local name
  [ -f "$WORK/shared-dbs" ] || return 0
  while read -r name; do
    PGOPTIONS="-c client_min_messages=warning" psql "$SHARED_DATABASE_URL/postgres" -qc "DROP DATABASE IF EXISTS $name WITH (FORCE)" >/dev/null 2>&1 || true
  done <"$WORK/shared-dbs"
}

# ---------------------------------------------------------------- Redis and NATS

# Starts a private Redis on $CHAOS_REDIS_PORT (no persistence); sets REDIS_PID.
redis_private_start() {
  need redis-server redis-cli
  require_free_port "$CHAOS_REDIS_PORT" CHAOS_REDIS_PORT
  redis-server --port "$CHAOS_REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$WORK" --logfile "$WORK/redis.log" &
  REDIS_PID=$!
  cleanup_later "stop_ours CONT $REDIS_PID redis-server; stop_ours KILL $REDIS_PID redis-server"
  for _ in $(seq 1 50); do redis-cli -p "$CHAOS_REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
  redis-cli -p "$CHAOS_REDIS_PORT" ping >/dev/null
  say "private Redis on port $CHAOS_REDIS_PORT (pid $REDIS_PID)"
}

# Starts a private NATS with JetStream on $CHAOS_NATS_PORT; sets NATS_PID and NATS_URL.
nats_private_start() {
  local bin
  bin="$(command -v nats-server || echo /usr/sbin/nats-server)"
  [ -x "$bin" ] || { echo "missing tool: nats-server" >&2; exit 2; }
  require_free_port "$CHAOS_NATS_PORT" CHAOS_NATS_PORT
  mkdir -p "$WORK/nats"
  "$bin" -a 127.0.0.1 -p "$CHAOS_NATS_PORT" -js -sd "$WORK/nats" -l "$WORK/nats.log" &
  NATS_PID=$!
  cleanup_later "stop_ours TERM $NATS_PID nats-server"
  for _ in $(seq 1 50); do port_in_use "$CHAOS_NATS_PORT" && break; sleep 0.1; done
  NATS_URL="nats://127.0.0.1:$CHAOS_NATS_PORT"
  say "private NATS JetStream on port $CHAOS_NATS_PORT (pid $NATS_PID)"
}

# ---------------------------------------------------------------- the demo

# demo_start DATABASE_URL [VAR=value...]: starts the demo on $CHAOS_DEMO_PORT with no Redis
# and no NATS unless given, waits for /health; sets DEMO_PID. Log in $WORK/demo-<n>.log.
demo_start() { demo_start_on "$CHAOS_DEMO_PORT" "$@"; }

# demo_start_on PORT DATABASE_URL [VAR=value...]: the same on PORT (one of several instances);
# sets DEMO_PID and DEMO_LOG of the instance started.
DEMO_RUNS=0
demo_start_on() {
  local port="$1" database_url="$2"
  shift 2
  require_free_port "$port" "the demo's port variable"
  DEMO_RUNS=$((DEMO_RUNS + 1))
  DEMO_LOG="$WORK/demo-$DEMO_RUNS.log"
  env -u REDIS_URL -u NATS_URL RUST_LOG="${DEMO_RUST_LOG:-info,sqlx=warn}" \
    DATABASE_URL="$database_url" SERVER__PORT="$port" \
    DEMO_CONFIG="$PWD/demo/config/demo.yaml" "$@" "$DEMO_BIN" >"$DEMO_LOG" 2>&1 &
  DEMO_PID=$!
  cleanup_later "stop_ours TERM $DEMO_PID idempotency-demo"
  local _
  for _ in $(seq 1 150); do
    curl -fs "http://127.0.0.1:$port/health" >/dev/null 2>&1 && return 0
    kill -0 "$DEMO_PID" 2>/dev/null || { tail -n 30 "$DEMO_LOG"; echo "the demo exited" >&2; exit 2; }
    sleep 0.2
  done
  echo "the demo did not answer on http://127.0.0.1:$port" >&2
  exit 2
}

# demo_metric URL NAME FILTER: the sum of the samples of counter NAME on URL/metrics whose line
# contains FILTER (a label, `level="distributed"`).
demo_metric() {
  curl -s "$1/metrics" | awk -v name="$2" -v want="$3" '
    index($0, name "{") == 1 && index($0, want) > 0 { sum += $NF } END { printf "%d\n", sum }'
}

demo_stop() {
  kill -TERM "$DEMO_PID" 2>/dev/null || true
  wait "$DEMO_PID" 2>/dev/null || true
}

# load NAME ARGS...: runs idempotency-load against the demo with --json; the report goes to
# $WORK/NAME.json (and the results directory), its key log to $WORK/NAME.keys.jsonl.
load() {
  local name="$1"
  shift
  "$LOAD_BIN" --url "$DEMO_URL" --json --key-log "$WORK/$name.keys.jsonl" "$@" >"$WORK/$name.json"
  cp "$WORK/$name.json" "$CHAOS_RESULTS/$SCRIPT-$name.json"
}

# summary NAME: one line of the report of a load run.
summary() {
  jq -r '"  \(.requests) requests, \(.ops_per_s | floor) ops/s, p50 \(.latency_ms.p50) ms, p99 \(.latency_ms.p99) ms, p99.9 \(.latency_ms.p999) ms, max \(.latency_ms.max) ms\n  statuses \(.statuses | tojson), problems \(.problems | tojson), replayed \(.replayed), 5xx \(.server_errors) (\(.server_errors_without_problem) not problem+json)"' "$WORK/$1.json"
}

# j NAME FILTER: a jq value of a load report.
j() { jq -r "$2" "$WORK/$1.json"; }

finish() {
  echo
  if [ "$VIOLATIONS" = 0 ]; then
    say "$SCRIPT: every guarantee held (results in $CHAOS_RESULTS/$SCRIPT-*.json)"
  else
    say "$SCRIPT: $VIOLATIONS violation(s) (work files in $WORK)"
    KEEP_WORK=1
    exit 1
  fi
}
