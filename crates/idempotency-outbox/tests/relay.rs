//! Relay lifecycle: graceful shutdown, the shutdown deadline, polling without LISTEN,
//! retention, and the inbox purge.

#![cfg(feature = "nats")]
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::time::Duration;

use common::nats::TestStream;
use common::*;
use idempotency_outbox::config::{Ordering, WakeUp};
use idempotency_outbox::testing::CollectingPublisher;
use idempotency_outbox::{
    Ack, DeadLetters, LoggingPublisher, NewEvent, OutboxMessage, PublishError, Publisher, Relay,
};
use uuid::Uuid;

/// A slow broker: every publish takes `delay` before reaching the real one.
struct Slow<P> {
    inner: P,
    delay: Duration,
    started: Arc<AtomicU64>,
}

impl<P: Publisher> Publisher for Slow<P> {
    fn destination(&self) -> &str {
        self.inner.destination()
    }

    async fn publish(&self, message: &OutboxMessage) -> Result<Ack, PublishError> {
        self.started.fetch_add(1, AtomicOrdering::SeqCst);
        tokio::time::sleep(self.delay).await;
        self.inner.publish(message).await
    }
}

/// Holds its first `held` publishes until the gate opens; counts the publishes started.
struct Gated<P> {
    inner: P,
    held: u64,
    gate: tokio::sync::watch::Receiver<bool>,
    started: Arc<AtomicU64>,
}

impl<P: Publisher> Publisher for Gated<P> {
    fn destination(&self) -> &str {
        self.inner.destination()
    }

    async fn publish(&self, message: &OutboxMessage) -> Result<Ack, PublishError> {
        if self.started.fetch_add(1, AtomicOrdering::SeqCst) < self.held {
            let mut gate = self.gate.clone();
            gate.wait_for(|open| *open).await.unwrap();
        }
        self.inner.publish(message).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_committed_while_a_full_batch_publishes_goes_out_before_the_next_poll() {
    // Polling, with a poll far away: only a claim after the full batch's publish finds a row
    // committed during it.
    let mut config = config(Ordering::Unordered);
    config.notify_channel = None;
    config.relay.wake_up = WakeUp::Poll;
    config.relay.poll_interval = Duration::from_secs(30);
    config.relay.publish_timeout = Duration::from_secs(10);
    config.relay.workers = 2;
    config.relay.batch_size = 1;
    let (pool, outbox) = outbox(&config).await;
    commit(&pool, &outbox, &[event("first", 1)]).await;
    let (open, gate) = tokio::sync::watch::channel(false);
    let started = Arc::new(AtomicU64::new(0));
    let publisher = Gated {
        inner: CollectingPublisher::default(),
        held: 1,
        gate,
        started: Arc::clone(&started),
    };
    let store = Observed::new(outbox.clone());
    let handle = Relay::new(store.clone(), publisher, &config)
        .unwrap()
        .spawn();
    // One worker claimed the row (a full batch) and publishes it; it claimed again at once,
    // and the other worker, woken by the full batch, claimed too: both found nothing.
    eventually("the batch in flight and three empty claims", || async {
        store.claims.load(AtomicOrdering::SeqCst) == 4 && started.load(AtomicOrdering::SeqCst) == 1
    })
    .await;
    commit(&pool, &outbox, &[event("second", 2)]).await;
    open.send(true).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while published(&pool).await < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the row committed during the publish waits for the poll ({:?})",
            config.relay.poll_interval
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let report = handle.shutdown().await;
    assert!(report.graceful, "{report:?}");
    assert_eq!(report.totals.published, 2);
}

/// Holds the first `held` publishes until `claimed` rows have been claimed (for at most the
/// publish timeout, which fails them); the others go straight to the real broker.
struct HeldUntilClaimed<P> {
    inner: P,
    pool: sqlx::PgPool,
    held: u64,
    claimed: i64,
    calls: AtomicU64,
}

impl<P: Publisher> Publisher for HeldUntilClaimed<P> {
    fn destination(&self) -> &str {
        self.inner.destination()
    }

    async fn publish(&self, message: &OutboxMessage) -> Result<Ack, PublishError> {
        if self.calls.fetch_add(1, AtomicOrdering::SeqCst) < self.held {
            loop {
                let claimed: i64 =
                    sqlx::query_scalar("SELECT count(*) FROM outbox WHERE attempts > 0")
                        .fetch_one(&self.pool)
                        .await
                        .unwrap();
                if claimed >= self.claimed {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        self.inner.publish(message).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_claims_its_next_batch_while_the_full_one_before_it_publishes() {
    // One worker; its first batch's publishes return only once the next batch is claimed:
    // a worker that claimed again only after a batch's acks would time them out.
    let mut config = config(Ordering::Ordered);
    config.notify_channel = None;
    config.relay.workers = 1;
    config.relay.batch_size = 5;
    let (pool, outbox) = outbox(&config).await;
    let stream = TestStream::new().await;
    let events: Vec<NewEvent> = (0..20).map(|n| event(&format!("p{}", n % 10), n)).collect();
    commit(&pool, &outbox, &events).await;
    let publisher = HeldUntilClaimed {
        inner: stream.publisher().await,
        pool: pool.clone(),
        held: 5,
        claimed: 10,
        calls: AtomicU64::new(0),
    };
    let relay = Relay::new(outbox.clone(), publisher, &config).unwrap();
    let handle = relay.spawn();
    eventually("every event published", || async {
        published(&pool).await == 20
    })
    .await;
    let report = handle.shutdown().await;
    assert!(report.graceful, "{report:?}");
    assert_eq!(report.totals.failed, 0, "no publish timed out: {report:?}");
    assert_eq!(report.totals.published, 20);
    let again = scalar_i64(&pool, "SELECT count(*) FROM outbox WHERE attempts > 1").await;
    assert_eq!(again, 0, "no row claimed twice");
    // Aggregate order held with two batches in flight: each aggregate's events reached the
    // stream in the order they were committed.
    let mut last = std::collections::HashMap::new();
    for message in stream.read(20).await {
        let payload = payload_of(&message.payload);
        let aggregate = payload["aggregate"].as_str().unwrap().to_owned();
        let n = payload["n"].as_u64().unwrap();
        let previous = last.insert(aggregate.clone(), n);
        assert!(
            previous.is_none_or(|p| p < n),
            "{aggregate} published out of order"
        );
    }
    stream.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_claiming_and_finishes_the_batches_in_flight() {
    let mut config = config(Ordering::Unordered);
    config.relay.workers = 1;
    config.relay.batch_size = 5;
    let (pool, outbox) = outbox(&config).await;
    let stream = TestStream::new().await;
    let events: Vec<NewEvent> = (0..20).map(|n| event(&format!("s{n}"), n)).collect();
    commit(&pool, &outbox, &events).await;
    let started = Arc::new(AtomicU64::new(0));
    let (open, gate) = tokio::sync::watch::channel(false);
    let held = Gated {
        inner: stream.publisher().await,
        held: 10,
        gate,
        started: Arc::clone(&started),
    };
    config.relay.publish_timeout = Duration::from_secs(10);
    let handle = Relay::new(outbox.clone(), held, &config).unwrap().spawn();
    // The worker claimed its second batch while the first (full) one publishes, and waits
    // for one of the two before it claims again: both are held.
    eventually("two batches in flight", || async {
        started.load(AtomicOrdering::SeqCst) == 10
    })
    .await;
    // The stop is asked in the first poll of the shutdown, before the publishes go on.
    let (report, ()) = tokio::join!(handle.shutdown(), async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        open.send(true).unwrap();
    });
    assert!(report.graceful, "{report:?}");
    assert_eq!(
        report.totals.published, 10,
        "the batches in flight were finished"
    );
    assert_eq!(published(&pool).await, 10, "and marked");
    let untouched = scalar_i64(&pool, "SELECT count(*) FROM outbox WHERE attempts = 0").await;
    assert_eq!(untouched, 10, "nothing claimed after the stop");
    assert_eq!(stream.count().await, 10);
    stream.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shutdown_deadline_aborts_a_stuck_worker_and_its_rows_return_after_the_lease() {
    let mut config = config(Ordering::Ordered);
    config.relay.workers = 1;
    let (pool, outbox) = outbox(&config).await;
    let stream = TestStream::new().await;
    commit(&pool, &outbox, &[event("stuck", 1)]).await;
    let acked = Arc::new(AtomicU64::new(0));
    let stuck = HangAfterAck {
        inner: stream.publisher().await,
        hang: Box::new(|_| true),
        acked: Arc::clone(&acked),
    };
    let mut slow_config = config.clone();
    slow_config.relay.publish_timeout = Duration::from_secs(60);
    let handle = Relay::new(outbox.clone(), stuck, &slow_config)
        .unwrap()
        .spawn();
    eventually("acked", || async {
        acked.load(AtomicOrdering::SeqCst) == 1
    })
    .await;
    let started = std::time::Instant::now();
    let report = handle.shutdown_within(Duration::from_millis(300)).await;
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(!report.graceful);
    assert_eq!(report.aborted, 1);
    assert_eq!(pending(&pool).await, 1);

    // Its lease is 60 s + 1 s: another relay cannot take it yet...
    let other = Relay::new(outbox.clone(), stream.publisher().await, &config).unwrap();
    assert_eq!(other.run_batch().await.unwrap().claimed, 0);
    // ...until the lease ends (simulated by moving it into the past).
    sqlx::query("UPDATE outbox SET next_attempt_at = now() - interval '1 second'")
        .execute(&pool)
        .await
        .unwrap();
    let batch = other.run_batch().await.unwrap();
    assert_eq!(
        (batch.claimed, batch.published, batch.duplicates),
        (1, 1, 1)
    );
    assert_eq!(published(&pool).await, 1);
    stream.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_alone_delivers_without_listen_or_notify() {
    let mut config = config(Ordering::Ordered);
    config.notify_channel = None; // no NOTIFY sent
    config.relay.wake_up = WakeUp::Poll; // and no LISTEN (pgbouncer transaction mode)
    config.relay.poll_interval = Duration::from_millis(100);
    let (pool, outbox) = outbox(&config).await;
    let stream = TestStream::new().await;
    let handle = Relay::new(outbox.clone(), stream.publisher().await, &config)
        .unwrap()
        .spawn();
    for n in 0..3 {
        commit(&pool, &outbox, &[event("polled", n)]).await;
    }
    eventually("polled and published", || async {
        published(&pool).await == 3
    })
    .await;
    handle.shutdown().await;
    assert_eq!(stream.count().await, 3);
    stream.delete().await;
}

#[tokio::test]
async fn retention_deletes_old_published_rows_in_batches_and_keeps_dead_letters_longer() {
    let mut config = config(Ordering::Unordered);
    config.retention.published = Duration::from_secs(7 * 86_400);
    config.retention.dead_lettered = Some(Duration::from_secs(30 * 86_400));
    config.retention.batch_size = 3;
    let (pool, outbox) = outbox(&config).await;
    let events: Vec<NewEvent> = (0..15).map(|n| event(&format!("r{n}"), n)).collect();
    commit(&pool, &outbox, &events).await;
    let relay = Relay::new(outbox.clone(), LoggingPublisher::new(), &config).unwrap();
    assert_eq!(relay.run_batch().await.unwrap().published, 15);
    commit(&pool, &outbox, &[event("still-pending", 0)]).await;
    let ids: Vec<Uuid> = events.iter().map(NewEvent::id).collect();
    // 7 published 8 days ago, 3 published now; 5 dead letters of various ages.
    sqlx::query("UPDATE outbox SET published_at = now() - interval '8 days' WHERE id = ANY($1)")
        .bind(&ids[..7])
        .execute(&pool)
        .await
        .unwrap();
    for (id, age) in ids[10..]
        .iter()
        .zip(["40 days", "31 days", "29 days", "1 day", "0 days"])
    {
        sqlx::query(
            "UPDATE outbox SET published_at = NULL, \
             dead_lettered_at = now() - $2::interval WHERE id = $1",
        )
        .bind(id)
        .bind(age)
        .execute(&pool)
        .await
        .unwrap();
    }
    let report = relay.purge().await.unwrap();
    assert_eq!(report.published, 7);
    assert_eq!(report.dead_lettered, 2);
    assert_eq!(
        report.batches,
        3 + 1,
        "7 rows in batches of 3, then 2 dead letters"
    );
    assert_eq!(published(&pool).await, 3);
    assert_eq!(outbox.dead_letters(100).await.unwrap().len(), 3);
    assert_eq!(pending(&pool).await, 1, "pending rows are never deleted");

    // Without a dead-letter retention, dead letters stay.
    config.retention.dead_lettered = None;
    let keep = Relay::new(outbox.clone(), LoggingPublisher::new(), &config).unwrap();
    sqlx::query("UPDATE outbox SET dead_lettered_at = now() - interval '400 days' WHERE dead_lettered_at IS NOT NULL")
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(keep.purge().await.unwrap().dead_lettered, 0);
    assert_eq!(outbox.dead_letters(100).await.unwrap().len(), 3);
}

/// Dropping the handle stops the workers as `shutdown` does, also while every claim finds a
/// full batch (a worker then never waits, so only a check before each claim can see the drop):
/// what is published stops growing, and the backlog stays pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_handle_stops_workers_whose_batches_are_full() {
    let mut config = config(Ordering::Unordered);
    config.relay.batch_size = 10;
    let (pool, outbox) = outbox(&config).await;
    let events: Vec<NewEvent> = (0..3000).map(|n| event(&format!("d{n}"), n)).collect();
    commit(&pool, &outbox, &events).await;
    let started = Arc::new(AtomicU64::new(0));
    let publisher = Slow {
        inner: LoggingPublisher::new(),
        delay: Duration::from_millis(20),
        started: Arc::clone(&started),
    };
    let relay = Relay::new(outbox.clone(), publisher, &config).unwrap();
    let handle = relay.spawn();
    eventually("publishing", || async { published(&pool).await >= 20 }).await;
    drop(handle);
    // The batch in flight at the drop may still be marked.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let settled = started.load(AtomicOrdering::SeqCst);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        started.load(AtomicOrdering::SeqCst),
        settled,
        "no publish started after the drop"
    );
    assert!(pending(&pool).await > 2000, "the backlog stays pending");
}

/// Durations too long for the clock (`Duration::MAX`) are waits without end, not a panic: a
/// shutdown deadline (every worker is waited for), with a retention interval that long (the
/// housekeeping task purges once, then never again; `metrics.rs` shows it goes on).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durations_too_long_for_the_clock_are_waits_without_end() {
    let mut config = config(Ordering::Ordered);
    config.retention.enabled = true;
    config.retention.interval = Duration::MAX;
    let (pool, outbox) = outbox(&config).await;
    commit(&pool, &outbox, &[event("far", 1), event("far", 2)]).await;
    let publisher = CollectingPublisher::default();
    let handle = Relay::new(outbox.clone(), publisher.clone(), &config)
        .unwrap()
        .spawn();
    assert_eq!(publisher.wait_for(2).await.len(), 2);
    eventually("marked", || async { published(&pool).await == 2 }).await;
    // The housekeeping task is still there (its stats refresh), not ended by a panic.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let report = tokio::time::timeout(
        Duration::from_secs(30),
        handle.shutdown_within(Duration::MAX),
    )
    .await
    .expect("the shutdown waited for its workers, which had finished");
    assert!(report.graceful, "{report:?}");
    assert_eq!(report.totals.published, 2);
}
