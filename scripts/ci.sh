#!/usr/bin/env bash
# The CI steps, one subcommand each. `.ci/run` and `.github/workflows/ci.yml` both call this
# script, so there is one recipe. `scripts/ci.sh all` (what `.ci/run` runs) is every step but
# `coverage` (the whole suite again, instrumented: over the time budget of `.ci/run`),
# `hack` (its own job in the GitHub workflow) and `testcontainers` (needs a Docker engine and
# no servers on the local ports).
#
#   lint       cargo fmt --check, clippy -D warnings
#   docs       rustdoc with -D warnings, with all features and with none of the defaults
#   test       scripts/test.sh (the README's test command: starts servers, cargo test)
#   check      scripts/check.sh: the randomized checker on the fixed seeds and fresh ones
#   scenarios  demo/scenarios.sh against the demo on PostgreSQL+Redis+NATS, on PostgreSQL with
#              the Redis Cluster, on PostgreSQL through PgBouncer (transaction pooling), on
#              MariaDB/MySQL,
#              then on SQLite, the facade's SQLite example over HTTP, its complete
#              example on PostgreSQL+Redis+NATS (scripts/example-production.sh),
#              then schemathesis against its OpenAPI document
#   hack       cargo hack check --each-feature --no-dev-deps
#   deny       cargo deny: bans, licenses, sources (blocking); advisories (reported only)
#   package    cargo package --no-verify of every published crate, then the packages built together
#   coverage   scripts/coverage.sh (per-crate line coverage, fails under 80 %)
#   testcontainers  the laptop path: no URLs, a Docker engine; the test helpers start
#              PostgreSQL and Redis containers
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

step() { printf '\n=== %s (%ss)\n' "$*" "$SECONDS"; }

lint() {
  step "format"
  cargo fmt --all -- --check
  step "clippy"
  cargo clippy --workspace --all-targets --all-features -- -D warnings
}

docs() {
  step "docs"
  RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --all-features
  # Each crate also documents without its default features (a gated item's links must hold).
  RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --no-default-features
}

tests() {
  step "tests (scripts/test.sh, the README's command)"
  bash scripts/test.sh
}

check() {
  step "randomized histories against the invariants (scripts/check.sh)"
  bash scripts/check.sh
}

scenarios() {
  step "demo scenarios on PostgreSQL + Redis + NATS"
  bash scripts/demo-scenarios.sh postgres
  step "demo scenarios on PostgreSQL + the Redis Cluster + NATS"
  bash scripts/demo-scenarios.sh postgres-cluster
  step "demo scenarios on PostgreSQL through PgBouncer (pool_mode = transaction)"
  bash scripts/demo-scenarios.sh postgres-pgbouncer
  step "demo scenarios on MariaDB / MySQL + Redis + NATS"
  bash scripts/demo-scenarios.sh mysql
  step "demo scenarios on the embedded default (SQLite, no DATABASE_URL)"
  bash scripts/demo-scenarios.sh sqlite
  step "the facade's SQLite example over HTTP (a YAML file and the assembly call)"
  bash scripts/example-orders.sh
  step "the facade's complete example on PostgreSQL + Redis + NATS over HTTP (issue 48)"
  bash scripts/example-production.sh
  step "schemathesis: property-based HTTP fuzzing from the OpenAPI document"
  bash scripts/schemathesis.sh 100
}

hack() {
  step "cargo hack check --each-feature --no-dev-deps"
  command -v cargo-hack >/dev/null || cargo install --locked cargo-hack
  cargo hack check --workspace --each-feature --no-dev-deps
}

deny() {
  command -v cargo-deny >/dev/null || cargo install --locked cargo-deny
  step "cargo deny check bans licenses sources"
  cargo deny check bans licenses sources
  step "cargo deny check advisories (not blocking)"
  cargo deny check advisories || echo "advisories check failed or could not fetch the database; not blocking"
}

package() {
  # `cargo publish --workspace --dry-run` builds every crate alone from its package: about
  # 2.5 min on a cold cache, which leaves .ci/run no margin in its 20 minutes. Instead: package
  # every published crate without that build (manifest, file list, license and readme, versions
  # on path dependencies), then build the unpacked packages together, outside the repository,
  # with the build cache of the other steps: a file missing from a package, or an include_str!
  # reaching outside its crate, fails here. Each crate's own feature set is checked by `hack`.
  step "cargo package (every published crate, --no-verify), then build the packages"
  local meta target dir crate
  local -a selection
  meta="$(cargo metadata --no-deps --format-version 1)"
  target="$(python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])' <<<"$meta")"
  mapfile -t selection < <(python3 -c '
import json, sys
for p in json.load(sys.stdin)["packages"]:
    if p["publish"] != []:  # publish = false is []
        print("--package"); print(p["name"])' <<<"$meta")
  rm -f "$target"/package/*.crate
  cargo package --no-verify --allow-dirty "${selection[@]}"
  dir="$(mktemp -d)"
  for crate in "$target"/package/*.crate; do tar -xzf "$crate" -C "$dir"; done
  {
    printf '[workspace]\nresolver = "3"\nmembers = ["*"]\n\n[patch.crates-io]\n'
    for crate in "$dir"/*/; do
      crate="$(basename "$crate")"
      printf '%s = { path = "%s" }\n' "${crate%-*}" "$crate"
    done
  } >"$dir/Cargo.toml"
  CARGO_TARGET_DIR="$target" cargo build --manifest-path "$dir/Cargo.toml" --workspace --all-features
  rm -rf "$dir"
}

coverage() {
  step "coverage"
  bash scripts/coverage.sh
}

testcontainers() {
  step "tests on containers started by the test helpers (no URLs set)"
  # A Redis Cluster has no container here: the cluster tests use the one services.sh starts.
  bash scripts/services.sh redis-cluster start
  env -u DATABASE_URL -u REDIS_URL -u REDIS_CLUSTER_URL \
    cargo test --features idempotency-testing/testcontainers -p idempotency-pg -p idempotency-cache-redis \
    -- --skip through_pgbouncer # PgBouncer stands in front of the local PostgreSQL, not the container
}

case "${1:-all}" in
  lint) lint ;;
  docs) docs ;;
  test) tests ;;
  check) check ;;
  scenarios) scenarios ;;
  hack) hack ;;
  deny) deny ;;
  package) package ;;
  coverage) coverage ;;
  testcontainers) testcontainers ;;
  # `hack` (each feature of each crate checked alone, about 10 min on 2 cores) runs as its
  # own job of the GitHub workflow, beside the others; on one machine it would take half of
  # `.ci/run`'s 20 minutes.
  all) lint; docs; tests; check; scenarios; deny; package ;;
  *) echo "unknown step: $1" >&2; exit 2 ;;
esac
step "done"
