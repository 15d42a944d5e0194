//! The outbox relay under repeated `SIGKILL`: the steps `outbox-chaos` runs, one subcommand
//! each, so that a script can kill the relay process and restart it.
//!
//! 1. [`stream::create`] a JetStream stream with a long duplicate window;
//! 2. [`watch::run`] a core NATS subscription on its subjects that counts every copy that
//!    reaches the server, duplicates included (JetStream drops them from the stream, not from
//!    core subscribers);
//! 3. [`enqueue::run`] N events into a PostgreSQL outbox;
//! 4. [`relay::run`] the relay, printing one line per broker ack (`<id> <duplicate 0|1>`),
//!    killed and restarted by the script until nothing is pending;
//! 5. [`verify::run`]: every row published, every id in the stream exactly once, and the
//!    duplicates each kill caused.
//!
//! [`republish::run`] publishes rows already published once more (a relay's republish after a
//! lost ack): `scripts/chaos/nats-cluster.sh` runs it after a stream leader change, to see
//! JetStream's duplicate window survive the change.
//!
//! [`consume::run`] is a real consumer of such a stream (`scripts/chaos/instances.sh`): a
//! durable pull consumer with explicit acks that checks arrival, per-aggregate order and
//! duplicates against the outbox table, and optionally applies every event through the inbox.

use std::time::Duration;

use idempotency_core::config::SchemaMode;
use idempotency_outbox::config::{BackoffConfig, Ordering, OutboxConfig};

pub mod acks;
pub mod consume;
pub mod enqueue;
pub mod relay;
pub mod republish;
pub mod stream;
pub mod verify;
pub mod watch;

/// The outbox configuration every step shares: the table (and its notify channel), the
/// workers and batch size, a short lease (publish timeout 2 s + margin 1 s) so that the rows
/// of a killed relay come back quickly, and a short backoff.
pub fn outbox_config(
    table: &str,
    ordering: Ordering,
    workers: usize,
    batch_size: u32,
    schema: SchemaMode,
) -> OutboxConfig {
    let mut config = OutboxConfig {
        table_name: table.to_owned(),
        ordering,
        notify_channel: Some(table.to_owned()),
        ..OutboxConfig::default()
    };
    config.schema.mode = schema;
    config.relay.workers = workers;
    config.relay.batch_size = batch_size;
    config.relay.poll_interval = Duration::from_millis(200);
    config.relay.publish_timeout = Duration::from_secs(2);
    config.relay.lease_margin = Duration::from_secs(1);
    config.relay.max_attempts = 1000;
    config.relay.backoff = BackoffConfig {
        base: Duration::from_millis(50),
        max: Duration::from_millis(500),
    };
    config.relay.shutdown_timeout = Duration::from_secs(5);
    config
}
