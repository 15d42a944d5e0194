//! Helpers shared by the integration tests: outboxes in isolated schemas, NATS streams,
//! RabbitMQ queues, a TCP proxy that can be cut, and publisher wrappers that inject faults
//! around a real publisher.

#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::time::Duration;

use idempotency_core::config::SchemaMode;
use idempotency_outbox::config::{BackoffConfig, Ordering, OutboxConfig};
use idempotency_outbox::{Ack, NewEvent, OutboxMessage, PublishError, PublishErrorKind, Publisher};
use idempotency_pg::PgOutbox;
use metrics_util::debugging::{DebuggingRecorder, Snapshotter};
use sqlx::PgPool;

pub const WAIT: Duration = Duration::from_secs(30);

/// Runs `body` on a current-thread runtime with a `DebuggingRecorder` as this thread's
/// recorder: the relay's tasks run on this thread and record into it, and tests on other
/// threads record elsewhere.
pub fn with_recorder<T>(body: impl AsyncFnOnce(Snapshotter) -> T) -> T {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(body(snapshotter))
}

/// An outbox config for tests: a channel of its own, short timeouts and backoff.
pub fn config(ordering: Ordering) -> OutboxConfig {
    let mut config = OutboxConfig::default();
    config.schema.mode = SchemaMode::Create;
    config.ordering = ordering;
    config.notify_channel = Some(idempotency_testing::unique_name("ch"));
    config.relay.workers = 2;
    config.relay.batch_size = 50;
    config.relay.poll_interval = Duration::from_millis(200);
    config.relay.publish_timeout = Duration::from_secs(2);
    config.relay.lease_margin = Duration::from_secs(1);
    config.relay.max_attempts = 50;
    config.relay.backoff = BackoffConfig {
        base: Duration::from_millis(50),
        max: Duration::from_millis(300),
    };
    config.relay.stats_interval = Duration::from_millis(100);
    config.relay.shutdown_timeout = Duration::from_secs(10);
    config
}

/// A fresh schema with the outbox created.
pub async fn outbox(config: &OutboxConfig) -> (PgPool, PgOutbox) {
    let pool = idempotency_testing::pg_pool().await;
    let outbox = PgOutbox::from_config(pool.clone(), config).await.unwrap();
    (pool, outbox)
}

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

/// Commits `events` in one transaction.
pub async fn commit(pool: &PgPool, outbox: &PgOutbox, events: &[NewEvent]) {
    let mut tx = pool.begin().await.unwrap();
    outbox.enqueue_all(&mut tx, events).await.unwrap();
    tx.commit().await.unwrap();
}

pub async fn scalar_i64(pool: &PgPool, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

pub async fn pending(pool: &PgPool) -> i64 {
    scalar_i64(
        pool,
        "SELECT count(*) FROM outbox WHERE published_at IS NULL AND dead_lettered_at IS NULL",
    )
    .await
}

pub async fn published(pool: &PgPool) -> i64 {
    scalar_i64(
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
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---------------------------------------------------------------- NATS

#[cfg(feature = "rabbitmq")]
pub mod amqp;
#[cfg(feature = "kafka")]
pub mod kafka;
#[cfg(feature = "nats")]
pub mod nats;
mod observed;
mod proxy;
#[allow(unused_imports)] // used by some test files only
pub use observed::Observed;
#[allow(unused_imports)] // used by some test files only
pub use proxy::{Proxy, host_port, via_port};

// ---------------------------------------------------------------- fault-injecting wrappers

/// Publishes through the real publisher, then never returns for messages `hang` selects:
/// a worker that published and died before marking.
pub struct HangAfterAck<P> {
    pub inner: P,
    pub hang: Box<dyn Fn(&OutboxMessage) -> bool + Send + Sync>,
    pub acked: Arc<AtomicU64>,
}

impl<P: Publisher> Publisher for HangAfterAck<P> {
    fn destination(&self) -> &str {
        self.inner.destination()
    }

    async fn publish(&self, message: &OutboxMessage) -> Result<Ack, PublishError> {
        let ack = self.inner.publish(message).await?;
        self.acked.fetch_add(1, AtomicOrdering::SeqCst);
        if (self.hang)(message) {
            std::future::pending::<()>().await;
        }
        Ok(ack)
    }
}

/// Fails the first attempt of messages `fail` selects before they reach the real publisher
/// (a transient broker error), and records the order of confirmed publishes. First attempts
/// are told by id: a transient failure does not count towards `attempts`.
pub struct FlakyFirstAttempt<P> {
    pub inner: P,
    pub fail: Box<dyn Fn(&OutboxMessage) -> bool + Send + Sync>,
    pub failures: Arc<AtomicU64>,
    pub failed: std::sync::Mutex<std::collections::HashSet<uuid::Uuid>>,
}

impl<P: Publisher> Publisher for FlakyFirstAttempt<P> {
    fn destination(&self) -> &str {
        self.inner.destination()
    }

    async fn publish(&self, message: &OutboxMessage) -> Result<Ack, PublishError> {
        if (self.fail)(message) && self.failed.lock().unwrap().insert(message.id) {
            self.failures.fetch_add(1, AtomicOrdering::SeqCst);
            return Err(PublishError::kind_only(PublishErrorKind::Unavailable));
        }
        self.inner.publish(message).await
    }
}

pub fn payload_of(bytes: &[u8]) -> serde_json::Value {
    serde_json::from_slice(bytes).unwrap()
}

pub fn headers_map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}
