#!/usr/bin/env bash
# The test command: starts (or installs) PostgreSQL, Redis, NATS and RabbitMQ when they are not
# answering, waits for them, then runs every test of the workspace against them.
#
#   scripts/test.sh                 # all tests
#   scripts/test.sh -p idempotency-pg   # extra arguments go to `cargo test`
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/services.sh
source scripts/services.sh
ensure_services
exec cargo test --workspace "$@"
