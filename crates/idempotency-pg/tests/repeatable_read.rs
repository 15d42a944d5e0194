//! Every statement that locks rows with `FOR UPDATE SKIP LOCKED` (the relay's claims, the
//! outbox's retention, the records' cleanup, the inbox's purge) runs under READ COMMITTED
//! whatever `default_transaction_isolation` says: under `repeatable read` a row another session
//! changed after the statement's snapshot would fail it with a serialization error instead of
//! being skipped.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use idempotency_core::ExpiredCleanup;
use idempotency_core::config::SchemaMode;
use idempotency_outbox::NewEvent;
use idempotency_outbox::config::{Ordering, OutboxConfig, PartitioningConfig};
use idempotency_outbox::store::{ClaimRequest, Housekeeping, Inbox, RelayStore};
use idempotency_pg::{PgInbox, PgOutbox, PgStore, TableName};
use sqlx::PgPool;
use uuid::Uuid;

/// A pool whose sessions default to `repeatable read`, as a database or role may set it.
async fn repeatable_read_pool() -> PgPool {
    use sqlx::Executor;
    idempotency_testing::pg_pool_with_options(8, |options| {
        options.after_connect(|conn, _| {
            Box::pin(async move {
                conn.execute("SET default_transaction_isolation = 'repeatable read'")
                    .await?;
                Ok(())
            })
        })
    })
    .await
}

async fn outbox(pool: &PgPool, ordering: Ordering) -> PgOutbox {
    let outbox = PgOutbox::with_options(
        pool.clone(),
        TableName::parse("outbox").unwrap(),
        ordering,
        None,
    );
    outbox.create_schema().await.unwrap();
    outbox
}

/// `n` events of `n` aggregates, committed.
async fn backlog(pool: &PgPool, outbox: &PgOutbox, n: usize) {
    let events: Vec<NewEvent> = (0..n)
        .map(|i| NewEvent::new("order", format!("rr{i}"), "E", &i).unwrap())
        .collect();
    let mut tx = pool.begin().await.unwrap();
    outbox.enqueue_all(&mut tx, &events).await.unwrap();
    tx.commit().await.unwrap();
}

/// Runs `step` on four tasks at once until each finds nothing; the total it returned.
async fn four_at_once<F, Fut>(step: F) -> u64
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<u64, String>> + Send,
{
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let step = step.clone();
            tokio::spawn(async move {
                let mut total = 0;
                loop {
                    match step().await? {
                        0 => return Ok::<u64, String>(total),
                        n => total += n,
                    }
                }
            })
        })
        .collect();
    let mut total = 0;
    for task in tasks {
        total += task.await.unwrap().unwrap_or_else(|e| panic!("{e}"));
    }
    total
}

/// Concurrent claims (before: `could not serialize access due to concurrent update`, and the
/// worker waited a poll interval after each).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_claims_do_not_fail() {
    for ordering in [Ordering::Ordered, Ordering::Unordered] {
        let pool = repeatable_read_pool().await;
        let outbox = outbox(&pool, ordering).await;
        backlog(&pool, &outbox, 1000).await;
        let claimed = four_at_once(move || {
            let outbox = outbox.clone();
            async move {
                let request = ClaimRequest {
                    limit: 10,
                    lease: Duration::from_secs(300),
                    token: Uuid::new_v4(),
                    ordering,
                    max_attempts: 10,
                };
                let claimed = outbox.claim(&request).await.map_err(|e| e.to_string())?;
                Ok(claimed.messages.len() as u64)
            }
        })
        .await;
        assert_eq!(claimed, 1000, "{ordering:?}: each row claimed once");
    }
}

/// Concurrent retention passes over published rows, and concurrent cleanups of expired records
/// (before: the same serialization errors; retention and cleanup failed where they met).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_retention_and_cleanup_do_not_fail() {
    let pool = repeatable_read_pool().await;
    let outbox = outbox(&pool, Ordering::Unordered).await;
    backlog(&pool, &outbox, 2000).await;
    sqlx::query("UPDATE outbox SET published_at = clock_timestamp() - interval '1 hour'")
        .execute(&pool)
        .await
        .unwrap();
    let deleted = four_at_once({
        let outbox = outbox.clone();
        move || {
            let outbox = outbox.clone();
            async move {
                outbox
                    .delete_published(Duration::from_secs(60), 20)
                    .await
                    .map_err(|e| e.to_string())
            }
        }
    })
    .await;
    assert_eq!(deleted, 2000, "retention: each row deleted once");

    let store = PgStore::new(pool.clone());
    store.create_schema().await.unwrap();
    sqlx::query(
        "INSERT INTO idempotency_records (operation, scope, idempotency_key, request_hash, \
             status, result_payload, created_at, completed_at, expires_at) \
         SELECT 'OP', '', 'k-' || i, 'h', 'COMPLETED', '1', now(), now(), \
                now() - interval '1 day' FROM generate_series(1, 2000) AS i",
    )
    .execute(&pool)
    .await
    .unwrap();
    let cleaned = four_at_once(move || {
        let store = store.clone();
        async move {
            store
                .delete_expired_batch(20)
                .await
                .map_err(|e| e.to_string())
        }
    })
    .await;
    assert_eq!(cleaned, 2000, "cleanup: each record deleted once");
}

/// The rest of the `SKIP LOCKED` batches: dead letters' retention, retention on a partitioned
/// outbox (a transaction per partition), the inbox's purge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_dead_letter_retention_partitioned_retention_and_purge_do_not_fail() {
    let pool = repeatable_read_pool().await;
    let plain = outbox(&pool, Ordering::Unordered).await;
    backlog(&pool, &plain, 2000).await;
    sqlx::query("UPDATE outbox SET dead_lettered_at = clock_timestamp() - interval '1 hour'")
        .execute(&pool)
        .await
        .unwrap();
    let deleted = four_at_once(move || {
        let plain = plain.clone();
        async move {
            plain
                .delete_dead_lettered(Duration::from_secs(60), 20)
                .await
                .map_err(|e| e.to_string())
        }
    })
    .await;
    assert_eq!(deleted, 2000, "dead letters: each deleted once");

    let mut config = OutboxConfig {
        table_name: "outbox_by_day".to_owned(),
        notify_channel: None,
        ordering: Ordering::Unordered,
        ..OutboxConfig::default()
    };
    config.schema.mode = SchemaMode::Create;
    config.partitioning = PartitioningConfig {
        enabled: true,
        interval: Duration::from_secs(86_400),
        ahead: 2,
    };
    let partitioned = PgOutbox::from_config(pool.clone(), &config).await.unwrap();
    backlog(&pool, &partitioned, 2000).await;
    sqlx::query("UPDATE outbox_by_day SET published_at = clock_timestamp() - interval '1 hour'")
        .execute(&pool)
        .await
        .unwrap();
    let deleted = four_at_once(move || {
        let partitioned = partitioned.clone();
        async move {
            partitioned
                .delete_published(Duration::from_secs(60), 20)
                .await
                .map_err(|e| e.to_string())
        }
    })
    .await;
    assert_eq!(deleted, 2000, "partitioned: each deleted once");

    let inbox = PgInbox::with_table(pool.clone(), TableName::parse("inbox").unwrap());
    inbox.create_schema().await.unwrap();
    sqlx::query(
        "INSERT INTO inbox (consumer, message_id, received_at) \
         SELECT 'c', 'm-' || i, clock_timestamp() - interval '1 day' \
         FROM generate_series(1, 2000) AS i",
    )
    .execute(&pool)
    .await
    .unwrap();
    let purged = four_at_once(move || {
        let inbox = inbox.clone();
        async move {
            inbox
                .purge(Duration::from_secs(60), 20)
                .await
                .map_err(|e| e.to_string())
        }
    })
    .await;
    assert_eq!(purged, 2000, "inbox: each id purged once");
}
