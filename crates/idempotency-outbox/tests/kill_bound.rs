//! How many rows a relay killed mid-drain leaves to be claimed again (and, of those, sent
//! twice): the bound RELIABILITY.md states, reached.
//!
//! A worker claims its next batch while a full batch publishes and is marked (the pipeline in
//! `relay/worker.rs`), so at a kill each worker can hold two leased batches: the one it
//! publishes and the one before it, published and not yet marked. The bound is
//! 2 × workers × batch, not workers × batch.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::time::Duration;

use common::*;
use idempotency_outbox::config::Ordering;
use idempotency_outbox::store::{
    ClaimRequest, Claimed, Failure, Housekeeping, OutboxStats, RelayStore,
};
use idempotency_outbox::testing::CollectingPublisher;
use idempotency_outbox::{Ack, Error, OutboxMessage, PublishError, Publisher, Relay};
use idempotency_pg::{PgNotificationListener, PgOutbox};
use uuid::Uuid;

/// The outbox, with every `mark_published` stuck (as a mark waiting for a pooled connection
/// under load): the batches stay leased to the relay that published them.
#[derive(Clone)]
struct MarksStuck {
    inner: PgOutbox,
    marks: Arc<AtomicU64>,
}

impl RelayStore for MarksStuck {
    type Listener = PgNotificationListener;

    async fn claim(&self, request: &ClaimRequest) -> Result<Claimed, Error> {
        self.inner.claim(request).await
    }

    async fn mark_published(&self, _token: Uuid, _ids: &[Uuid]) -> Result<u64, Error> {
        self.marks.fetch_add(1, AtomicOrdering::SeqCst);
        std::future::pending().await
    }

    async fn mark_failed(&self, token: Uuid, failures: &[Failure]) -> Result<u64, Error> {
        self.inner.mark_failed(token, failures).await
    }

    async fn listen(&self) -> Result<Option<PgNotificationListener>, Error> {
        self.inner.listen().await
    }
}

impl Housekeeping for MarksStuck {
    async fn stats(&self) -> Result<OutboxStats, Error> {
        self.inner.stats().await
    }

    async fn delete_published(&self, older_than: Duration, limit: u32) -> Result<u64, Error> {
        self.inner.delete_published(older_than, limit).await
    }

    async fn delete_dead_lettered(&self, older_than: Duration, limit: u32) -> Result<u64, Error> {
        self.inner.delete_dead_lettered(older_than, limit).await
    }
}

/// Confirms the first `confirm` messages, then never returns (the publishes in flight at the
/// kill).
struct ConfirmsThenHangs {
    inner: CollectingPublisher,
    confirm: u64,
    calls: Arc<AtomicU64>,
}

impl Publisher for ConfirmsThenHangs {
    fn destination(&self) -> &str {
        self.inner.destination()
    }

    async fn publish(&self, message: &OutboxMessage) -> Result<Ack, PublishError> {
        if self.calls.fetch_add(1, AtomicOrdering::SeqCst) >= self.confirm {
            std::future::pending::<()>().await;
        }
        self.inner.publish(message).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_relay_leaves_at_most_two_batches_per_worker_to_be_claimed_again() {
    // One worker: with two, which worker claims which batch is a race (a worker can claim its
    // second batch before the other claims its first); each worker runs the same loop.
    const WORKERS: u64 = 1;
    const BATCH: u64 = 10;
    let mut config = config(Ordering::Unordered);
    config.notify_channel = None;
    config.relay.workers = WORKERS as usize;
    config.relay.batch_size = BATCH as u32;
    config.relay.publish_timeout = Duration::from_secs(60);
    let (pool, outbox) = outbox(&config).await;
    let events: Vec<_> = (0..3 * WORKERS * BATCH)
        .map(|n| event(&format!("a{n}"), 0))
        .collect();
    commit(&pool, &outbox, &events).await;

    // The worker claims a full batch and, while it publishes (confirmed) and its mark hangs,
    // claims and publishes the next one: then the relay dies.
    let store = MarksStuck {
        inner: outbox.clone(),
        marks: Arc::new(AtomicU64::new(0)),
    };
    let first = CollectingPublisher::default();
    let calls = Arc::new(AtomicU64::new(0));
    let publisher = ConfirmsThenHangs {
        inner: first.clone(),
        confirm: WORKERS * BATCH,
        calls: Arc::clone(&calls),
    };
    let handle = Relay::new(store.clone(), publisher, &config)
        .unwrap()
        .spawn();
    eventually("two batches in flight per worker", || async {
        store.marks.load(AtomicOrdering::SeqCst) == WORKERS
            && calls.load(AtomicOrdering::SeqCst) == 2 * WORKERS * BATCH
    })
    .await;
    handle.abort();
    let leased = scalar_i64(
        &pool,
        "SELECT count(*) FROM outbox WHERE claim_token IS NOT NULL AND published_at IS NULL",
    )
    .await;

    // Another relay takes them over once their lease ends (moved into the past here).
    sqlx::query("UPDATE outbox SET next_attempt_at = now() - interval '1 second'")
        .execute(&pool)
        .await
        .unwrap();
    let second = CollectingPublisher::default();
    let other = Relay::new(outbox.clone(), second.clone(), &config).unwrap();
    while pending(&pool).await > 0 {
        other.run_batch().await.unwrap();
    }
    let claimed_twice = scalar_i64(&pool, "SELECT count(*) FROM outbox WHERE attempts > 1").await;
    let sent_twice = second
        .published()
        .iter()
        .filter(|m| first.published().iter().any(|f| f.id == m.id))
        .count() as u64;

    let bound = 2 * WORKERS * BATCH;
    assert_eq!(
        leased as u64, bound,
        "two batches per worker were leased at the kill"
    );
    assert_eq!(
        claimed_twice as u64, bound,
        "all of them claimed again, no other row"
    );
    assert!(
        claimed_twice as u64 > WORKERS * BATCH,
        "workers × batch is not the bound"
    );
    assert_eq!(
        sent_twice,
        WORKERS * BATCH,
        "the confirmed, unmarked batches were sent again"
    );
    assert_eq!(published(&pool).await as u64, 3 * WORKERS * BATCH);
}
