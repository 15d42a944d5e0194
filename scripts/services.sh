#!/usr/bin/env bash
# Makes sure the servers the tests talk to are installed, running and answering:
# PostgreSQL, PgBouncer (transaction pooling, in front of that PostgreSQL), Redis, a six-node
# Redis Cluster, NATS (JetStream), a three-node NATS JetStream cluster, RabbitMQ and MariaDB on
# 127.0.0.1, tansu (a Kafka-protocol broker), and Debian's chromium with chromedriver (the
# admin page's browser test). Source it, then call `ensure_services`; it
# exports DATABASE_URL, PGBOUNCER_URL, REDIS_URL, REDIS_CLUSTER_URL, NATS_URL, NATS_CLUSTER_URL,
# AMQP_URL, MYSQL_URL and KAFKA_URL (keeping any value already set, in which case that server is
# not started here, only waited for), TANSU_BIN and MOTO_SERVER (an S3 server binary).
#
# Run directly, it starts or stops the Redis Cluster, the NATS cluster or a PgBouncer alone:
#
#   scripts/services.sh redis-cluster start [BASE_PORT [DIR]]   # default 7000 /var/tmp/idempotency-redis-cluster
#   scripts/services.sh redis-cluster stop  [BASE_PORT]
#   scripts/services.sh redis-cluster status [BASE_PORT]
#   scripts/services.sh nats-cluster start  [BASE_PORT [DIR]]    # default 4232 /var/tmp/idempotency-nats-cluster
#   scripts/services.sh nats-cluster stop   [BASE_PORT [DIR]]
#   scripts/services.sh nats-cluster status [BASE_PORT]
#   scripts/services.sh pgbouncer start [PORT [SERVER [DIR]]]  # default 6432 127.0.0.1:5432 /var/tmp/idempotency-pgbouncer-PORT
#   scripts/services.sh pgbouncer stop  [PORT [DIR]]
set -euo pipefail

log() { printf '[services] %s\n' "$*" >&2; }

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

apt_install() {
  log "installing $*"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# ensure_tools TOOL...: installs the Debian package of each tool missing from PATH (jq, curl,
# python3, psql: postgresql-client).
ensure_tools() {
  local tool packages=()
  for tool in "$@"; do
    command -v "$tool" >/dev/null 2>&1 && continue
    case "$tool" in
      psql) packages+=(postgresql-client) ;;
      *) packages+=("$tool") ;;
    esac
  done
  if [ ${#packages[@]} -gt 0 ]; then apt_install "${packages[@]}"; fi
}

port_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

wait_for() { # name host port seconds
  local name=$1 host=$2 port=$3 seconds=$4 i
  for ((i = 0; i < seconds * 4; i++)); do
    if port_open "$host" "$port"; then return 0; fi
    sleep 0.25
  done
  log "$name did not answer on $host:$port within ${seconds}s"
  return 1
}

# url_host_port URL DEFAULT-PORT: "HOST|PORT" of a server URL (scheme://[user@]host[:port][/...]);
# HOST is empty for a Unix socket (postgres:///db?host=/run/postgresql).
url_host_port() {
  local rest=${1#*://} default=$2 host port
  rest=${rest##*@}; rest=${rest%%/*}; rest=${rest%%\?*}
  host=${rest%:*}; port=${rest##*:}
  [ "$host" = "$rest" ] && port=$default
  echo "$host|$port"
}

given() { # name url default-port seconds: waits for a server named by a URL set by the caller
  local name=$1 seconds=$4 host port
  IFS='|' read -r host port <<<"$(url_host_port "$2" "$3")"
  [ -z "$host" ] && return 0 # a Unix socket: nothing to wait for on TCP
  wait_for "$name" "$host" "$port" "$seconds"
}

ensure_postgres() {
  if [ -n "${DATABASE_URL:-}" ]; then given PostgreSQL "$DATABASE_URL" 5432 60; return; fi
  export DATABASE_URL="postgres://postgres@127.0.0.1:5432/test"
  if command -v pg_isready >/dev/null && pg_isready -q -h 127.0.0.1 -p 5432; then
    :
  else
    if ! ls /etc/postgresql/*/main >/dev/null 2>&1; then
      apt_install postgresql
      local version
      version=$(ls /etc/postgresql | sort -V | tail -n1)
      # Local development trust, as on the CI machine: tests connect as postgres without a password.
      echo "host all all 127.0.0.1/32 trust" | as_root tee -a "/etc/postgresql/$version/main/pg_hba.conf" >/dev/null
    fi
    local version
    version=$(ls /etc/postgresql | sort -V | tail -n1)
    log "starting PostgreSQL $version"
    as_root pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
    wait_for PostgreSQL 127.0.0.1 5432 60
    for _ in $(seq 1 120); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 0.5; done
  fi
  if ! psql "postgres://postgres@127.0.0.1:5432/postgres" -qAtc "SELECT 1 FROM pg_database WHERE datname = 'test'" | grep -q 1; then
    log "creating database test"
    psql "postgres://postgres@127.0.0.1:5432/postgres" -qc "CREATE DATABASE test"
  fi
}

# ---------------------------------------------------------------- PgBouncer
# PgBouncer (Debian's `pgbouncer`) in `pool_mode = transaction` on PGBOUNCER_PORT (default 6432)
# in front of the PostgreSQL at SERVER (PORT or HOST:PORT, default 127.0.0.1:5432;
# ensure_pgbouncer takes the host and port of DATABASE_URL): every database name is passed
# through (`* =`), users postgres, root and PGBOUNCER_USER (when set) are trusted (as the local
# PostgreSQL trusts 127.0.0.1). Its
# configuration, pid file and log are generated into DIR (default
# /var/tmp/idempotency-pgbouncer-PORT), never into the clone. What it needs for sqlx clients:
#
#   ignore_startup_parameters = extra_float_digits   sqlx sends it at every connection; PgBouncer
#                                                    refuses unknown startup parameters
#
# and on the library's side `persistence.pooler: transaction` (see CONFIGURATION.md): no named
# prepared statements, every statement inside a transaction, no LISTEN through it.
PGBOUNCER_PORT="${PGBOUNCER_PORT:-6432}"

pgbouncer_dir() { echo "${PGBOUNCER_DIR:-/var/tmp/idempotency-pgbouncer-$1}"; }

pgbouncer_bin() {
  command -v pgbouncer 2>/dev/null || { [ -x /usr/sbin/pgbouncer ] && echo /usr/sbin/pgbouncer; }
}

# pgbouncer_config PORT SERVER DIR [POOL_MODE]: writes DIR/pgbouncer.ini; SERVER is PORT (on
# 127.0.0.1) or HOST:PORT.
pgbouncer_config() {
  local port=$1 server=$2 dir=$3 mode=${4:-transaction} server_host=127.0.0.1 server_port=$2
  if [[ "$server" == *:* ]]; then server_host=${server%:*} server_port=${server##*:}; fi
  mkdir -p "$dir"
  # `trust` still wants the user in auth_file: the users the tests and the demo connect as.
  printf '"postgres" ""\n"root" ""\n' >"$dir/userlist.txt"
  if [ -n "${PGBOUNCER_USER:-}" ]; then printf '"%s" ""\n' "$PGBOUNCER_USER" >>"$dir/userlist.txt"; fi
  # PgBouncer 1.21 and later can track named prepared statements in transaction pooling (on
  # by default from 1.24); off here, so that the tests meet the topology that breaks them.
  local prepared="" version="" bin
  bin=$(pgbouncer_bin) || true
  if [ -n "$bin" ]; then
    version=$("$bin" --version 2>/dev/null | awk 'NR==1 {print $2}') || true
  fi
  if [[ "$version" =~ ^[0-9]+(\.[0-9]+)+$ ]] \
    && [ "$(printf '%s\n1.21\n' "$version" | sort -V | head -1)" = 1.21 ]; then
    prepared="max_prepared_statements = 0"
  fi
  cat >"$dir/pgbouncer.ini" <<INI
[databases]
* = host=$server_host port=$server_port

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
auth_type = trust
auth_file = $dir/userlist.txt
admin_users = postgres
pool_mode = $mode
ignore_startup_parameters = extra_float_digits
max_client_conn = 2000
default_pool_size = 20
server_idle_timeout = 10
server_login_retry = 1
server_connect_timeout = 5
pidfile = $dir/pgbouncer.pid
logfile = $dir/pgbouncer.log
$prepared
INI
}

pgbouncer_answers() { # PORT
  psql "postgres://postgres@127.0.0.1:$1/pgbouncer" -qAtc "SHOW VERSION" >/dev/null 2>&1
}

# pgbouncer_start PORT SERVER DIR: SERVER is PORT (on 127.0.0.1) or HOST:PORT; reuses a
# PgBouncer already answering on PORT.
pgbouncer_start() {
  local port=${1:-$PGBOUNCER_PORT} server=${2:-5432} dir=${3:-} bin i
  dir=${dir:-$(pgbouncer_dir "$port")}
  if pgbouncer_answers "$port"; then return 0; fi
  bin=$(pgbouncer_bin) || true
  if [ -z "$bin" ]; then apt_install pgbouncer; bin=$(pgbouncer_bin); fi
  if port_open 127.0.0.1 "$port"; then
    log "port $port is taken by something other than PgBouncer; set PGBOUNCER_PORT"
    return 1
  fi
  pgbouncer_config "$port" "$server" "$dir"
  [[ "$server" == *:* ]] || server="127.0.0.1:$server"
  log "starting PgBouncer (pool_mode = transaction) on $port in front of $server ($dir)"
  # -u: PgBouncer refuses to run as root.
  if [ "$(id -u)" = 0 ]; then
    chown -R postgres "$dir"
    "$bin" -d -u postgres "$dir/pgbouncer.ini"
  else
    "$bin" -d "$dir/pgbouncer.ini"
  fi
  for ((i = 0; i < 80; i++)); do pgbouncer_answers "$port" && return 0; sleep 0.25; done
  log "PgBouncer did not answer on $port within 20s; its log:"
  tail -n 20 "$dir/pgbouncer.log" >&2 || true
  return 1
}

pgbouncer_stop() { # PORT [DIR]
  local port=${1:-$PGBOUNCER_PORT} dir=${2:-} pid
  dir=${dir:-$(pgbouncer_dir "$port")}
  [ -f "$dir/pgbouncer.pid" ] || return 0
  pid=$(cat "$dir/pgbouncer.pid")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  log "PgBouncer on $port stopped"
}

# ensure_pgbouncer: a PgBouncer on PGBOUNCER_PORT in front of the server of DATABASE_URL (its
# host and port; ensure_postgres sets it), PGBOUNCER_URL with that URL's user and database.
ensure_pgbouncer() {
  if [ -n "${PGBOUNCER_URL:-}" ]; then given PgBouncer "$PGBOUNCER_URL" 6432 30; return; fi
  local url=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test} host port rest user=postgres database=test
  IFS='|' read -r host port <<<"$(url_host_port "$url" 5432)"
  if [ -z "$host" ]; then
    log "DATABASE_URL names a Unix socket; PgBouncer connects to 127.0.0.1:$port"
    host=127.0.0.1
  fi
  rest=${url#*://}
  if [[ "$rest" == *@* ]]; then user=${rest%%@*} user=${user%%:*}; fi
  rest=${rest#*/}; rest=${rest%%\?*}
  if [[ "${url#*://}" == */* ]] && [ -n "$rest" ]; then database=$rest; fi
  case "$user" in postgres | root) ;; *) export PGBOUNCER_USER="$user" ;; esac
  pgbouncer_start "$PGBOUNCER_PORT" "$host:$port"
  export PGBOUNCER_URL="postgres://$user@127.0.0.1:$PGBOUNCER_PORT/$database"
}

ensure_redis() {
  if [ -n "${REDIS_URL:-}" ]; then given Redis "$REDIS_URL" 6379 30; return; fi
  export REDIS_URL="redis://127.0.0.1:6379"
  port_open 127.0.0.1 6379 && return 0
  command -v redis-server >/dev/null || apt_install redis-server
  log "starting Redis"
  as_root mkdir -p /var/lib/redis /var/log/redis
  as_root redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
  wait_for Redis 127.0.0.1 6379 30
}

# ---------------------------------------------------------------- Redis Cluster
# Six redis-server processes (three masters, three replicas) on BASE_PORT .. BASE_PORT+5 (their
# cluster bus on port + 10000), no persistence, data and logs under DIR/<port>. A short
# cluster-node-timeout (REDIS_CLUSTER_NODE_TIMEOUT, default 2000 ms) so that a replica takes
# over from a dead master within a few seconds.
REDIS_CLUSTER_BASE_PORT="${REDIS_CLUSTER_BASE_PORT:-7000}"
REDIS_CLUSTER_DIR="${REDIS_CLUSTER_DIR:-/var/tmp/idempotency-redis-cluster}"

redis_cluster_ports() { local base=$1; seq "$base" $((base + 5)); }

# redis_cluster_url BASE_PORT: the URL the library reads (every node, comma-separated).
redis_cluster_url() {
  local base=$1 port nodes=()
  for port in $(redis_cluster_ports "$base"); do nodes+=("127.0.0.1:$port"); done
  local IFS=,
  echo "redis-cluster://${nodes[*]}"
}

redis_cluster_state() { # PORT: ok, fail, or nothing when the node does not answer
  redis-cli -h 127.0.0.1 -p "$1" cluster info 2>/dev/null | tr -d '\r' | sed -n 's/^cluster_state://p'
}

# redis_cluster_ok BASE_PORT: every node answers and says cluster_state:ok, and the cluster has
# three masters with a replica each, in sync, and no failed node.
redis_cluster_ok() {
  local base=$1 port nodes
  for port in $(redis_cluster_ports "$base"); do
    [ "$(redis_cluster_state "$port")" = ok ] || return 1
  done
  nodes=$(redis-cli -h 127.0.0.1 -p "$base" cluster nodes 2>/dev/null) || return 1
  [ "$(awk '$3 ~ /master/' <<<"$nodes" | wc -l)" = 3 ] && [ "$(awk '$3 ~ /slave/' <<<"$nodes" | wc -l)" = 3 ] &&
    [ -z "$(awk '$3 ~ /fail/' <<<"$nodes")" ] || return 1
  # A replica that never synced with its master cannot take over from it.
  for port in $(awk '$3 ~ /slave/ { split($2, a, "[:@]"); print a[2] }' <<<"$nodes"); do
    redis-cli -h 127.0.0.1 -p "$port" info replication 2>/dev/null | grep -q '^master_link_status:up' || return 1
  done
}

redis_cluster_stop() { # BASE_PORT
  local base=${1:-$REDIS_CLUSTER_BASE_PORT} port
  for port in $(redis_cluster_ports "$base"); do
    if redis-cli -h 127.0.0.1 -p "$port" ping >/dev/null 2>&1; then
      redis-cli -h 127.0.0.1 -p "$port" shutdown nosave >/dev/null 2>&1 || true
    fi
  done
  for port in $(redis_cluster_ports "$base"); do
    for _ in $(seq 1 50); do port_open 127.0.0.1 "$port" || break; sleep 0.1; done
  done
  log "Redis Cluster on $base-$((base + 5)) stopped"
}

# redis_cluster_node_start PORT DIR: one node, daemonized, its files in DIR/PORT (pid in
# redis.pid). Started again on the same DIR, it rejoins its cluster (nodes.conf).
redis_cluster_node_start() {
  local port=$1 dir=$2
  mkdir -p "$dir/$port"
  redis-server --daemonize yes --bind 127.0.0.1 --port "$port" \
    --cluster-enabled yes --cluster-config-file "$dir/$port/nodes.conf" \
    --cluster-node-timeout "${REDIS_CLUSTER_NODE_TIMEOUT:-2000}" \
    --save "" --appendonly no --dir "$dir/$port" --logfile "$dir/$port/redis.log" \
    --pidfile "$dir/$port/redis.pid"
}

# redis_cluster_start BASE_PORT DIR: reuses a cluster that already answers with
# cluster_state:ok; otherwise stops whatever of ours is left, wipes DIR and creates a new one.
redis_cluster_start() {
  local base=${1:-$REDIS_CLUSTER_BASE_PORT} dir=${2:-$REDIS_CLUSTER_DIR} port hosts=()
  command -v redis-server >/dev/null || apt_install redis-server
  command -v redis-cli >/dev/null || apt_install redis-tools
  if redis_cluster_ok "$base"; then
    log "Redis Cluster on $base-$((base + 5)) already up (cluster_state:ok)"
    return 0
  fi
  redis_cluster_stop "$base" 2>/dev/null
  for port in $(redis_cluster_ports "$base"); do
    if port_open 127.0.0.1 "$port" || port_open 127.0.0.1 $((port + 10000)); then
      log "port $port or $((port + 10000)) is taken by something else; set REDIS_CLUSTER_BASE_PORT"
      return 1
    fi
  done
  log "starting a Redis Cluster on $base-$((base + 5)) ($dir)"
  rm -rf "$dir"
  for port in $(redis_cluster_ports "$base"); do
    redis_cluster_node_start "$port" "$dir"
    hosts+=("127.0.0.1:$port")
  done
  for port in $(redis_cluster_ports "$base"); do
    for _ in $(seq 1 100); do redis-cli -h 127.0.0.1 -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
  done
  redis-cli --cluster create "${hosts[@]}" --cluster-replicas 1 --cluster-yes >"$dir/create.log" 2>&1 || {
    cat "$dir/create.log" >&2
    return 1
  }
  local i
  for ((i = 0; i < 240; i++)); do
    redis_cluster_ok "$base" && break
    sleep 0.25
  done
  if ! redis_cluster_ok "$base"; then
    log "the Redis Cluster on $base-$((base + 5)) did not reach cluster_state:ok within 60s"
    return 1
  fi
  log "Redis Cluster on $base-$((base + 5)) is up (cluster_state:ok)"
}

ensure_redis_cluster() {
  if [ -n "${REDIS_CLUSTER_URL:-}" ]; then
    local first=${REDIS_CLUSTER_URL#*://}
    first=${first%%,*}
    given "Redis Cluster" "redis://$first" 7000 30
    return
  fi
  redis_cluster_start "$REDIS_CLUSTER_BASE_PORT" "$REDIS_CLUSTER_DIR"
  REDIS_CLUSTER_URL="$(redis_cluster_url "$REDIS_CLUSTER_BASE_PORT")"
  export REDIS_CLUSTER_URL
}

ensure_nats() {
  if [ -n "${NATS_URL:-}" ]; then given NATS "$NATS_URL" 4222 30; return; fi
  export NATS_URL="nats://127.0.0.1:4222"
  port_open 127.0.0.1 4222 && return 0
  command -v nats-server >/dev/null || [ -x /usr/sbin/nats-server ] || apt_install nats-server
  local bin
  bin=$(command -v nats-server || echo /usr/sbin/nats-server)
  log "starting NATS with JetStream"
  as_root mkdir -p /var/lib/nats-server
  as_root start-stop-daemon --start --oknodo --background --exec "$bin" -- \
    -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log
  wait_for NATS 127.0.0.1 4222 30
}

# ---------------------------------------------------------------- NATS JetStream cluster
# Three nats-server nodes (n0, n1, n2) clustered with JetStream: clients on BASE_PORT ..
# BASE_PORT+2, cluster routes on port + 2000, HTTP monitoring on port + 4000; each node's
# JetStream store, log and pid file under DIR/n<i>. Started again on the same DIR, a node
# rejoins its cluster with its store (the chaos script's restart after a SIGKILL).
NATS_CLUSTER_BASE_PORT="${NATS_CLUSTER_BASE_PORT:-4232}"
NATS_CLUSTER_DIR="${NATS_CLUSTER_DIR:-/var/tmp/idempotency-nats-cluster}"
NATS_CLUSTER_NAME="${NATS_CLUSTER_NAME:-idempotency}"

nats_server_bin() { command -v nats-server || echo /usr/sbin/nats-server; }

# nats_cluster_url BASE_PORT: the URL list clients read (every node, comma-separated).
nats_cluster_url() {
  local base=$1 i nodes=()
  for i in 0 1 2; do nodes+=("nats://127.0.0.1:$((base + i))"); done
  local IFS=,
  echo "${nodes[*]}"
}

# nats_cluster_jsz BASE_PORT I [QUERY]: node I's /jsz (JSON), nothing when it does not answer.
nats_cluster_jsz() { curl -fs -m 1 "http://127.0.0.1:$(($1 + $2 + 4000))/jsz${3:-}" 2>/dev/null; }

# nats_cluster_ok BASE_PORT: every node answers and names the same JetStream meta leader, one
# of the three, in a cluster of three.
nats_cluster_ok() {
  local base=$1 i leader="" seen
  for i in 0 1 2; do
    seen=$(nats_cluster_jsz "$base" "$i" | jq -r 'select(.meta_cluster.cluster_size == 3) | .meta_cluster.leader // empty' 2>/dev/null)
    [ -n "$seen" ] || return 1
    [ -z "$leader" ] || [ "$leader" = "$seen" ] || return 1
    leader=$seen
  done
  [[ "$leader" =~ ^n[012]$ ]]
}

# nats_cluster_node_pid DIR I: the pid of node I if it is still a nats-server of ours.
nats_cluster_node_pid() {
  local pid
  pid=$(cat "$1/n$2/nats.pid" 2>/dev/null) || return 1
  [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "nats-server.*$1/n$2" || return 1
  echo "$pid"
}

# nats_cluster_node_start BASE_PORT DIR I: node I in the background (its own session, so that
# it outlives the shell that started it), pid in DIR/n<I>/nats.pid.
nats_cluster_node_start() {
  local base=$1 dir=$2 i=$3 j routes=()
  for j in 0 1 2; do [ "$j" = "$i" ] || routes+=("nats://127.0.0.1:$((base + j + 2000))"); done
  mkdir -p "$dir/n$i"
  local IFS=,
  setsid "$(nats_server_bin)" -n "n$i" -a 127.0.0.1 -p $((base + i)) -m $((base + i + 4000)) \
    -js -sd "$dir/n$i" --cluster_name "$NATS_CLUSTER_NAME" \
    --cluster "nats://127.0.0.1:$((base + i + 2000))" --routes "${routes[*]}" \
    -l "$dir/n$i/nats.log" -P "$dir/n$i/nats.pid" </dev/null >/dev/null 2>&1 &
  disown # no job report when a chaos script kills it
}

# nats_cluster_stop BASE_PORT DIR: stops the nodes this script started there (by their pid
# files), and waits until their ports are closed.
nats_cluster_stop() {
  local base=${1:-$NATS_CLUSTER_BASE_PORT} dir=${2:-$NATS_CLUSTER_DIR} i pid
  for i in 0 1 2; do
    pid=$(nats_cluster_node_pid "$dir" "$i") && kill -TERM "$pid" 2>/dev/null
  done
  for i in 0 1 2; do
    for _ in $(seq 1 100); do port_open 127.0.0.1 $((base + i)) || break; sleep 0.1; done
  done
  log "NATS cluster on $base-$((base + 2)) stopped"
}

# nats_cluster_wait BASE_PORT SECONDS: until nats_cluster_ok.
nats_cluster_wait() {
  local i
  for ((i = 0; i < $2 * 10; i++)); do
    nats_cluster_ok "$1" && return 0
    sleep 0.1
  done
  return 1
}

# nats_cluster_start BASE_PORT DIR: reuses a cluster that already answers with a meta leader;
# otherwise stops whatever of ours is left, wipes DIR, starts three nodes and waits for their
# meta leader.
nats_cluster_start() {
  local base=${1:-$NATS_CLUSTER_BASE_PORT} dir=${2:-$NATS_CLUSTER_DIR} i port
  command -v nats-server >/dev/null || [ -x /usr/sbin/nats-server ] || apt_install nats-server
  ensure_tools jq curl
  if nats_cluster_ok "$base"; then
    log "NATS cluster on $base-$((base + 2)) already up (meta leader elected)"
    return 0
  fi
  nats_cluster_stop "$base" "$dir" 2>/dev/null
  for i in 0 1 2; do
    for port in $((base + i)) $((base + i + 2000)) $((base + i + 4000)); do
      if port_open 127.0.0.1 "$port"; then
        log "port $port is taken by something else; set NATS_CLUSTER_BASE_PORT"
        return 1
      fi
    done
  done
  log "starting a NATS JetStream cluster on $base-$((base + 2)) ($dir)"
  rm -rf "$dir"
  for i in 0 1 2; do nats_cluster_node_start "$base" "$dir" "$i"; done
  if ! nats_cluster_wait "$base" 60; then
    log "the NATS cluster on $base-$((base + 2)) elected no meta leader within 60s (logs in $dir/n*/nats.log)"
    return 1
  fi
  log "NATS cluster on $base-$((base + 2)) is up (meta leader $(nats_cluster_jsz "$base" 0 | jq -r .meta_cluster.leader))"
}

ensure_nats_cluster() {
  if [ -n "${NATS_CLUSTER_URL:-}" ]; then
    local first=${NATS_CLUSTER_URL%%,*}
    given "NATS cluster" "$first" 4222 30
    return
  fi
  nats_cluster_start "$NATS_CLUSTER_BASE_PORT" "$NATS_CLUSTER_DIR"
  NATS_CLUSTER_URL="$(nats_cluster_url "$NATS_CLUSTER_BASE_PORT")"
  export NATS_CLUSTER_URL
}

ensure_rabbitmq() {
  if [ -n "${AMQP_URL:-}" ]; then given RabbitMQ "$AMQP_URL" 5672 120; return; fi
  export AMQP_URL="amqp://guest:guest@127.0.0.1:5672/%2f"
  port_open 127.0.0.1 5672 && return 0
  command -v rabbitmq-server >/dev/null || [ -x /usr/sbin/rabbitmq-server ] || apt_install rabbitmq-server
  log "starting RabbitMQ"
  as_root rabbitmq-server -detached || true
  wait_for RabbitMQ 127.0.0.1 5672 120
}

# tansu 0.6.0, a Kafka-protocol broker written in Rust: no Apache Kafka or Redpanda package is
# reachable here. Built once with cargo into a directory outside the clone and reused (about
# 15 min on 2 cores, then a 62 MB binary); started on 127.0.0.1:9092 with in-memory storage.
TOOLS_DIR="${IDEMPOTENCY_TOOLS_DIR:-/var/tmp/tools}"
TANSU_VERSION=0.6.0

tansu_bin() {
  if [ -n "${TANSU_BIN:-}" ]; then echo "$TANSU_BIN"; return; fi
  local bin="$TOOLS_DIR/tansu/bin/tansu"
  if ! [ -x "$bin" ] || ! "$bin" --version 2>/dev/null | grep -q " $TANSU_VERSION"; then
    log "building tansu $TANSU_VERSION into $TOOLS_DIR/tansu (once; about 15 minutes)"
    mkdir -p "$TOOLS_DIR"
    CARGO_TARGET_DIR="$TOOLS_DIR/tansu-target" cargo install tansu --version "$TANSU_VERSION" \
      --locked --features dynostore,postgres --root "$TOOLS_DIR/tansu" >&2
    rm -rf "$TOOLS_DIR/tansu-target"
  fi
  echo "$bin"
}

# moto, an S3 server (Python, from PyPI), for tests/kafka_restart.rs: it gives a tansu of its
# own S3 storage there, which outlives the broker the test kills with SIGKILL (tansu's memory
# storage dies with it; its PostgreSQL storage needs a schema tansu 0.6.0 ships only in its
# source repository, not in the crate). Installed once into a virtualenv outside the clone
# (under a minute).
MOTO_VERSION=5.2.5

moto_server_bin() {
  if [ -n "${MOTO_SERVER:-}" ]; then echo "$MOTO_SERVER"; return; fi
  local venv="$TOOLS_DIR/moto-venv"
  if ! "$venv/bin/python" -c "import sys, moto; sys.exit(moto.__version__ != '$MOTO_VERSION')" 2>/dev/null; then
    log "installing moto $MOTO_VERSION into $venv (once)"
    mkdir -p "$TOOLS_DIR"
    python3 -m venv "$venv" >&2
    "$venv/bin/pip" install -q "moto[server]==$MOTO_VERSION" >&2
  fi
  echo "$venv/bin/moto_server"
}

ensure_kafka() {
  TANSU_BIN="$(tansu_bin)"
  export TANSU_BIN
  MOTO_SERVER="$(moto_server_bin)"
  export MOTO_SERVER
  if [ -n "${KAFKA_URL:-}" ]; then given Kafka "kafka://$KAFKA_URL" 9092 30; return; fi
  export KAFKA_URL="127.0.0.1:9092"
  port_open 127.0.0.1 9092 && return 0
  log "starting tansu (Kafka protocol) on 127.0.0.1:9092"
  nohup "$TANSU_BIN" broker --listener-url tcp://127.0.0.1:9092 \
    --advertised-listener-url tcp://127.0.0.1:9092 --storage-engine memory://tansu/ \
    >"$TOOLS_DIR/tansu.log" 2>&1 </dev/null &
  wait_for Kafka 127.0.0.1 9092 30
}

mysql_answers() { mysql -uroot -h127.0.0.1 -P3306 -e "SELECT 1" >/dev/null 2>&1; }

ensure_mysql() {
  if [ -n "${MYSQL_URL:-}" ]; then given MySQL "$MYSQL_URL" 3306 60; return; fi
  export MYSQL_URL="mysql://root@127.0.0.1:3306/test"
  if ! port_open 127.0.0.1 3306; then
    [ -x /usr/sbin/mariadbd ] || apt_install mariadb-server
    log "starting MariaDB"
    as_root mkdir -p /run/mysqld
    as_root chown mysql:mysql /run/mysqld 2>/dev/null || true
    as_root start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd -- --user=mysql
    wait_for MariaDB 127.0.0.1 3306 60
  fi
  command -v mysql >/dev/null || apt_install mariadb-client
  if ! mysql_answers; then
    # A fresh Debian install: root logs in through the Unix socket only. Local development
    # access, as on the CI machine: root from 127.0.0.1 without a password.
    log "allowing root from 127.0.0.1 without a password"
    as_root mysql -uroot -e "CREATE USER IF NOT EXISTS 'root'@'127.0.0.1' IDENTIFIED BY ''; \
      GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;"
  fi
  mysql -uroot -h127.0.0.1 -P3306 -e "CREATE DATABASE IF NOT EXISTS test"
}

# Debian's chromium and its chromedriver: the admin page's browser test
# (crates/idempotency/tests/admin_browser.rs) drives them headless.
ensure_chromium() {
  if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
    apt_install chromium chromium-driver
  fi
}

ensure_services() {
  ensure_chromium
  ensure_postgres
  ensure_pgbouncer
  ensure_redis
  ensure_redis_cluster
  ensure_nats
  ensure_nats_cluster
  ensure_rabbitmq
  ensure_mysql
  ensure_kafka
  log "DATABASE_URL=$DATABASE_URL PGBOUNCER_URL=$PGBOUNCER_URL REDIS_URL=$REDIS_URL REDIS_CLUSTER_URL=$REDIS_CLUSTER_URL NATS_URL=$NATS_URL NATS_CLUSTER_URL=$NATS_CLUSTER_URL AMQP_URL=$AMQP_URL MYSQL_URL=$MYSQL_URL KAFKA_URL=$KAFKA_URL"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  case "${1:-} ${2:-}" in
    "redis-cluster start") redis_cluster_start "${3:-$REDIS_CLUSTER_BASE_PORT}" "${4:-$REDIS_CLUSTER_DIR}"
      echo "REDIS_CLUSTER_URL=$(redis_cluster_url "${3:-$REDIS_CLUSTER_BASE_PORT}")" ;;
    "redis-cluster stop") redis_cluster_stop "${3:-$REDIS_CLUSTER_BASE_PORT}" ;;
    "redis-cluster status")
      if redis_cluster_ok "${3:-$REDIS_CLUSTER_BASE_PORT}"; then echo ok; else echo "not ok"; exit 1; fi ;;
    "nats-cluster start") nats_cluster_start "${3:-$NATS_CLUSTER_BASE_PORT}" "${4:-$NATS_CLUSTER_DIR}"
      echo "NATS_CLUSTER_URL=$(nats_cluster_url "${3:-$NATS_CLUSTER_BASE_PORT}")" ;;
    "nats-cluster stop") nats_cluster_stop "${3:-$NATS_CLUSTER_BASE_PORT}" "${4:-$NATS_CLUSTER_DIR}" ;;
    "nats-cluster status")
      if nats_cluster_ok "${3:-$NATS_CLUSTER_BASE_PORT}"; then echo ok; else echo "not ok"; exit 1; fi ;;
    "pgbouncer start") pgbouncer_start "${3:-$PGBOUNCER_PORT}" "${4:-127.0.0.1:5432}" "${5:-}"
      echo "PGBOUNCER_URL=postgres://postgres@127.0.0.1:${3:-$PGBOUNCER_PORT}/test" ;;
    "pgbouncer stop") pgbouncer_stop "${3:-$PGBOUNCER_PORT}" "${4:-}" ;;
    *) echo "usage: $0 redis-cluster|nats-cluster start|stop|status [BASE_PORT [DIR]] | pgbouncer start|stop [PORT ...]" >&2; exit 2 ;;
  esac
fi
