#!/usr/bin/env bash
# The test command: starts (or installs) PostgreSQL, Redis, NATS, RabbitMQ and Kafka (tansu) when they are not
# answering, waits for them, then runs every test of the workspace against them (and, without
# arguments, the outbox's RabbitMQ tests, behind a feature no workspace crate enables).
#
#   scripts/test.sh                 # all tests
#   scripts/test.sh -p idempotency-pg   # extra arguments go to `cargo test`
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/services.sh
source scripts/services.sh
ensure_services
cargo test --workspace "$@"
# No workspace crate enables the outbox's `rabbitmq` feature, so `--workspace` builds its
# RabbitMQ tests out; the full run (no arguments) runs them against the real broker.
# The same for the Kafka publisher (`kafka`, against tansu on KAFKA_URL).
if [ "$#" -eq 0 ]; then
  cargo test -p idempotency-outbox --features rabbitmq --test rabbitmq
  cargo test -p idempotency-outbox --features kafka --test kafka
  # A broker killed mid-drain and restarted (tansu on S3 storage served by moto).
  cargo test -p idempotency-outbox --features kafka --test kafka_restart
  # The facade's `outbox.publisher.kafka` from YAML.
  cargo test -p idempotency --features sqlite,outbox,kafka --test kafka
  # Traces from the request to the consumer (NATS and RabbitMQ, the `otel` feature).
  cargo test -p idempotency-outbox --features nats,rabbitmq,otel --test otel
  # A replay's span links to the execution it replays (the record's trace columns).
  cargo test -p idempotency-axum --features otel --test replay_link
fi
