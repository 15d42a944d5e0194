//! The PostgreSQL outbox's enqueue, beyond the conformance suite: `NOTIFY` at commit only,
//! the per-aggregate counter row serializing writers without holding other aggregates or
//! leaving gaps, and enqueue inside the idempotency service's transaction.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use idempotency_core::config::SchemaMode;
use idempotency_core::{Call, ExecutionResult, IdempotencyKey};
use idempotency_outbox::config::{Ordering, OutboxConfig};
use idempotency_outbox::{Enqueue, Error, NewEvent};
use idempotency_pg::{PgIdempotencyService, PgOutbox, PgStore, PgTx};
use sqlx::PgPool;
use sqlx::postgres::PgListener;

const WAIT: Duration = Duration::from_secs(30);

/// An ordered outbox config with a notification channel of its own.
fn config(ordering: Ordering) -> OutboxConfig {
    let mut config = OutboxConfig::default();
    config.schema.mode = SchemaMode::Create;
    config.ordering = ordering;
    config.notify_channel = Some(idempotency_testing::unique_name("ch"));
    config
}

/// A fresh schema with the outbox created.
async fn outbox(config: &OutboxConfig) -> (PgPool, PgOutbox) {
    let pool = idempotency_testing::pg_pool().await;
    let outbox = PgOutbox::from_config(pool.clone(), config).await.unwrap();
    (pool, outbox)
}

fn event(aggregate: &str, n: usize) -> NewEvent {
    NewEvent::new("order", aggregate, "OrderUpdated", &n).unwrap()
}

async fn commit(pool: &PgPool, outbox: &PgOutbox, events: &[NewEvent]) {
    let mut tx = pool.begin().await.unwrap();
    outbox.enqueue_all(&mut tx, events).await.unwrap();
    tx.commit().await.unwrap();
}

async fn scalar_i64(pool: &PgPool, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

/// An application error, as a service would define it.
#[derive(Debug, thiserror::Error)]
enum AppError {
    #[error(transparent)]
    Idempotency(#[from] idempotency_core::Error),
    #[error(transparent)]
    Outbox(#[from] Error),
}

async fn sequences(pool: &PgPool, aggregate: &str) -> Vec<(uuid::Uuid, i64)> {
    sqlx::query_as("SELECT id, sequence FROM outbox WHERE aggregate_id = $1 ORDER BY sequence")
        .bind(aggregate)
        .fetch_all(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn rollback_removes_events_and_commit_keeps_them_with_notify_at_commit() {
    let config = config(Ordering::Ordered);
    let (pool, outbox) = outbox(&config).await;
    let mut listener = PgListener::connect_with(&pool).await.unwrap();
    listener
        .listen(config.notify_channel.as_deref().unwrap())
        .await
        .unwrap();

    let mut tx = pool.begin().await.unwrap();
    outbox.enqueue(&mut tx, &event("a", 1)).await.unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(scalar_i64(&pool, "SELECT count(*) FROM outbox").await, 0);
    let nothing = tokio::time::timeout(Duration::from_millis(300), listener.recv()).await;
    assert!(
        nothing.is_err(),
        "a rolled-back enqueue notified: {nothing:?}"
    );

    let mut tx = pool.begin().await.unwrap();
    let ids = outbox
        .enqueue_all(&mut tx, &[event("a", 1), event("a", 2), event("b", 1)])
        .await
        .unwrap();
    let early = tokio::time::timeout(Duration::from_millis(300), listener.recv()).await;
    assert!(early.is_err(), "notified before commit");
    tx.commit().await.unwrap();
    let notification = tokio::time::timeout(WAIT, listener.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        notification.channel(),
        config.notify_channel.as_deref().unwrap()
    );
    let seq_a: Vec<i64> = sequences(&pool, "a").await.iter().map(|r| r.1).collect();
    assert_eq!(seq_a, [1, 2]);
    assert_eq!(sequences(&pool, "b").await, [(ids[2], 1)]);
    let pending: (i32, bool) = sqlx::query_as(
        "SELECT attempts, published_at IS NULL AND dead_lettered_at IS NULL FROM outbox LIMIT 1",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(pending, (0, true));
}

/// The notifications `listener` receives until none arrives for 300 ms.
async fn notifications(listener: &mut PgListener) -> usize {
    let mut n = 0;
    while let Ok(next) = tokio::time::timeout(Duration::from_millis(300), listener.recv()).await {
        next.unwrap();
        n += 1;
    }
    n
}

/// `notify-interval`: within the window only the first enqueue notifies, through the outbox
/// and its clones; a failed notifying enqueue leaves the next one to notify; after the window
/// an enqueue notifies again; `0s` notifies every commit. Every row is committed either way.
#[tokio::test]
async fn enqueues_within_the_notify_interval_send_one_notification() {
    // Wide enough that six commits fit in it even behind a slow fsync.
    const WINDOW: Duration = Duration::from_secs(5);
    let mut config = config(Ordering::Ordered);
    config.notify_interval = WINDOW;
    let (pool, outbox) = outbox(&config).await;
    let channel = config.notify_channel.clone().unwrap();
    let mut listener = PgListener::connect_with(&pool).await.unwrap();
    listener.listen(&channel).await.unwrap();
    assert_eq!(outbox.notify_interval(), WINDOW);

    let window = std::time::Instant::now();
    let clone = outbox.clone();
    for n in 0..3 {
        commit(&pool, &outbox, &[event("a", n)]).await;
        commit(&pool, &clone, &[event("b", n)]).await;
    }
    let inside = window.elapsed();
    assert!(inside < WINDOW, "{inside:?}");
    assert_eq!(
        notifications(&mut listener).await,
        1,
        "6 commits in one window"
    );
    assert_eq!(scalar_i64(&pool, "SELECT count(*) FROM outbox").await, 6);

    // A new window: its notifying enqueue fails (its transaction is already aborted), so the
    // next one notifies.
    tokio::time::sleep((WINDOW + Duration::from_millis(100)).saturating_sub(window.elapsed()))
        .await;
    let mut aborted = pool.begin().await.unwrap();
    assert!(
        sqlx::query("SELECT 1 / 0")
            .execute(&mut *aborted)
            .await
            .is_err()
    );
    let failed = outbox.enqueue(&mut aborted, &event("c", 0)).await;
    assert!(
        failed.is_err(),
        "an aborted transaction refuses the enqueue"
    );
    aborted.rollback().await.unwrap();
    commit(&pool, &outbox, &[event("c", 1)]).await;
    assert_eq!(
        notifications(&mut listener).await,
        1,
        "the enqueue after the failed one"
    );

    let every = outbox.clone().with_notify_interval(Duration::ZERO);
    for n in 0..3 {
        commit(&pool, &every, &[event("d", n)]).await;
    }
    assert_eq!(notifications(&mut listener).await, 3, "0s: one per commit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_writer_of_an_aggregate_waits_and_numbers_after_the_first_commit() {
    let config = config(Ordering::Ordered);
    let (pool, outbox) = outbox(&config).await;
    commit(&pool, &outbox, &[event("acc", 0)]).await;

    // T1 enqueues and stays open; T2 (started later) must wait for T1 at its enqueue.
    let mut t1 = pool.begin().await.unwrap();
    let first = event("acc", 1);
    outbox.enqueue(&mut t1, &first).await.unwrap();
    let (pool2, outbox2) = (pool.clone(), outbox.clone());
    let second = event("acc", 2);
    let second_id = second.id();
    let t2 = tokio::spawn(async move {
        let mut t2 = pool2.begin().await.unwrap();
        outbox2.enqueue(&mut t2, &second).await.unwrap();
        t2.commit().await.unwrap();
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(!t2.is_finished(), "T2 did not wait for T1's counter lock");
    // Another aggregate is not held up.
    commit(&pool, &outbox, &[event("other", 1)]).await;
    t1.commit().await.unwrap();
    t2.await.unwrap();
    let got = sequences(&pool, "acc").await;
    assert_eq!(got[1], (first.id(), 2));
    assert_eq!(got[2], (second_id, 3));

    // A rolled-back writer leaves no gap.
    let mut t3 = pool.begin().await.unwrap();
    outbox.enqueue(&mut t3, &event("acc", 3)).await.unwrap();
    t3.rollback().await.unwrap();
    commit(&pool, &outbox, &[event("acc", 4)]).await;
    let seq: Vec<i64> = sequences(&pool, "acc").await.iter().map(|r| r.1).collect();
    assert_eq!(seq, [1, 2, 3, 4]);
}

#[tokio::test]
async fn enqueue_joins_the_idempotency_transaction() {
    let config = config(Ordering::Ordered);
    let (pool, outbox) = outbox(&config).await;
    let store = PgStore::new(pool.clone());
    store.create_schema().await.unwrap();
    let service: PgIdempotencyService = PgIdempotencyService::new(store.clone());

    // Through execute's connection: record, business row and event commit together.
    let key = IdempotencyKey::new("k-1").unwrap();
    let (o1, event1) = (outbox.clone(), event("charge-1", 1));
    let id = event1.id();
    let outcome = service
        .execute(Call::new("CHARGE", key.clone(), &1), async move |conn| {
            o1.enqueue(conn, &event1).await?;
            Ok::<_, AppError>(ExecutionResult::success(1))
        })
        .await
        .unwrap();
    assert!(outcome.is_executed());
    let replay = service
        .execute(Call::new("CHARGE", key, &1), async |_conn| {
            Ok::<_, AppError>(ExecutionResult::success(2))
        })
        .await
        .unwrap();
    assert!(replay.is_replayed());
    assert_eq!(
        sequences(&pool, "charge-1").await,
        [(id, 1)],
        "enqueued once"
    );

    // Through a PgTx (derefs to PgConnection), also via the SPI trait; dropped = rolled back.
    let mut tx = PgTx::begin(&store).await.unwrap();
    Enqueue::enqueue_all(&outbox, &mut *tx, &[event("charge-2", 1)])
        .await
        .unwrap();
    outbox
        .enqueue(&mut tx, &event("charge-2", 2))
        .await
        .unwrap();
    drop(tx);
    assert!(sequences(&pool, "charge-2").await.is_empty());
    let mut tx = PgTx::begin(&store).await.unwrap();
    outbox
        .enqueue(&mut tx, &event("charge-2", 3))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(sequences(&pool, "charge-2").await.len(), 1);
}
