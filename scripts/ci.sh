#!/usr/bin/env bash
# The CI steps, one subcommand each. `.ci/run` and `.github/workflows/ci.yml` both call this
# script, so there is one recipe. Run `scripts/ci.sh all` to do everything `.ci/run` does.
#
#   lint       cargo fmt --check, clippy -D warnings
#   docs       rustdoc with -D warnings
#   test       scripts/test.sh (the README's test command: starts servers, cargo test)
#   scenarios  demo/scenarios.sh against the demo on PostgreSQL+Redis+NATS, then on SQLite,
#              then schemathesis against its OpenAPI document
#   hack       cargo hack check --each-feature --no-dev-deps
#   deny       cargo deny: bans, licenses, sources (blocking); advisories (reported only)
#   package    cargo publish --workspace --dry-run (every published crate packages and builds)
#   coverage   scripts/coverage.sh (per-crate line coverage, fails under 80 %)
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
}

tests() {
  step "tests (scripts/test.sh, the README's command)"
  bash scripts/test.sh
}

scenarios() {
  step "demo scenarios on PostgreSQL + Redis + NATS"
  bash scripts/demo-scenarios.sh postgres
  step "demo scenarios on the embedded default (SQLite, no DATABASE_URL)"
  bash scripts/demo-scenarios.sh sqlite
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
  step "cargo publish --workspace --dry-run"
  cargo publish --workspace --dry-run --allow-dirty
}

coverage() {
  step "coverage"
  bash scripts/coverage.sh
}

case "${1:-all}" in
  lint) lint ;;
  docs) docs ;;
  test) tests ;;
  scenarios) scenarios ;;
  hack) hack ;;
  deny) deny ;;
  package) package ;;
  coverage) coverage ;;
  all) lint; docs; tests; scenarios; hack; deny; package ;;
  *) echo "unknown step: $1" >&2; exit 2 ;;
esac
step "done"
