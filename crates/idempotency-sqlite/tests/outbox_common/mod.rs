//! Helpers shared by the outbox and inbox tests: a fresh database file with the records store
//! and the outbox, a test configuration with short timings, events, and a recording publisher
//! whose failures a test switches on and off.

#![allow(dead_code, unreachable_pub)] // each test crate uses a part of this module
#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idempotency_core::config::SchemaMode;
use idempotency_outbox::config::{BackoffConfig, Ordering, OutboxConfig};
use idempotency_outbox::{Ack, NewEvent, OutboxMessage, PublishError, PublishErrorKind, Publisher};
use idempotency_sqlite::{SqliteOutbox, SqliteStore};
use sqlx::SqlitePool;

#[path = "../support/mod.rs"]
mod support;

pub(crate) use support::{as_str, create_config, temp_db_path};

/// How long a test waits for the relay before failing.
pub const WAIT: Duration = Duration::from_secs(30);

/// An outbox configuration for tests: schema created, one worker polling every 20 ms, short
/// backoff, retention left to the tests that call it.
pub fn config(ordering: Ordering) -> OutboxConfig {
    let mut config = OutboxConfig::default();
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

/// The records store and the outbox on one fresh database file.
pub async fn fresh(config: &OutboxConfig) -> (SqliteStore, SqliteOutbox) {
    let store = SqliteStore::connect(as_str(&temp_db_path()), &create_config())
        .await
        .unwrap();
    let outbox = SqliteOutbox::from_config(store.pool().clone(), config)
        .await
        .unwrap();
    (store, outbox)
}

/// Event `n` of `aggregate`, with a header naming it.
pub fn event(aggregate: &str, n: usize) -> NewEvent {
    NewEvent::new(
        "order",
        aggregate,
        "OrderUpdated",
        &serde_json::json!({"aggregate": aggregate, "n": n}),
    )
    .unwrap()
    .header("x-test", format!("{aggregate}-{n}"))
}

/// Commits `events` in one `BEGIN IMMEDIATE` transaction.
pub async fn commit(outbox: &SqliteOutbox, events: &[NewEvent]) -> Vec<uuid::Uuid> {
    let mut tx = outbox.pool().begin_with("BEGIN IMMEDIATE").await.unwrap();
    let ids = outbox.enqueue_all(&mut tx, events).await.unwrap();
    tx.commit().await.unwrap();
    ids
}

pub async fn scalar(pool: &SqlitePool, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

pub async fn pending(pool: &SqlitePool) -> i64 {
    scalar(
        pool,
        "SELECT count(*) FROM outbox WHERE published_at IS NULL AND dead_lettered_at IS NULL",
    )
    .await
}

pub async fn published(pool: &SqlitePool) -> i64 {
    scalar(
        pool,
        "SELECT count(*) FROM outbox WHERE published_at IS NOT NULL",
    )
    .await
}

/// Polls `check` until it holds or `WAIT` passes.
pub async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

type FailRule = Arc<dyn Fn(&OutboxMessage) -> bool + Send + Sync>;

/// A publisher that records every confirmed message in order, and fails the messages its
/// rule selects (a broker that refuses them) until the rule is changed.
#[derive(Clone, Default)]
pub struct Recorder {
    published: Arc<Mutex<Vec<OutboxMessage>>>,
    fail: Arc<Mutex<Option<FailRule>>>,
    hang: Arc<Mutex<Option<FailRule>>>,
    failures: Arc<AtomicU64>,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder")
            .field("published", &self.published.lock().unwrap().len())
            .field("failures", &self.failures())
            .finish()
    }
}

impl Recorder {
    /// Fails the messages `rule` selects, from now on.
    pub fn fail_when(&self, rule: impl Fn(&OutboxMessage) -> bool + Send + Sync + 'static) {
        *self.fail.lock().unwrap() = Some(Arc::new(rule));
    }

    /// Records the messages `rule` selects, then never confirms them: a relay that published
    /// and died before marking.
    pub fn hang_when(&self, rule: impl Fn(&OutboxMessage) -> bool + Send + Sync + 'static) {
        *self.hang.lock().unwrap() = Some(Arc::new(rule));
    }

    /// Publishes everything from now on.
    pub fn heal(&self) {
        *self.fail.lock().unwrap() = None;
    }

    /// Every confirmed message, in confirmation order.
    pub fn published(&self) -> Vec<OutboxMessage> {
        self.published.lock().unwrap().clone()
    }

    pub fn count(&self) -> usize {
        self.published.lock().unwrap().len()
    }

    /// Failed attempts so far.
    pub fn failures(&self) -> u64 {
        self.failures.load(AtomicOrdering::SeqCst)
    }
}

impl Publisher for Recorder {
    fn destination(&self) -> &str {
        "recorder"
    }

    async fn publish(&self, message: &OutboxMessage) -> Result<Ack, PublishError> {
        let rule = self.fail.lock().unwrap().clone();
        if rule.is_some_and(|fails| fails(message)) {
            self.failures.fetch_add(1, AtomicOrdering::SeqCst);
            // Refused, not unavailable: an unavailable broker does not count the attempt.
            return Err(PublishError::new(
                PublishErrorKind::Rejected,
                std::io::Error::other(format!("broker refused {}", message.aggregate_id)),
            ));
        }
        self.published.lock().unwrap().push(message.clone());
        let hang = self.hang.lock().unwrap().clone();
        if hang.is_some_and(|hangs| hangs(message)) {
            std::future::pending::<()>().await;
        }
        Ok(Ack::default())
    }
}
