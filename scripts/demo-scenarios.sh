#!/usr/bin/env bash
# Starts the demo and runs demo/scenarios.sh against it, then stops it.
#
#   scripts/demo-scenarios.sh postgres   # PostgreSQL + Redis + NATS (DATABASE_URL, REDIS_URL, NATS_URL)
#   scripts/demo-scenarios.sh postgres-cluster  # the same with the Redis Cluster as L2 (REDIS_CLUSTER_URL)
#   scripts/demo-scenarios.sh postgres-pgbouncer  # the same through PgBouncer in pool_mode = transaction
#                                        # (PGBOUNCER_URL; persistence.pooler: transaction, the relay polls)
#   scripts/demo-scenarios.sh mysql      # MariaDB / MySQL (MYSQL_URL) + Redis + NATS
#   scripts/demo-scenarios.sh sqlite     # nothing installed: SQLite file, moka, logging publisher
#
# The PostgreSQL and MySQL runs use a fresh database (`idempotency_demo_scenarios`); the SQLite
# run a fresh temporary working directory. The demo is built first (debug profile).
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-postgres}"
port="${DEMO_PORT:-18080}"

cargo build -q -p idempotency-demo
binary="$(cd "${CARGO_TARGET_DIR:-target}" && pwd)/debug/idempotency-demo"
root="$PWD"
log="$(mktemp)"
workdir="$(mktemp -d)"
cleanup() {
  [ -n "${demo_pid:-}" ] && kill "$demo_pid" 2>/dev/null && wait "$demo_pid" 2>/dev/null || true
  rm -rf "$workdir"
}
trap cleanup EXIT

case "$mode" in
  postgres | postgres-cluster | postgres-pgbouncer)
    source scripts/services.sh
    ensure_services
    [ "$mode" = postgres-cluster ] && REDIS_URL="$REDIS_CLUSTER_URL"
    admin="${DATABASE_URL%/*}/postgres"
    psql "$admin" -qc "DROP DATABASE IF EXISTS idempotency_demo_scenarios WITH (FORCE)"
    psql "$admin" -qc "CREATE DATABASE idempotency_demo_scenarios"
    url="${DATABASE_URL%/*}/idempotency_demo_scenarios"
    extra=()
    if [ "$mode" = postgres-pgbouncer ]; then
      # PgBouncer passes every database name through to the PostgreSQL behind it.
      url="${PGBOUNCER_URL%/*}/idempotency_demo_scenarios"
      extra=(IDEMPOTENCY__PERSISTENCE__POOLER=transaction OUTBOX__RELAY__WAKE_UP=poll)
    fi
    env DATABASE_URL="$url" SERVER__PORT="$port" "${extra[@]}" \
      REDIS_URL="$REDIS_URL" DEMO_CONFIG="$PWD/demo/config/demo.yaml" "$binary" >"$log" 2>&1 &
    ;;
  mysql)
    source scripts/services.sh
    ensure_services
    mysql_base="${MYSQL_URL%/*}"
    rest="${mysql_base#*://}"; creds="${rest%@*}"; hostport="${rest##*@}"
    [ "$creds" = "$rest" ] && creds=root
    user="${creds%%:*}"; password=""; [ "$user" != "$creds" ] && password="${creds#*:}"
    host="${hostport%:*}"; mport="${hostport##*:}"; [ "$mport" = "$hostport" ] && mport=3306
    mysql -u"$user" ${password:+-p"$password"} -h"$host" -P"$mport" \
      -e "DROP DATABASE IF EXISTS idempotency_demo_scenarios; CREATE DATABASE idempotency_demo_scenarios"
    env -u DATABASE_URL MYSQL_URL="$mysql_base/idempotency_demo_scenarios" SERVER__PORT="$port" \
      DEMO_CONFIG="$PWD/demo/config/demo.yaml" "$binary" >"$log" 2>&1 &
    ;;
  sqlite)
    # No server at all: run from an empty directory without any *_URL variable.
    (cd "$workdir" && exec env -u DATABASE_URL -u MYSQL_URL -u REDIS_URL -u NATS_URL SERVER__PORT="$port" \
      DEMO_CONFIG="$root/demo/config/demo.yaml" "$binary" >"$log" 2>&1) &
    ;;
  *) echo "usage: $0 postgres|postgres-cluster|postgres-pgbouncer|mysql|sqlite" >&2; exit 2 ;;
esac
demo_pid=$!

for _ in $(seq 1 100); do
  curl -fs "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
  if ! kill -0 "$demo_pid" 2>/dev/null; then cat "$log"; echo "the demo exited" >&2; exit 1; fi
  sleep 0.2
done
grep -E "data:|cache:|publisher:" "$log" | sed 's/\x1b\[[0-9;]*m//g' || true
if ! BASE_URL="http://127.0.0.1:$port" bash demo/scenarios.sh; then
  echo "--- demo log" >&2; tail -n 50 "$log" >&2; exit 1
fi
# (an `if`: as the last command, a false `[ ... ] &&` would be the exit status of the script)
if [ "$mode" = sqlite ]; then ls -la "$workdir/data"; fi
