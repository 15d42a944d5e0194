//! The relay process: `idempotency_outbox::Relay` with the NATS JetStream publisher, wrapped
//! to tag each copy with the process's number ([`LIFE_HEADER`]) and to print one line per
//! broker ack, so that a process killed with `SIGKILL` leaves a record of what it published.

use std::io::Write;

use idempotency_outbox::config::OutboxConfig;
use idempotency_outbox::publisher::nats::NatsPublisher;
use idempotency_outbox::publisher::nats::async_nats;
use idempotency_outbox::{Ack, OutboxMessage, PublishError, Publisher, Relay};
use idempotency_pg::PgOutbox;
use tokio::signal::unix::{SignalKind, signal};

use crate::Error;

/// The header naming the relay process that sent a copy (`1`, `2`...): JetStream deduplicates
/// on `Nats-Msg-Id` only, and a core subscriber sees which process sent each copy.
pub const LIFE_HEADER: &str = "Chaos-Relay-Life";

/// Publishes through `inner` with [`LIFE_HEADER`] added and, once the broker confirmed, writes
/// `<id> <duplicate 0|1>` as one line to standard output (line-buffered: each ack is in the
/// output before the relay goes on to mark it, so it survives a `SIGKILL` that comes after).
#[derive(Debug)]
pub struct AckLog<P> {
    inner: P,
    life: String,
}

impl<P> AckLog<P> {
    /// Wraps `inner` for relay process number `life`.
    pub fn new(inner: P, life: u64) -> Self {
        Self {
            inner,
            life: life.to_string(),
        }
    }
}

impl<P: Publisher> Publisher for AckLog<P> {
    fn destination(&self) -> &str {
        self.inner.destination()
    }

    async fn publish(&self, message: &OutboxMessage) -> Result<Ack, PublishError> {
        let mut tagged = message.clone();
        tagged
            .headers
            .insert(LIFE_HEADER.to_owned(), self.life.clone());
        let ack = self.inner.publish(&tagged).await?;
        let line = format!("{} {}\n", message.id, u8::from(ack.duplicate));
        // A failed write only loses a line of the record; the publish itself succeeded.
        let _ = std::io::stdout().lock().write_all(line.as_bytes());
        Ok(ack)
    }
}

/// Runs the relay as process number `life` on `outbox`, publishing to `subject` (a template
/// such as `chaos.{aggregate_type}.{event_type}`) through `client`, until `SIGTERM` or
/// `SIGINT`; then shuts it down gracefully. A `SIGKILL` stops it wherever it is: the point.
pub async fn run(
    outbox: PgOutbox,
    client: async_nats::Client,
    subject: &str,
    config: &OutboxConfig,
    life: u64,
) -> Result<(), Error> {
    let publisher = NatsPublisher::new(client).with_subject(subject)?;
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    let handle = Relay::new(outbox, AckLog::new(publisher, life), config)?.spawn();
    tracing::info!("relay running");
    tokio::select! {
        _ = terminate.recv() => {}
        _ = interrupt.recv() => {}
    }
    let report = handle.shutdown().await;
    tracing::info!(
        published = report.totals.published,
        duplicates = report.totals.duplicates,
        graceful = report.graceful,
        "relay stopped"
    );
    Ok(())
}
