#!/usr/bin/env bash
# Runs every benchmark against the real servers and rewrites PERFORMANCE.md with the figures:
#
#   scripts/bench.sh                  # the full grid (about 20 minutes on 2 cores)
#   QUICK=1 scripts/bench.sh          # shorter runs, for a smoke test of the script itself
#   ASSEMBLE_ONLY=1 scripts/bench.sh  # rewrite PERFORMANCE.md from the last run's raw outputs
#   DURATION=10s ROUNDS=2 RETENTION_EVENTS=1000000 scripts/bench.sh   # a shorter full grid
#   HTTP_SECONDS=8s HTTP_ROUNDS=3 scripts/bench.sh   # the HTTP bench's rounds (the defaults)
#   ONLY=http scripts/bench.sh        # the HTTP bench alone (tracing on and off included); the
#                                     # other sections of PERFORMANCE.md are then left out
#   PEERS=0 scripts/bench.sh          # without the peer libraries (installed by scripts/peers.sh
#                                     # into $PEERS_DIR, default /var/tmp/idempotency-peers)
#
# Raw outputs are kept in target/bench/. With strace installed (Debian's `strace`), the HTTP
# bench also counts the demo's system calls per request.
#
# Figures that are compared are measured in the same run (ratios), because the machine is
# shared and noisy; absolute numbers move from run to run, ratios much less.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/services.sh
ensure_services

quick="${QUICK:-}"
duration=20s; rounds=5; criterion=(--warm-up-time 2 --measurement-time 8); http_seconds=8s
http_rounds=3; retention_events=5000000
if [ -n "$quick" ]; then
  duration=3s; rounds=2; criterion=(--warm-up-time 1 --measurement-time 2); http_seconds=4s
  http_rounds=2; retention_events=200000
fi
duration="${DURATION:-$duration}"; rounds="${ROUNDS:-$rounds}"; http_seconds="${HTTP_SECONDS:-$http_seconds}"
http_rounds="${HTTP_ROUNDS:-$http_rounds}"
retention_events="${RETENTION_EVENTS:-$retention_events}"
out="$(cd "${CARGO_TARGET_DIR:-target}" 2>/dev/null && pwd || echo "$PWD/target")/bench"
mkdir -p "$out"
trap 'for p in "${demo_pid:-}" "${otel_pid:-}" "${sink_pid:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null; done; true' EXIT
only="${ONLY:-}"
if [ -z "${ASSEMBLE_ONLY:-}" ]; then
# A run records its parameters beside its raw outputs, so that ASSEMBLE_ONLY describes the
# commands that produced them, whatever that shell's environment says.
printf 'duration=%q rounds=%q http_seconds=%q http_rounds=%q\n' \
  "$duration" "$rounds" "$http_seconds" "$http_rounds" > "$out/params"

echo "== building (release)"
if [ "$only" = http ]; then
  cargo build --release -q -p idempotency-load -p idempotency-demo
else
  cargo build --release -q -p idempotency-bench -p idempotency-load -p idempotency-demo
  cargo build --release -q -p idempotency-sqlite --example backlog_latency
fi
target="$(cd "${CARGO_TARGET_DIR:-target}" && pwd)/release"

if [ "$only" != http ]; then

echo "== fingerprint (criterion)"
cargo bench -q -p idempotency-core --bench fingerprint -- "${criterion[@]}" 2>/dev/null \
  | grep -E "^fingerprint/|time:|thrpt:" > "$out/fingerprint.txt" || true

echo "== one request's meters through the Prometheus recorder (criterion)"
cargo bench -q -p idempotency-metrics --features prometheus --bench meters -- "${criterion[@]}" 2>/dev/null \
  | grep -E "^(replay|first_execution)/|time:" > "$out/meters.txt" || true

echo "== SQLite: request latency with an ordered outbox backlog"
"$target/examples/backlog_latency" 100000 400 > "$out/sqlite-backlog.txt" 2>/dev/null || true

echo "== replay tiers, one client (criterion)"
cargo bench -q -p idempotency-cache-redis --bench replay_tiers -- "${criterion[@]}" 2>/dev/null \
  | grep -E "^replay/|time:" > "$out/replay.txt" || true

# The peer libraries' first executions join the load bench's (installed outside the repository;
# without node or python, or offline, the bench runs without them and says so in PERFORMANCE.md).
peers=()
if [ "${PEERS:-1}" != 0 ]; then
  echo "== peer libraries (scripts/peers.sh)"
  export PEERS_DIR="${PEERS_DIR:-/var/tmp/idempotency-peers}"
  if scripts/peers.sh; then peers=(--peers "$PEERS_DIR"); else echo "   not installed: the peer rows are left out"; fi
fi

echo "== load bench ($duration per scenario, $rounds rounds)"
"$target/idempotency-bench" --clients 4 --duration "$duration" --rounds "$rounds" "${peers[@]}" > "$out/load.txt"

echo "== middleware: IdempotencyLayer against a handler calling execute ($duration per scenario, $rounds rounds)"
"$target/idempotency-bench" --only-layer --clients 4 --duration "$duration" --rounds "$rounds" > "$out/layer.txt"

echo "== MySQL / MariaDB: the load bench's grid on MYSQL_URL ($duration per scenario, $rounds rounds)"
"$target/idempotency-bench" --backend mysql --clients 4 --duration "$duration" --rounds "$rounds" > "$out/mysql.txt"

echo "== outbox retention: $retention_events published events, batched DELETE against partition drop"
"$target/idempotency-bench" --only-retention --events "$retention_events" > "$out/retention.txt"

echo "== outbox relay (criterion-style bench of idempotency-outbox)"
cargo bench -q -p idempotency-outbox --all-features --bench relay 2>/dev/null > "$out/relay.txt" || true

fi # ONLY=http

echo "== HTTP: the demo (release) on PostgreSQL"
admin="${DATABASE_URL%/*}/postgres"
psql "$admin" -qc "DROP DATABASE IF EXISTS idempotency_bench_http WITH (FORCE)"
psql "$admin" -qc "CREATE DATABASE idempotency_bench_http"
port=18090
env DATABASE_URL="${DATABASE_URL%/*}/idempotency_bench_http" REDIS_URL="$REDIS_URL" \
  SERVER__PORT="$port" DEMO_CONFIG="$PWD/demo/config/demo.yaml" RUST_LOG=warn \
  "$target/idempotency-demo" > "$out/demo.log" 2>&1 &
demo_pid=$!
for _ in $(seq 1 100); do curl -fs "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break; sleep 0.2; done
# Tracing on: a second demo, the same binary and database, with the OpenTelemetry layer (every
# `info` span recorded: the request's, `idempotency.execute`, store statements, cache calls)
# and the SDK's batch processor exporting OTLP/HTTP to a local receiver (scripts/otlp-sink.py,
# which counts the spans it gets). Its queue is large enough that no span is dropped and its
# delay short, so the export runs during the rounds. Its scenarios join the same rounds.
sink_port=14318; otel_port=18091
python3 scripts/otlp-sink.py "$sink_port" "$out/otlp-sink.counts" & sink_pid=$!
env DATABASE_URL="${DATABASE_URL%/*}/idempotency_bench_http" REDIS_URL="$REDIS_URL" \
  SERVER__PORT="$otel_port" DEMO_CONFIG="$PWD/demo/config/demo.yaml" RUST_LOG=warn \
  OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:$sink_port" OTEL_BSP_SCHEDULE_DELAY=200 \
  OTEL_BSP_MAX_QUEUE_SIZE=262144 OTEL_BSP_MAX_EXPORT_BATCH_SIZE=512 \
  "$target/idempotency-demo" > "$out/demo-otel.log" 2>&1 &
otel_pid=$!
for _ in $(seq 1 100); do curl -fs "http://127.0.0.1:$otel_port/health" >/dev/null 2>&1 && break; sleep 0.2; done
rss() { awk '/VmRSS/ {print $2}' "/proc/$demo_pid/status"; }
peak=0
rm -f "$out/rss"
sample() { while kill -0 "$demo_pid" 2>/dev/null; do r=$(rss); [ "${r:-0}" -gt "$peak" ] && peak=$r && echo "$peak" > "$out/rss"; sleep 0.2; done; }
sample & sampler=$!
client() { "$target/idempotency-load" --url "http://127.0.0.1:${client_port:-$port}" --clients 16 --json "$@"; }
load() { client --duration "$http_seconds" "$@"; }
# The load generator's arguments for each payment scenario, into `args`.
# `client_port`: the demo it goes to (the `-otel` scenarios: the one with tracing on).
scenario_args() {
  client_port=$port
  case "$1" in
    unprotected) args=(--endpoint unprotected) ;;
    first) args=(--fresh) ;;
    first-layer) args=(--endpoint v2-payments --fresh) ;;
    first-optimistic) args=(--endpoint v2-payments-optimistic --fresh) ;;
    replay) args=(--replay "bench-replay-key") ;;
    validate) args=(--endpoint validate --replay "bench-validate-key") ;;
    first-otel) args=(--fresh); client_port=$otel_port ;;
    replay-otel) args=(--replay "bench-replay-key-otel"); client_port=$otel_port ;;
  esac
}
# CPU time (clock ticks, utime + stime) of every PostgreSQL and Redis process and of the demo, one
# "name pid ticks" line each: a snapshot before and after a scenario gives its CPU per process,
# per pid, so a backend that starts or ends during the run is counted for its own share only. The
# load generator's own CPU comes from bash's `times` (its second line: the user and system time
# of the shell's waited-for children), written by the caller's shell itself, not by a subshell,
# whose children's times would start from zero.
cpu_snapshot() {
  local pid comm stat
  for pid in $(pgrep -x postgres) $(pgrep -x redis-server) "$demo_pid" "$otel_pid" "$sink_pid"; do
    stat="$(cat "/proc/$pid/stat" 2>/dev/null)" || continue
    comm="$(cat "/proc/$pid/comm" 2>/dev/null)" || continue
    # Both demos count as the demo (the idle one spends next to nothing); the receiver apart.
    [ "$pid" = "$demo_pid" ] || [ "$pid" = "$otel_pid" ] && comm=demo
    [ "$pid" = "$sink_pid" ] && comm=otlp-sink
    # fields after the ")" that ends the command name: utime is the 12th, stime the 13th
    awk -v name="$comm" -v pid="$pid" '{ sub(/^.*\) /, ""); print name, pid, $12 + $13 }' <<<"$stat"
  done
}
# One scenario: its JSON report, and the CPU snapshots before and after it.
measure() {
  local name="$1"; shift
  # `times` right around the load generator: the snapshots' own helpers (pgrep, cat, awk) are
  # children of this shell too.
  cpu_snapshot > "$out/$name.cpu-before"; times > "$out/$name.times-before"
  load "$@" > "$out/$name.json"
  times > "$out/$name.times-after"; cpu_snapshot > "$out/$name.cpu-after"
}
# Interleaved rounds, like the load bench: each round runs every scenario back to back, so both
# sides of a ratio share the same background load and the same table sizes. The layer's two
# modes swap places every other round, so that neither always runs on the other's leftovers.
rm -f "$out"/http-*.json "$out"/http-*.cpu-* "$out"/http-*.times-* "$out"/syscalls-* "$out/otlp-sink.counts"
for round in $(seq 1 "$http_rounds"); do
  echo "   round $round of $http_rounds ($http_seconds per scenario)"
  layer_modes="first-layer first-optimistic"
  [ $((round % 2)) = 0 ] && layer_modes="first-optimistic first-layer"
  for name in unprotected first $layer_modes replay validate first-otel replay-otel; do
    scenario_args "$name"
    measure "http-$name-$round" "${args[@]}"
  done
done
scenario_args unprotected
load --endpoint health > "$out/http-health.json"
# System calls per request of each scenario, counted by strace on the demo over 2,000 requests
# after the timed rounds (tracing slows the demo, so it is never on while the rounds are timed).
# Unlike the timings, these counts hardly move with the machine's load: a statement more per
# request shows up here as one more `sendto`.
# Without strace, or where it may not attach, the section is left out.
if command -v strace >/dev/null; then
  for name in unprotected first replay; do
    scenario_args "$name"
    strace -f -c -q -p "$demo_pid" -o "$out/syscalls-$name.txt" 2>/dev/null & tracer=$!
    sleep 1
    client --requests 2000 "${args[@]}" > "$out/syscalls-$name.json"
    kill -INT "$tracer" 2>/dev/null || true; wait "$tracer" 2>/dev/null || true
  done
fi
kill "$sampler" 2>/dev/null || true
kill "$demo_pid"; wait "$demo_pid" 2>/dev/null || true; demo_pid=
# The traced demo flushes its spans at shutdown; then the receiver writes what it counted.
kill "$otel_pid"; wait "$otel_pid" 2>/dev/null || true; otel_pid=
kill "$sink_pid"; wait "$sink_pid" 2>/dev/null || true; sink_pid=
else
  # shellcheck source=/dev/null
  [ -f "$out/params" ] && source "$out/params"
fi
peak_kib=$(cat "$out/rss" 2>/dev/null || echo 0)

python3 - "$out" "$peak_kib" "$duration" "$rounds" "$http_seconds" > PERFORMANCE.md <<'PY'
import functools, glob, json, os, platform, re, statistics, subprocess, sys
out, peak_kib, duration, rounds, http_seconds = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
read = lambda name: open(os.path.join(out, name)).read() if os.path.exists(os.path.join(out, name)) else ""
def cmd(c):
    try:
        return subprocess.run(c, shell=True, capture_output=True, text=True, timeout=10).stdout.strip()
    except Exception:
        return "?"
cpu = cmd("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2").strip()
cores = os.cpu_count()
mem = cmd("free -g | awk '/Mem:/ {print $2}'")
pg = cmd("psql \"$DATABASE_URL\" -Atc 'SHOW server_version'")
redis = cmd("redis-cli -u \"$REDIS_URL\" INFO server | grep redis_version | cut -d: -f2").strip()
mysql = cmd("mysql -N -B -h 127.0.0.1 -u root -e 'SELECT VERSION()'")
rustc = cmd("rustc --version")
http_rounds = sorted(int(p.rsplit("-", 1)[1][:-5]) for p in glob.glob(os.path.join(out, "http-unprotected-*.json")))
http = {name: [json.load(open(os.path.join(out, f"http-{name}-{r}.json"))) for r in http_rounds]
        for name in ["unprotected", "first", "first-layer", "first-optimistic", "replay", "validate", "first-otel", "replay-otel"]
        if all(os.path.exists(os.path.join(out, f"http-{name}-{r}.json")) for r in http_rounds)}
health = json.load(open(os.path.join(out, "http-health.json")))
rps = lambda report: report.get("ops_per_s", 0) or 1
# The ratio of each round (both sides measured back to back), then their median and range.
def criterion_estimates(name):
    """Each bench id of a criterion output to its middle time estimate, in nanoseconds."""
    scale = {"ps": 1e-3, "ns": 1.0, "µs": 1e3, "us": 1e3, "ms": 1e6, "s": 1e9}
    out, current = {}, None
    for line in read(name).splitlines():
        ident = re.match(r"^(\S+/\S+)", line)
        if ident:
            current = ident.group(1)
        time = re.search(r"time:\s+\[\S+ \S+ (\S+) (\S+) ", line)
        if time and current and time.group(2) in scale:
            out[current] = float(time.group(1)) * scale[time.group(2)]
    return out

def http_ratio(name, base="unprotected"):
    ratios = [rps(a) / rps(b) for a, b in zip(http[name], http[base])]
    return statistics.median(ratios), min(ratios), max(ratios)
# Tracing on over tracing off, per round (the same scenario on the two demos, back to back).
tracing = {name: http_ratio(f"{name}-otel", name) for name in ["first", "replay"] if f"{name}-otel" in http}
sink = read("otlp-sink.counts").split()
# CPU seconds per process group (postgres, redis-server, demo, load) spent during one HTTP
# scenario: per-pid differences of the snapshots bench.sh takes around it; None without them.
@functools.cache
def http_cpu(scenario):
    path = lambda when: os.path.join(out, f"{scenario}.{when}")
    if not all(os.path.exists(path(w)) for w in ("cpu-before", "cpu-after", "times-before", "times-after")):
        return None
    tick = os.sysconf("SC_CLK_TCK")
    snap = lambda when: [line.split() for line in open(path(when)) if len(line.split()) == 3]
    before = {(n, p): int(t) for n, p, t in snap("cpu-before")}
    groups = {}
    for n, p, t in snap("cpu-after"):
        groups[n] = groups.get(n, 0) + (int(t) - before.get((n, p), 0)) / tick
    def children(when):
        lines = open(path(when)).read().split("\n")
        return sum(int(m) * 60 + float(sec) for m, sec in re.findall(r"(\d+)m([0-9.]+)s", lines[1] if len(lines) > 1 else ""))
    groups["load"] = children("times-after") - children("times-before")
    return groups
CPU_GROUPS = [("postgres", "PostgreSQL"), ("demo", "demo"), ("redis-server", "Redis"), ("load", "load generator")]
# With tracing on, the local OTLP receiver's share too (zero for the other scenarios).
CPU_GROUPS_OTEL = CPU_GROUPS + [("otlp-sink", "OTLP receiver")]
# CPU per request in microseconds per group and in total, and the cores the scenario kept busy.
def http_cpu_per_request(name, i):
    groups, report = http_cpu(f"http-{name}-{http_rounds[i]}"), http[name][i]
    if groups is None or not report.get("requests"):
        return None
    per = {g: groups.get(g, 0) * 1e6 / report["requests"] for g, _ in CPU_GROUPS_OTEL}
    return per, sum(per.values()), sum(groups.values()) / (report.get("elapsed_s") or 1)
# The ratio of the unprotected payment's CPU per request to the scenario's (median of the
# rounds): the throughput ratio that the machine's cores allow when the run keeps them busy.
# With `servers_only`, the load generator's share is left out: the ratio the servers' cores
# allow when the clients run on another machine.
def cpu_ratio(name, servers_only=False):
    def cost(cpu):
        per, total, _ = cpu
        return total - per["load"] if servers_only else total
    pairs = [(http_cpu_per_request("unprotected", i), http_cpu_per_request(name, i)) for i in range(len(http_rounds))]
    pairs = [(cost(a), cost(b)) for a, b in pairs if a and b]
    return statistics.median(a / b for a, b in pairs) if pairs else None
# The load generator's share of a scenario's CPU per request (median of the rounds).
def load_share(name):
    cpus = [http_cpu_per_request(name, i) for i in range(len(http_rounds))]
    return statistics.median(c[0]["load"] / c[1] for c in cpus if c and c[1])

print("# Performance\n")
print("Regenerated by `scripts/bench.sh` (every figure below comes from one run of it). The machine is")
print("shared and noisy, so each claim is a **ratio** between two scenarios of the same run; the")
print("load bench interleaves its scenarios over several rounds so that both sides of a ratio")
print("share the same background load. Absolute numbers move between runs; the ratios much less.\n")
print("## Machine\n")
print(f"- CPU: {cpu}, {cores} cores; memory: {mem} GiB; {platform.system()} {platform.release()}")
print(f"- PostgreSQL {pg}, MySQL/MariaDB {mysql}, Redis {redis}, NATS with JetStream, tansu 0.6 (Kafka protocol, memory storage), all on 127.0.0.1 (loopback)")
print(f"- {rustc}; release profile\n")
print("## Method and scenario grid\n")
print("| bench | command | what it measures |")
print("|---|---|---|")
print("| fingerprint | `cargo bench -p idempotency-core --bench fingerprint` | RFC 8785 canonical JSON + SHA-256/512 of a 200 B, 4 KiB and 64 KiB request |")
print("| replay tiers | `cargo bench -p idempotency-cache-redis --bench replay_tiers` | one client: `execute` replaying the same record from moka, Redis, PostgreSQL, next to a bare Redis GET and a bare primary-key SELECT |")
print(f"| load | `cargo run --release -p idempotency-bench -- --clients 4 --duration {duration} --rounds {rounds} --peers $PEERS_DIR` | concurrent clients against PostgreSQL and Redis: the business transaction alone, the same SQL the library issues (read from the store) issued through sqlx and by pgbench (`-M prepared`, same clients, interleaved), `execute` and `execute_optimistic`, the first executions of two peer libraries (interleaved, see below), replays from each tier, concurrent duplicates, outbox enqueue (through the library, its statement through sqlx and by pgbench), relay drain to JetStream and to Kafka (the same backlog, the JetStream drain the baseline), relay commit-to-ack under a steady producer of 2,000 events/s |")
print(f"| middleware | `cargo run --release -p idempotency-bench -- --only-layer --clients 4 --duration {duration} --rounds {rounds}` | the same payment handler through an axum router in process (`oneshot`, no socket): behind `IdempotencyLayer` (the handler takes `IdempotentTx`; claim-first and `optimistic()`), calling `execute` itself, and the same insert in a plain transaction without idempotency; first executions (fresh keys) and replays of one key (`lookup-before-acquire` on both) |")
print(f"| MySQL / MariaDB | `cargo run --release -p idempotency-bench -- --backend mysql --clients 4 --duration {duration} --rounds {rounds}` | the load bench's grid on `MYSQL_URL`: `execute` against the same SQL issued directly and against the business transaction alone, a replay against a bare primary-key SELECT, the relay's drain to JetStream (polling) |")
print("| relay | `cargo bench -p idempotency-outbox --all-features --bench relay` | relay throughput to JetStream with acks, 1 and 2 workers, batches 10/100/500; commit-to-ack latency with NOTIFY versus polling |")
print(f"| HTTP | `idempotency-load` against the release demo on PostgreSQL + Redis, 16 clients | the same payment without idempotency, first executions (fresh keys: `execute` in the handler, and the same payment behind `IdempotencyLayer` claim-first and `optimistic()`) and replays (one key), interleaved over {len(http_rounds)} rounds of {http_seconds} each (ratios per round, their median); `GET /health`; peak resident memory of the demo |\n")
print("Round trips per call are fixed by design and checked by a test")
print("(`crates/idempotency-pg/tests/round_trips.rs`): first execution 5 statements (`BEGIN`,")
print("acquire, business insert, complete, `COMMIT`), optimistic 4, replay with")
print("`lookup-before-acquire` 1 (no transaction), replay insert-first 4, replay from a cache 0.\n")
print("## Targets\n")
print("| target | measured | met |")
print("|---|---:|---|")
def ratios():
    for line in "\n".join(read(name) for name in ("load.txt", "layer.txt", "mysql.txt")).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[1] in ("throughput", "p50 latency"):
            yield cells
for what, measure, value, target in ratios():
    try:
        v = float(value)
    except ValueError:
        continue
    bound = re.match(r"(>=|<=)\s*([0-9.]+)", target)
    # "this run's floor F, above it": the same statements through the same client without the
    # library reach F, below the target (the target is above what the client and the round
    # trips allow in this run).
    floor = re.search(r"this run's floor ([0-9.]+), above it", target)
    if bound and bound.group(1) == ">=" and floor and float(floor.group(1)) > v < float(bound.group(2)):
        met = f"**no**: the target is above this run's floor ({floor.group(1)}); measured {v / float(floor.group(1)):.2f} of the floor"
    elif bound and bound.group(1) == ">=":
        met = "yes" if v >= float(bound.group(2)) else "**no**"
    elif bound:
        met = "yes" if v <= float(bound.group(2)) else "**no**"
    else:
        met = "(reported)"
    target = re.sub(r": (met|missed)$", "", target)
    print(f"| {what} ({measure}; target {target}) | {v:.2f} | {met} |")
# The verdict on a ratio with a target and, where this run measured it, its floor: the same
# ratio for `POST /api/payments/validate` (the same request parsed, checked and answered,
# nothing else), which no replay can beat, since a replay must do that much too.
def verdict(value, target, floor=None):
    if value >= target:
        return "yes"
    if floor is not None and value < floor < target:
        return f"**no**: the target is above this run's floor ({floor:.2f}); measured {value / floor:.2f} of the floor"
    return "**no**"
validate_ratio = http_ratio("validate") if "validate" in http else None
for name, what, target in [("first", "first execution", 0.45), ("replay", "replay", 13)]:
    median, low, high = http_ratio(name)
    by_cpu, servers = cpu_ratio(name), cpu_ratio(name, servers_only=True)
    by_cpu = "" if by_cpu is None else f"; the same ratio of CPU per request {by_cpu:.2f}, {servers:.2f} without the load generator's, see the HTTP bench"
    floor = validate_ratio[0] if name == "replay" and validate_ratio else None
    floor_text = "" if floor is None else f"; this run's floor, `POST /api/payments/validate` / the same payment, {floor:.2f}"
    print(f"| HTTP {what} / the same payment without idempotency (throughput, median of {len(http_rounds)} rounds, {low:.2f}-{high:.2f}; target >= {target}{floor_text}{by_cpu}) | {median:.2f} | {verdict(median, target, floor)} |")
# The same first execution behind the layer, in both of its modes (issue 51's lever: what the
# optimistic mode gains over HTTP), against the same target.
for name, what in [("first-layer", "`IdempotencyLayer` (claim-first, `POST /v2/payments`)"), ("first-optimistic", "`IdempotencyLayer::optimistic()` (`POST /v2/payments/optimistic`)")]:
    if name in http:
        median, low, high = http_ratio(name)
        by_cpu, servers = cpu_ratio(name), cpu_ratio(name, servers_only=True)
        by_cpu = "" if by_cpu is None else f"; the same ratio of CPU per request {by_cpu:.2f}, {servers:.2f} without the load generator's"
        print(f"| HTTP first execution through {what} / the same payment without idempotency (throughput, median of {len(http_rounds)} rounds, {low:.2f}-{high:.2f}; target >= 0.45{by_cpu}) | {median:.2f} | {verdict(median, 0.45)} |")
if "first-optimistic" in http and "first-layer" in http:
    median, low, high = http_ratio("first-optimistic", "first-layer")
    print(f"| HTTP first execution, `IdempotencyLayer::optimistic()` / claim-first (throughput, median of {len(http_rounds)} rounds, {low:.2f}-{high:.2f}; target report) | {median:.2f} | (reported) |")
# The replay's CPU per request against the unprotected payment's, the servers' processes only
# (the demo, PostgreSQL, Redis): what the throughput ratio would be with the clients elsewhere.
servers = cpu_ratio("replay", servers_only=True)
if servers is not None:
    floor = cpu_ratio("validate", servers_only=True) if "validate" in http else None
    floor_text = "" if floor is None else f"; this run's floor, `POST /api/payments/validate`'s, {floor:.2f}"
    print(f"| HTTP replay's CPU per request / the same payment's without idempotency, the servers only (median of {len(http_rounds)} rounds; target >= 22{floor_text}) | {servers:.2f} | {verdict(servers, 22, floor)} |")
for name, what in [("first", "first execution"), ("replay", "replay")]:
    if name in tracing:
        median, low, high = tracing[name]
        print(f"| HTTP {what} with tracing on (spans recorded, OTLP/HTTP batch export to a local receiver) / off (throughput, median of {len(http_rounds)} rounds, {low:.2f}-{high:.2f}; target >= 0.95; see Tracing cost) | {median:.2f} | {'yes' if median >= 0.95 else '**no**'} |")
drain = re.findall(r"\| (\d) worker\(s\), batch 100, \d+ events \| (\d+) \|", read("load.txt"))
ceilings = {w: (cores, split, int(c)) for w, cores, split, c in re.findall(r"\| (\d) worker\(s\): CPU ceiling on (\d+) cores \(CPU per event: ([^)]*)\) \| (\d+) \|", read("load.txt"))}
for workers, rate in drain:
    floor = 60000 if workers == "2" else 10000
    ceiling = ""
    if workers in ceilings:
        cores, split, c = ceilings[workers]
        ceiling = f"; this machine's CPU ceiling for it {c:,} events/s ({split}, on {cores} cores){', below the target' if c < floor else ''}"
    print(f"| relay drain to JetStream with acks, batch 100, {workers} worker(s) (target >= {floor:,} events/s{ceiling}) | {int(rate):,} | {'yes' if int(rate) >= floor else '**no**'} |")
    if workers == "2" and workers in ceilings:
        share = int(rate) / ceilings[workers][2]
        print(f"| relay drain, 2 workers / this run's CPU ceiling for the drain (target >= 0.85) | {share:.2f} | {'yes' if share >= 0.85 else '**no**'} |")
halves = {w: r for w, r in re.findall(r"\| (\d) worker\(s\): drain / JetStream alone \| ([0-9.]+) \|", read("load.txt"))}
stores = {w: r for w, r in re.findall(r"\| (\d) worker\(s\): the store alone [^|]* \| (\d+) \|", read("load.txt"))}
for workers, ratio in halves.items():
    store = f"; the store alone {int(stores[workers]):,} events/s" if workers in stores else ""
    print(f"| relay drain / JetStream alone (the same publishes without a database), {workers} worker(s){store} | {float(ratio):.2f} | (reported) |")
kafka = {w: r for w, r in re.findall(r"\| (\d) worker\(s\), batch 100, \d+ events, to Kafka \| (\d+) \|", read("load.txt"))}
kafka_vs = {w: r for w, r in re.findall(r"\| (\d) worker\(s\): Kafka drain / JetStream drain \| ([0-9.]+) \|", read("load.txt"))}
kafka_alone = {w: r for w, r in re.findall(r"\| (\d) worker\(s\): Kafka alone [^|]* \| (\d+) \|", read("load.txt"))}
for workers, ratio in kafka_vs.items():
    rate = f"{int(kafka[workers]):,} events/s" if workers in kafka else "?"
    alone = f", Kafka alone {int(kafka_alone[workers]):,} events/s" if workers in kafka_alone else ""
    print(f"| relay drain to Kafka (tansu, delivery reports awaited) / to JetStream, the same backlog in the same run, {workers} worker(s) ({rate}{alone}) | {float(ratio):.2f} | (reported) |")
ack = re.search(r"\| commit-to-ack at (\d+) events/s \| (\d+) \| (\d+) \| ([0-9.]+) ms \| ([0-9.]+) ms \| ([0-9.]+) ms \| (\d+) \|(?: ([0-9.]+) ms \| ([0-9.]+) ms \|)?", read("load.txt"))
if ack:
    rate, reached, p50, p99 = int(ack.group(1)), int(ack.group(3)), float(ack.group(4)), float(ack.group(5))
    unacked = int(ack.group(7))
    every = re.search(r"\| commit-to-ack at \d+ events/s, NOTIFY every commit[^|]* \| \d+ \| (\d+) \| [0-9.]+ ms \| ([0-9.]+) ms \|", read("load.txt"))
    before = f"; with a NOTIFY every commit, in the same run: producer reached {int(every.group(1)):,} events/s, p99 {float(every.group(2)):.1f} ms" if every else ""
    met = p99 < 10 and reached >= 0.95 * rate and unacked == 0
    lost = f", {unacked:,} events not acked 60 s after the producer stopped" if unacked else ""
    parts = f"; p99 of its parts: commit to claimed {float(ack.group(8)):.1f} ms, claimed to acked {float(ack.group(9)):.1f} ms" if ack.group(8) else ""
    print(f"| relay commit-to-ack p99 at {rate:,} events/s, 2 workers, batch 100 (target < 10 ms; p50 {p50:.1f} ms{parts}, producer reached {reached:,} events/s{lost}{before}) | {p99:.1f} ms | {'yes' if met else '**no**'} |")
notify = re.search(r"LISTEN/NOTIFY \| [^|]+ \| ([0-9.]+)ms", read("relay.txt"))
if notify:
    p99 = float(notify.group(1))
    print(f"| commit-to-ack p99 with NOTIFY at 200 events/s (target < 50 ms) | {p99:.1f} ms | {'yes' if p99 < 50 else '**no**'} |")
print(f"| resident memory of the demo under the HTTP bench (target < 100 MiB) | {peak_kib/1024:.1f} MiB | {'yes' if peak_kib < 100*1024 else '**no**'} |")
print()
if "peer: " in read("load.txt"):
    # The versions scripts/peers.sh installed: the pins of the peers' manifests.
    peers_dir = "crates/idempotency-bench/peers"
    node_pin = json.load(open(f"{peers_dir}/package.json"))["dependencies"]["@node-idempotency/core"]
    powertools_pin = re.search(r"^aws-lambda-powertools\S*==(\S+)", open(f"{peers_dir}/requirements.txt").read(), re.M).group(1)
    print("The peer rows set both first-execution modes against the faster of two peer libraries, run")
    print("by the load bench as scenarios of their own, interleaved with the library's, with the same")
    print(f"4 clients and the same business insert into the same table: `@node-idempotency/core` {node_pin}")
    print("with its Redis storage adapter (Node.js, one process, 4 concurrent clients) and Powertools for")
    print(f"AWS Lambda {powertools_pin} with its Redis persistence layer (Python, one process per client).")
    print("`scripts/peers.sh` installs them outside the repository at those pinned versions; their")
    print("harnesses are in `crates/idempotency-bench/peers/`. Neither is transactional: the peer")
    print("writes its in-progress record to Redis (`SET NX`), autocommits the business insert in")
    print("PostgreSQL (one statement), then writes the completed record (`SET`), so a crash between")
    print("the insert and the last write leaves a payment whose retry runs it again. The library does")
    print("the record and the insert in one PostgreSQL transaction: `execute` in 5 statements,")
    print("`execute_optimistic` in 4, against the peer's one PostgreSQL statement and two Redis")
    print("commands. Each peer row names its floor in this run: the same statements sent through")
    print("the same client (sqlx) without the library, against the same peer. The library stays on")
    print("sqlx (the caller's business SQL runs on the caller's sqlx transaction), which sends one")
    print("statement and awaits its answer before the next, so no library built on it can do better")
    print("than that floor; where the floor is below the target, the row says so.\n")
else:
    print("The rows comparing with peer libraries (`@node-idempotency/core`, Powertools for AWS Lambda)")
    print("were not measured in this run: `scripts/peers.sh` could not install them (it needs node with")
    print("npm, python3 with venv, and their registries), or the run had `PEERS=0`.\n")
print("Reading the ratios to the business transaction alone: every statement is a round trip, so")
print("`execute` (5 statements: `BEGIN`, claim, business insert, complete, `COMMIT`) is set against")
print("pgbench running the same statements (read from the store, prepared) against its own")
print("`BEGIN`, insert, `COMMIT`, in the same run with the same clients (the `pgbench:` rows of the")
print("load bench; pgbench and the peers connect without TLS, as the bench's sqlx client does, so")
print("that a server with `ssl = on` does not charge them alone for encryption); `execute_optimistic`")
print("(4 statements) likewise. The pgbench row \"pipelined in 3 round")
print("trips\" sends `BEGIN` with the claim and `COMMIT` with the completion, the same statements in")
print("3 round trips instead of 5: what the claim-first mode would gain from a client that pipelines")
print("(sqlx sends one statement and waits for its answer before the next). Every pool of the")
print("bench and of the demo is built with `idempotency::pool::TestWhenIdle` (a connection is pinged")
print("before a checkout only after 10 s idle), as the starter's README recommends; sqlx 0.9 still")
print("pings every connection it takes back, a round trip per transaction that pgbench and the")
print("peers do not make and that no pool option turns off. The outbox's default configuration (ordered, NOTIFY) costs more than a plain")
print("insert: the per-aggregate counter row is an extra upsert inside the statement. PostgreSQL")
print("lets one transaction that sent a NOTIFY commit at a time (a database-wide lock held until its")
print("commit record is flushed), so the default notifies at most once per `notify-interval` (5 ms);")
print("the row with a NOTIFY at every commit shows what that costs. The two configurations that")
print("issue one fixed statement (a NOTIFY at every commit, or none) are also run by pgbench: the")
print("business insert and the library's enqueue statement of one event in one transaction, whose")
print("ratio to pgbench's business transaction alone is the floor of the library's. Over HTTP a")
print("first execution also writes Redis and moka after the commit, and a replay does no database")
print("work at all, hence a replay several times faster than the same payment without")
print("idempotency.\n")
print("Reading the relay drain's rows: the relay, PostgreSQL and the NATS server share this")
print("machine's cores. The load bench reads the CPU time each of them spent on the drain from")
print("`/proc` and divides the cores by their sum: the events/s at which every core would be busy")
print("with the drain, whatever the relay overlaps. A target above that ceiling cannot be met on")
print("this machine; PostgreSQL's share is the claim's and the mark's row updates (each row is")
print("written twice, with its index entries).\n")
print("Reading the commit-to-ack row: the load bench's commit-to-ack table also splits every")
print("sample at the start of its publish (a worker publishes the batch it claimed at once): from")
print("the commit to being claimed (the notification or the look-again, a worker still busy with")
print("its previous batch, the claim statement itself while the producer's commits load the same")
print("server), then from the publish to JetStream's ack. Their p99s do not add up to the total's,")
print("but the larger one says where the slow messages waited.\n")
print("## Outbox retention at scale (`--only-retention`)\n")
print("The same published events in today's plain table and in the day-partitioned layout")
print("(`outbox.partitioning`), `retention.published` 3 days: the plain table is purged by the")
print("batched DELETE, the partitioned one by detaching and dropping the fully expired")
print("partitions (what is left of a partly expired one still goes through the batched DELETE).")
print("WAL is read from the server (`pg_current_wal_lsn`), sizes are `pg_total_relation_size`,")
print("and the relay's claim latency is sampled on 200 pending rows while each purge runs.\n")
print("```")
print(read("retention.txt").strip())
print("```\n")
print("## Load bench\n")
print("```")
print(read("load.txt").strip())
print("```\n")
print("## Middleware: IdempotencyLayer against explicit execute\n")
print("The layer's first execution in its default mode (claim-first) issues `execute`'s five")
print("statements and a savepoint after the claim (a handler that catches a failed statement on")
print("PostgreSQL has its answer stored there): six round trips. `IdempotencyLayer::optimistic`")
print("issues four (`BEGIN`, the handler's insert, the record's insert, `COMMIT`), with")
print("`execute_optimistic`'s trade-off: concurrent duplicates may both run the handler, the")
print("loser rolls back. The plain route runs the same insert in its own transaction, without")
print("idempotency (three round trips). The layer also buffers the request body, fingerprints")
print("method, route and body, and stores the whole response (status, allowed headers, body as")
print("JSON text) instead of the value. A replay with `lookup-before-acquire` is one read on both")
print("paths.\n")
print("```")
print(read("layer.txt").strip())
print("```\n")
print("## MySQL / MariaDB (load bench, `--backend mysql`)\n")
print("`execute` on MySQL issues 8 statements against the business transaction's 3 (PostgreSQL: 5):")
print("the wait budget is a session variable set before and restored after the insert (no CTE can")
print("carry it), the duplicate check reads `LAST_INSERT_ID()`, and there is no `RETURNING`. Relays")
print("poll (MySQL has no notifications).\n")
print("```")
print(read("mysql.txt").strip())
print("```\n")
print("## HTTP bench (the demo, release build)\n")
print(f"16 clients, {http_seconds} per scenario; each round runs the payment scenarios and their floor (`validate`) back to back.\n")
print("CPU per request: the CPU time of every PostgreSQL process, the demo, Redis and the load")
print("generator during the scenario (from `/proc`), divided by its requests; \"cores busy\" is")
print(f"their sum over the scenario's wall time, out of the machine's {cores}. When the cores are all")
print("busy, throughput is the cores divided by the CPU per request, whatever the round trips.\n")
print(f"| round | endpoint | requests/s | p50 | p99 | CPU per request: {' + '.join(label for _, label in CPU_GROUPS)} = total | cores busy | statuses |")
print("|---:|---|---:|---:|---:|---|---:|---|")
label = {"unprotected": "`POST /api/payments/unprotected` (no idempotency)", "first": "`POST /api/payments`, fresh key (first execution)", "first-layer": "`POST /v2/payments`, fresh key (`IdempotencyLayer`, claim-first)", "first-optimistic": "`POST /v2/payments/optimistic`, fresh key (`IdempotencyLayer::optimistic()`)", "replay": "`POST /api/payments`, one key (replays)", "validate": "`POST /api/payments/validate` (the floor: the same request checked, nothing paid)", "health": "`GET /health`"}
def http_row(round_, name, r, cpu=None, groups=CPU_GROUPS):
    statuses = ", ".join(f"{k}: {v}" for k, v in sorted(r.get("statuses", {}).items()))
    lat = r.get("latency_ms", {})
    split, busy = "", ""
    if cpu is not None:
        per, total, cores_busy = cpu
        split = " + ".join(f"{per[g]:.0f}" for g, _ in groups) + f" = **{total:.0f} us**"
        busy = f"{cores_busy:.2f}"
    print(f"| {round_} | {label[name]} | {r.get('ops_per_s', 0):.0f} | {lat.get('p50', 0):.2f} ms | {lat.get('p99', 0):.2f} ms | {split} | {busy} | {statuses} |")
for i, round_ in enumerate(http_rounds):
    for name in ["unprotected", "first", "first-layer", "first-optimistic", "replay", "validate"]:
        if name in http:
            http_row(round_, name, http[name][i], http_cpu_per_request(name, i))
http_row("", "health", health)
(f, fl, fh), (p, pl, ph) = http_ratio("first"), http_ratio("replay")
print(f"\nFirst execution / no idempotency: **{f:.2f}** (rounds {fl:.2f}-{fh:.2f}); replay / no idempotency: **{p:.2f}** (rounds {pl:.2f}-{ph:.2f}).")
cf, cp = cpu_ratio("first"), cpu_ratio("replay")
if cf is not None and cp is not None:
    print(f"The same ratios from CPU per request alone (unprotected over the scenario, median of the rounds): first execution **{cf:.2f}**, replay **{cp:.2f}**.")
    sf, sp = cpu_ratio("first", servers_only=True), cpu_ratio("replay", servers_only=True)
    print(f"Without the load generator's share (PostgreSQL + demo + Redis only: the ratios the servers' cores allow when the clients run on another machine): first execution **{sf:.2f}**, replay **{sp:.2f}**. The load generator shares the machine's cores: it spent {load_share('unprotected'):.0%} of the CPU per request of the payment without idempotency, {load_share('first'):.0%} of a first execution's and {load_share('replay'):.0%} of a replay's.")
if "validate" in http:
    (v, vl, vh), sv = http_ratio("validate"), cpu_ratio("validate", servers_only=True)
    by_cpu = "" if sv is None else f", **{sv:.2f}** by the servers' CPU alone"
    print(f"The floor of the replay rows: `POST /api/payments/validate` takes the same request (headers and body) through the same extractors and checks as `POST /api/payments` (the key, `ProblemJson<CreatePayment>`, `validate()`) and answers it without idempotency, a database or a cache; a replay of `/api/payments` does all of that, then the fingerprint and the cache lookup. Its ratio to the payment without idempotency is **{v:.2f}** (rounds {vl:.2f}-{vh:.2f}){by_cpu}: no replay of `/api/payments` through this server can reach a higher one. (The load generator reads less of its answer than of a replay's, no payment id or body digest, so the throughput floor is, if anything, generous; a route behind `IdempotencyLayer` replays before its extractors and is not bounded by it.)")
print(f"Peak resident memory of the demo during the HTTP bench: **{peak_kib/1024:.1f} MiB** (target: under 100 MiB).\n")
if tracing:
    print("## Tracing cost (issue 47)\n")
    print("A second demo, the same release binary on the same database and Redis, runs with")
    print("`OTEL_EXPORTER_OTLP_ENDPOINT` set: the `tracing-opentelemetry` layer records every `info`")
    print("span (the request, `idempotency.execute`, each store statement and cache call; a replay's")
    print("span carries its link to the execution it replays) and the SDK's batch processor exports")
    print("them over OTLP/HTTP (protobuf) to a local receiver, `scripts/otlp-sink.py`, which answers")
    print("each batch and counts its spans (`OTEL_BSP_SCHEDULE_DELAY=200`, a queue of 262,144 spans so")
    print("that none is dropped). Each round runs a scenario on the demo without tracing, then on the")
    print("one with tracing, back to back; the ratio is per round, then the median. The receiver's CPU")
    print("is part of the traced side's (it shares the machine's cores).\n")
    print(f"| round | endpoint | requests/s | p50 | p99 | CPU per request: {' + '.join(label for _, label in CPU_GROUPS_OTEL)} = total | cores busy | statuses |")
    print("|---:|---|---:|---:|---:|---|---:|---|")
    label["first-otel"] = "`POST /api/payments`, fresh key, **tracing on**"
    label["replay-otel"] = "`POST /api/payments`, one key (replays), **tracing on**"
    for i, round_ in enumerate(http_rounds):
        for name in ["first", "first-otel", "replay", "replay-otel"]:
            http_row(round_, name, http[name][i], http_cpu_per_request(name, i), CPU_GROUPS_OTEL)
    (f, fl, fh), (p, pl, ph) = tracing["first"], tracing["replay"]
    print(f"\nTracing on / off: first execution **{f:.2f}** (rounds {fl:.2f}-{fh:.2f}), replay **{p:.2f}** (rounds {pl:.2f}-{ph:.2f}); target >= 0.95 for both.")
    if len(sink) == 3:
        traced = sum(r.get("requests", 0) for name in ["first-otel", "replay-otel"] for r in http[name])
        requests, spans, size = (int(x) for x in sink)
        per = f", {spans / traced:.1f} spans per timed request (the strace sample runs on the demo without tracing)" if traced else ""
        print(f"The receiver got {spans:,} spans in {requests:,} export requests ({size / 1e6:.1f} MB of protobuf){per}.\n")
    else:
        print("The receiver's counts are missing (it did not stop cleanly).\n")
# strace -c's summary: "% time, seconds, usecs/call, calls, [errors,] syscall" per line.
def syscalls(name):
    text, report = read(f"syscalls-{name}.txt"), read(f"syscalls-{name}.json")
    try:
        requests = json.loads(report).get("requests", 0)
    except ValueError:
        return None
    calls = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 5 and fields[3].isdigit() and fields[-1] != "total":
            calls[fields[-1]] = int(fields[3])
    return {k: v / requests for k, v in calls.items()} if requests and calls else None
SYSCALLS = ["sendto", "writev", "recvfrom", "futex", "write", "epoll_wait"]
counted = {name: syscalls(name) for name in ["unprotected", "first", "replay"]}
if all(counted.values()):
    print("System calls of the demo per request (`strace -f -c` attached to the demo for 2,000 requests")
    print("of each scenario, after the timed rounds). `sendto` is exact; the others move a little with")
    print("timing (a read that finds nothing yet, a thread that was already awake), far less than the")
    print("timings do:\n")
    print(f"| endpoint | {' | '.join(f'`{c}`' for c in SYSCALLS)} | all |")
    print("|---|" + "---:|" * (len(SYSCALLS) + 1))
    for name, per in counted.items():
        print(f"| {label[name]} | {' | '.join(f'{per.get(c, 0):.2f}' for c in SYSCALLS)} | {sum(per.values()):.2f} |")
    print()
    print("`sendto` is a message sqlx sends to PostgreSQL: one per statement (`BEGIN` and `COMMIT` included)")
    print("and one for the ping with which sqlx 0.9 takes back every connection. `writev` is the answer")
    print("to the client, plus fred's writes to Redis (several requests' commands share a write).")
    print("`futex` and `write` (to tokio's eventfd) wake another thread. On a virtual machine each message")
    print("to a local server also wakes that server's process on the other core, which is most of the")
    print("kernel's share of the demo's CPU in a profile (`perf record -e cpu-clock -g`): the difference")
    print("in PostgreSQL messages between a payment without idempotency and a first execution is the")
    print("claim and the completion, a round trip each.\n")
else:
    print("System calls per request were not counted in this run (strace is not installed or could not attach).\n")
print("## SQLite: request latency with an ordered outbox backlog\n")
print("`cargo run --release -p idempotency-sqlite --example backlog_latency -- 100000 400`: payments")
print("through `execute` that write a charge and enqueue its event, while a relay polls every 50 ms")
print("an outbox whose one aggregate has 100,000 pending events behind its first one, in flight (a")
print("broker outage: every poll takes the write lock and hands out nothing). Compare the lines of")
print("one run: the 16-client figures are mostly the commits' `fsync` queue, backlog or not.\n")
print("```")
print(read("sqlite-backlog.txt").strip() or "(not measured in this run)")
print("```\n")
print("## Replay tiers, one client (criterion)\n")
print("```")
print(read("replay.txt").strip())
print("```\n")
print("## Metrics: one request's meters through the Prometheus recorder (criterion)\n")
print("What a replay (`lookup_hit`, `replayed`) and a first execution (`acquire_wait`, `acquired`,")
print("`persisted`) record, with `FacadeMetrics` (each meter registered with the recorder on every")
print("call), `CachedMetrics` (each operation's handles registered once and kept; the starter's and")
print("the demo's) and `NoopMetrics` (nothing recorded):\n")
print("```")
print(read("meters.txt").strip())
print("```\n")
meters = criterion_estimates("meters.txt")
for scenario in ("replay", "first_execution"):
    facade, cached = meters.get(f"{scenario}/facade"), meters.get(f"{scenario}/cached")
    if facade and cached:
        print(f"- {scenario.replace('_', ' ')}: `CachedMetrics` {cached:.0f} ns, `FacadeMetrics` {facade:.0f} ns, {facade / cached:.1f} times cheaper")
print()
print("## Fingerprint (criterion)\n")
print("```")
print(read("fingerprint.txt").strip())
print("```\n")
print("## Outbox relay (idempotency-outbox bench)\n")
print("```")
print(read("relay.txt").strip())
print("```")
PY
echo "PERFORMANCE.md written"
