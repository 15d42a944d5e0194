//! Helpers shared by the outbox conformance cases.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idempotency_core::config::SchemaMode;
use uuid::Uuid;

use super::OutboxBackend;
use crate::config::{BackoffConfig, Ordering, OutboxConfig};
use crate::message::{NewEvent, OutboxMessage};
use crate::publisher::{Ack, PublishError, PublishErrorKind, Publisher};
use crate::store::{ClaimRequest, Enqueue};

/// How long a case waits for the relay before failing.
pub(crate) const WAIT: Duration = Duration::from_secs(30);

/// An outbox configuration for the suite: tables created, on a table name and notification
/// channel unique to this call, `ordering` as given; one worker polling every 20 ms, short backoff, no retention
/// task (the retention case calls the store itself).
pub fn suite_config(ordering: Ordering) -> OutboxConfig {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let mut config = OutboxConfig::default();
    let name = format!(
        "outbox_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, AtomicOrdering::Relaxed)
    );
    // Notification channels are database-wide: one per outbox, so parallel tests never wake
    // each other.
    config.notify_channel = Some(format!("{name}_events"));
    config.table_name = name;
    config.schema.mode = SchemaMode::Create;
    config.ordering = ordering;
    config.relay.workers = 1;
    config.relay.batch_size = 50;
    config.relay.poll_interval = Duration::from_millis(20);
    config.relay.publish_timeout = Duration::from_secs(2);
    config.relay.lease_margin = Duration::from_secs(1);
    config.relay.max_attempts = 50;
    config.relay.backoff = BackoffConfig {
        base: Duration::from_millis(20),
        max: Duration::from_millis(100),
    };
    config.relay.stats_interval = Duration::from_millis(100);
    config.relay.shutdown_timeout = Duration::from_secs(10);
    config.retention.enabled = false;
    config
}

/// Event `n` of `aggregate`, with a header naming it.
pub fn event(aggregate: &str, n: usize) -> NewEvent {
    NewEvent::from_json_text(
        "order",
        aggregate,
        "OrderUpdated",
        format!(r#"{{"aggregate":"{aggregate}","n":{n}}}"#),
    )
    .header("x-test", format!("{aggregate}-{n}"))
}

/// Commits `events` in one transaction; returns their ids.
pub(crate) async fn commit<B: OutboxBackend>(
    backend: &B,
    outbox: &B::Outbox,
    events: &[NewEvent],
) -> Vec<Uuid> {
    let mut tx = backend.begin().await;
    let ids = outbox
        .enqueue_all(&mut tx, events)
        .await
        .expect("enqueue in a transaction");
    B::commit(tx).await;
    ids
}

/// A claim of up to 100 rows with a fresh token.
pub(crate) fn request(ordering: Ordering, lease: Duration) -> ClaimRequest {
    ClaimRequest {
        limit: 100,
        lease,
        token: Uuid::now_v7(),
        ordering,
        max_attempts: 50,
    }
}

/// A publisher that keeps every message it confirmed, in order, and refuses the ids it is told
/// to refuse (as a broker rejecting a poison message).
#[derive(Debug, Clone, Default)]
pub struct CollectingPublisher {
    published: Arc<Mutex<Vec<OutboxMessage>>>,
    refused: Arc<Mutex<HashSet<Uuid>>>,
}

impl CollectingPublisher {
    /// Refuses `id` from now on.
    pub fn refuse(&self, id: Uuid) {
        if let Ok(mut refused) = self.refused.lock() {
            refused.insert(id);
        }
    }

    /// Every message confirmed so far, in publish order.
    pub fn published(&self) -> Vec<OutboxMessage> {
        self.published.lock().map(|p| p.clone()).unwrap_or_default()
    }

    /// Waits until at least `count` messages were confirmed (at most 30 s).
    pub async fn wait_for(&self, count: usize) -> Vec<OutboxMessage> {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let published = self.published();
            if published.len() >= count {
                return published;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{} of {count} messages published in time",
                published.len()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Publisher for CollectingPublisher {
    fn destination(&self) -> &str {
        "collecting"
    }

    async fn publish(&self, message: &OutboxMessage) -> Result<Ack, PublishError> {
        let refused = self
            .refused
            .lock()
            .map(|r| r.contains(&message.id))
            .unwrap_or_default();
        if refused {
            // With a NUL, as a broker's text echoing a payload may hold.
            return Err(PublishError::new(
                PublishErrorKind::Rejected,
                "refused \0 by the test",
            ));
        }
        if let Ok(mut published) = self.published.lock() {
            published.push(message.clone());
        }
        Ok(Ack::default())
    }
}
