#!/usr/bin/env bash
# The randomized adversarial checker (crates/idempotency-check): seeded histories of concurrent
# requests under faults, on every subject (the service's execute_in, execute and
# execute_optimistic, the layer in transactional and leased mode, the outbox's enqueue, relay
# and inbox; PostgreSQL, SQLite, MariaDB; caches off, moka, moka + Redis with outages), each
# held against the invariants. Starts the servers it needs like scripts/test.sh.
#
#   scripts/check.sh                              # the fixed seeds and 4 fresh ones (CI)
#   scripts/check.sh --seed 42 --subject layer-pg # replays one history
#   scripts/check.sh --long                       # a soak: fresh seeds for 30 minutes
#                                                 # (CHECK_BUDGET seconds)
# Exit 1: an invariant broke (the seed, subject and history are printed); 2: a run could not
# be made.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/services.sh
source scripts/services.sh
ensure_services
args=("$@")
if [ "${1:-}" = "--long" ]; then
  args=(--budget "${CHECK_BUDGET:-1800}" "${@:2}")
fi
cargo build --quiet -p idempotency-check
exec cargo run --quiet -p idempotency-check -- "${args[@]}"
