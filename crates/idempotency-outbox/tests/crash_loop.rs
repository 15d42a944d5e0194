//! Messages that never complete: a publish that crashes the process or panics is retried
//! `max-attempts` times and then dead-lettered, without holding up other messages; a worker
//! that panics is restarted and reported.

#![allow(clippy::unwrap_used)]

mod common;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering as AtomicOrdering};
use std::time::Duration;

use common::*;
use idempotency_outbox::config::Ordering;
use idempotency_outbox::{
    Ack, DeadLetters, LoggingPublisher, NewEvent, OutboxMessage, PublishError, Publisher, Relay,
};
use sqlx::PgPool;
use uuid::Uuid;

/// Never returns for the message `doomed`, like a publish that kills the process; publishes
/// the others through the real publisher.
struct HangsOn<P> {
    inner: P,
    doomed: Uuid,
    started: Arc<AtomicU64>,
}

impl<P: Publisher> Publisher for HangsOn<P> {
    fn destination(&self) -> &str {
        self.inner.destination()
    }

    async fn publish(&self, message: &OutboxMessage) -> Result<Ack, PublishError> {
        if message.id == self.doomed {
            self.started.fetch_add(1, AtomicOrdering::SeqCst);
            std::future::pending::<()>().await;
        }
        self.inner.publish(message).await
    }
}

/// Panics for the message `doomed`; publishes the others through the real publisher.
struct PanicsOn<P> {
    inner: P,
    doomed: Uuid,
}

impl<P: Publisher> Publisher for PanicsOn<P> {
    fn destination(&self) -> &str {
        self.inner.destination()
    }

    async fn publish(&self, message: &OutboxMessage) -> Result<Ack, PublishError> {
        assert!(
            message.id != self.doomed,
            "boom: cannot encode {}",
            message.id
        );
        self.inner.publish(message).await
    }
}

async fn row_state(pool: &PgPool, id: Uuid) -> (i32, bool, bool, Option<String>) {
    sqlx::query_as(
        "SELECT attempts, published_at IS NOT NULL, dead_lettered_at IS NOT NULL, last_error \
         FROM outbox WHERE id = $1",
    )
    .bind(id)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_crashes_the_relay_every_time_is_dead_lettered_after_max_attempts() {
    let mut config = config(Ordering::Ordered);
    config.relay.workers = 1;
    config.relay.max_attempts = 3;
    let (pool, outbox) = outbox(&config).await;
    let doomed = event("crashing", 1);
    let behind = event("crashing", 2);
    commit(&pool, &outbox, &[doomed.clone(), behind.clone()]).await;

    // Five process crashes in the middle of the doomed publish.
    for crash in 1..=5 {
        let started = Arc::new(AtomicU64::new(0));
        let publisher = HangsOn {
            inner: LoggingPublisher::new(),
            doomed: doomed.id(),
            started: Arc::clone(&started),
        };
        let handle = Relay::new(outbox.clone(), publisher, &config)
            .unwrap()
            .spawn();
        eventually("the doomed message claimed or dead-lettered", || async {
            let (_, _, dead, _) = row_state(&pool, doomed.id()).await;
            started.load(AtomicOrdering::SeqCst) == 1 || dead
        })
        .await;
        handle.abort();
        // The lease ends (moved into the past rather than waited for).
        sqlx::query("UPDATE outbox SET next_attempt_at = now() WHERE id = $1")
            .bind(doomed.id())
            .execute(&pool)
            .await
            .unwrap();
        let (attempts, ..) = row_state(&pool, doomed.id()).await;
        assert!(attempts <= 4, "crash {crash}: claimed {attempts} times");
    }

    let (attempts, published, dead, error) = row_state(&pool, doomed.id()).await;
    assert!(dead && !published, "the doomed message is dead-lettered");
    assert_eq!(
        attempts, 4,
        "3 attempts, then the claim that dead-lettered it"
    );
    assert_eq!(error.as_deref(), Some("claimed 3 times without completing"));
    let letters = outbox.dead_letters(10).await.unwrap();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].message.id, doomed.id());

    // The aggregate is no longer blocked: the event behind it is published. A relay aborted
    // after the dead letter may hold it under its lease (claimed, never marked); that lease
    // ends too (moved into the past rather than waited for).
    sqlx::query("UPDATE outbox SET next_attempt_at = now() WHERE id = $1")
        .bind(behind.id())
        .execute(&pool)
        .await
        .unwrap();
    let relay = Relay::new(outbox.clone(), LoggingPublisher::new(), &config).unwrap();
    relay.run_batch().await.unwrap();
    let (_, published, ..) = row_state(&pool, behind.id()).await;
    assert!(published, "the next event of the aggregate is published");
}

/// Panics for the message `doomed` before it even returns its future (a `fn publish` doing work
/// before its `async` part); publishes the others through the real publisher.
struct PanicsBeforeItsFuture<P> {
    inner: P,
    doomed: Uuid,
}

impl<P: Publisher> Publisher for PanicsBeforeItsFuture<P> {
    fn destination(&self) -> &str {
        self.inner.destination()
    }

    fn publish(
        &self,
        message: &OutboxMessage,
    ) -> impl Future<Output = Result<Ack, PublishError>> + Send {
        assert!(
            message.id != self.doomed,
            "boom: cannot encode {}",
            message.id
        );
        self.inner.publish(message)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publisher_panic_is_a_failed_attempt_and_the_other_messages_still_publish() {
    a_panic_is_a_failed_attempt(|doomed| PanicsOn {
        inner: LoggingPublisher::new(),
        doomed,
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publisher_panicking_before_its_future_is_a_failed_attempt_too() {
    a_panic_is_a_failed_attempt(|doomed| PanicsBeforeItsFuture {
        inner: LoggingPublisher::new(),
        doomed,
    })
    .await;
}

async fn a_panic_is_a_failed_attempt<P: Publisher>(publisher: impl FnOnce(Uuid) -> P) {
    let mut config = config(Ordering::Ordered);
    config.relay.max_attempts = 3;
    let (pool, outbox) = outbox(&config).await;
    let doomed = event("panicking", 1);
    let others: Vec<NewEvent> = (0..6)
        .map(|n| event(&format!("fine-{}", n % 3), n))
        .collect();
    commit(&pool, &outbox, std::slice::from_ref(&doomed)).await;
    commit(&pool, &outbox, &others).await;
    let handle = Relay::new(outbox.clone(), publisher(doomed.id()), &config)
        .unwrap()
        .spawn();
    eventually("the others published", || async {
        published(&pool).await == 6
    })
    .await;
    eventually("the panicking message dead-lettered", || async {
        row_state(&pool, doomed.id()).await.2
    })
    .await;
    let (attempts, published, _, error) = row_state(&pool, doomed.id()).await;
    assert!(!published);
    assert_eq!(attempts, 3);
    let error = error.unwrap();
    assert!(
        error.starts_with("publisher panicked: boom: cannot encode"),
        "{error}"
    );
    let report = handle.shutdown().await;
    assert!(report.graceful, "a caught publish panic stops no worker");
    assert_eq!(report.totals.published, 6);
    assert_eq!(report.totals.failed, 3);
    assert_eq!(report.totals.dead_lettered, 1);
}

/// The real outbox, except that the first claim panics (a bug in a store or a dependency).
#[derive(Clone)]
struct FirstClaimPanics {
    inner: idempotency_pg::PgOutbox,
    armed: Arc<AtomicBool>,
}

impl idempotency_outbox::store::RelayStore for FirstClaimPanics {
    type Listener = <idempotency_pg::PgOutbox as idempotency_outbox::store::RelayStore>::Listener;

    async fn claim(
        &self,
        request: &idempotency_outbox::store::ClaimRequest,
    ) -> Result<idempotency_outbox::store::Claimed, idempotency_outbox::Error> {
        assert!(!self.armed.swap(false, AtomicOrdering::SeqCst), "claim bug");
        self.inner.claim(request).await
    }

    async fn mark_published(
        &self,
        token: Uuid,
        ids: &[Uuid],
    ) -> Result<u64, idempotency_outbox::Error> {
        self.inner.mark_published(token, ids).await
    }

    async fn mark_failed(
        &self,
        token: Uuid,
        failures: &[idempotency_outbox::store::Failure],
    ) -> Result<u64, idempotency_outbox::Error> {
        self.inner.mark_failed(token, failures).await
    }

    async fn listen(&self) -> Result<Option<Self::Listener>, idempotency_outbox::Error> {
        self.inner.listen().await
    }
}

impl idempotency_outbox::store::Housekeeping for FirstClaimPanics {
    async fn stats(
        &self,
    ) -> Result<idempotency_outbox::store::OutboxStats, idempotency_outbox::Error> {
        self.inner.stats().await
    }

    async fn delete_published(
        &self,
        older_than: Duration,
        limit: u32,
    ) -> Result<u64, idempotency_outbox::Error> {
        self.inner.delete_published(older_than, limit).await
    }

    async fn delete_dead_lettered(
        &self,
        older_than: Duration,
        limit: u32,
    ) -> Result<u64, idempotency_outbox::Error> {
        self.inner.delete_dead_lettered(older_than, limit).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicked_worker_is_restarted_and_reported_by_health_and_shutdown() {
    let mut config = config(Ordering::Unordered);
    config.relay.workers = 1;
    let (pool, outbox) = outbox(&config).await;
    let store = FirstClaimPanics {
        inner: outbox.clone(),
        armed: Arc::new(AtomicBool::new(true)),
    };
    let handle = Relay::new(store, LoggingPublisher::new(), &config)
        .unwrap()
        .spawn();
    let monitor = handle.monitor();
    eventually("the panic seen by health", || async {
        monitor.health().worker_panics == 1
    })
    .await;
    commit(&pool, &outbox, &[event("after-the-panic", 1)]).await;
    eventually("published by the restarted worker", || async {
        published(&pool).await == 1
    })
    .await;
    let health = handle.health();
    assert_eq!((health.workers, health.running), (1, 1), "restarted");
    assert!(health.all_running());
    assert_eq!(health.worker_panics, 1);
    let report = handle.shutdown().await;
    assert!(!report.graceful, "a worker panicked: {report:?}");
    assert_eq!(report.worker_panics, 1);
    assert_eq!(report.totals.published, 1);
    assert_eq!(monitor.health().running, 0, "stopped");
}
