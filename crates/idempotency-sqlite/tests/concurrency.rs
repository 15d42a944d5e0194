//! Concurrency on SQLite: duplicates serialized at `BEGIN IMMEDIATE`, the busy timeout as the
//! wait budget, replays that read without the write lock, a stale deferred transaction, and
//! cleanup without `SKIP LOCKED`.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use idempotency_core::cleanup::purge_expired;
use idempotency_core::store::{Acquire, IdempotencyStore, StoreError};
use idempotency_core::testing::CountingAction;
use idempotency_core::{
    Call, ExecutionResult, Fingerprint, IdempotencyService, Operation, Outcome, RecordId, Scope,
    ServiceOptions, StoredOutcome,
};
use idempotency_sqlite::{SqliteStore, SqliteTx};
use serde_json::{Value, json};
use sqlx::SqliteConnection;
use support::{
    AppError, claim, count, fresh_store, hold_lock, insert_charge, key, store_with_busy_timeout,
    with_charges,
};
use tokio::sync::Barrier;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_concurrent_duplicates_run_the_action_once() {
    let store = fresh_store().await;
    with_charges(&store).await;
    let service = IdempotencyService::new(store.clone());
    let (k, counter, barrier) = (
        key("twenty"),
        CountingAction::default(),
        Arc::new(Barrier::new(20)),
    );
    let request = json!({"orderId": "o-20", "amount": "20.00"});
    let tasks: Vec<_> = (0..20)
        .map(|_| {
            let (service, k, counter, barrier, request) = (
                service.clone(),
                k.clone(),
                counter.clone(),
                Arc::clone(&barrier),
                request.clone(),
            );
            tokio::spawn(async move {
                barrier.wait().await;
                service
                    .execute(Call::new("CHARGE", k, &request), async |conn| {
                        counter.hit();
                        let id = insert_charge(conn, "o-20").await?;
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        Ok::<_, AppError>(ExecutionResult::success(id))
                    })
                    .await
            })
        })
        .collect();
    let mut outcomes: Vec<Outcome<i64>> = Vec::new();
    for task in tasks {
        outcomes.push(task.await.unwrap().unwrap());
    }
    assert_eq!(counter.count(), 1, "the action ran more than once");
    assert_eq!(outcomes.iter().filter(|o| o.is_executed()).count(), 1);
    let first = outcomes[0].result().value().copied();
    assert!(
        outcomes
            .iter()
            .all(|o| o.result().value().copied() == first)
    );
    assert_eq!(count(store.pool(), "charges").await, 1);
    assert_eq!(count(store.pool(), "idempotency_records").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_busy_timeout_bounds_the_wait_at_begin() {
    let service =
        IdempotencyService::new(store_with_busy_timeout(Duration::from_millis(200)).await);
    let k = key("busy");
    let (started, holder) = hold_lock(&service, &k, Duration::from_millis(1500));
    started.await.unwrap();
    let began = Instant::now();
    let late: Result<Outcome<Value>, AppError> = service
        .execute(
            Call::new("OP", k.clone(), &json!({"h": 1})),
            async |_conn| Ok::<_, AppError>(ExecutionResult::success(json!("late"))),
        )
        .await;
    let waited = began.elapsed();
    let Err(AppError::Idempotency(error)) = &late else {
        panic!("expected a lock timeout: {late:?}")
    };
    assert!(
        matches!(
            error,
            idempotency_core::Error::Store(StoreError::LockTimeout(_))
        ),
        "{error:?}"
    );
    assert!(error.is_retryable());
    assert!(
        waited >= Duration::from_millis(150) && waited < Duration::from_millis(1200),
        "waited {waited:?} with a 200 ms busy timeout"
    );
    holder.await.unwrap().unwrap();
    // The retry the error invites replays the holder's outcome.
    let retry: Outcome<Value> = service
        .execute(Call::new("OP", k, &json!({"h": 1})), async |_conn| {
            Ok::<_, AppError>(ExecutionResult::success(json!("late")))
        })
        .await
        .unwrap();
    assert!(retry.is_replayed());
    assert_eq!(retry.result().value(), Some(&json!("holder")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lookup_before_acquire_replays_without_waiting_for_the_writer() {
    let config = ServiceOptions {
        lookup_before_acquire: true,
        ..ServiceOptions::default()
    };
    let service = IdempotencyService::builder(fresh_store().await)
        .config(config)
        .build();
    let done = key("done");
    let request = json!({"d": 1});
    let first: Outcome<Value> = service
        .execute(Call::new("OP", done.clone(), &request), async |_conn| {
            Ok::<_, AppError>(ExecutionResult::success(json!("stored")))
        })
        .await
        .unwrap();
    assert!(first.is_executed());
    // Another request holds the write lock for 2 s; the replay is a WAL read and does not wait.
    let (started, holder) = hold_lock(&service, &key("writer"), Duration::from_secs(2));
    started.await.unwrap();
    let replay: Outcome<Value> = service
        .execute(Call::new("OP", done, &request), async |_conn| {
            Ok::<_, AppError>(ExecutionResult::success(json!("again")))
        })
        .await
        .unwrap();
    assert!(replay.is_replayed());
    assert_eq!(replay.result().value(), Some(&json!("stored")));
    assert!(!holder.is_finished(), "the replay waited for the writer");
    holder.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_deferred_transaction_with_a_stale_snapshot_is_a_retryable_conflict() {
    let store = fresh_store().await;
    let fingerprint = Fingerprint::new("a".repeat(64));
    let id = |k| RecordId::new(Operation::new("OP").unwrap(), Scope::default(), k);
    // A plain (deferred) BEGIN that reads first: its snapshot is fixed at the read.
    let mut stale = store.pool().begin().await.unwrap();
    assert_eq!(count_on(&mut stale).await, 0);
    // Another writer commits meanwhile.
    let mut other = store.begin().await.unwrap();
    let committed = id(key("other"));
    assert_eq!(
        store
            .acquire(&mut other, &claim(&committed, &fingerprint))
            .await
            .unwrap(),
        Acquire::Acquired
    );
    store
        .complete(
            &mut other,
            &committed,
            &StoredOutcome::Completed {
                payload: "1".into(),
            },
            None,
        )
        .await
        .unwrap();
    SqliteStore::commit(other).await.unwrap();
    // The stale transaction cannot write any more: no waiting helps, only a new transaction.
    let mine = id(key("mine"));
    let error = store
        .acquire(&mut stale, &claim(&mine, &fingerprint))
        .await
        .unwrap_err();
    assert!(matches!(error, StoreError::Conflict(_)), "{error:?}");
    assert!(error.is_retryable());
    stale.rollback().await.unwrap();
}

/// A plain (deferred) `BEGIN` that read first cannot become a writer while another connection
/// holds the write lock: SQLite refuses the upgrade at once, without its busy handler. Nothing
/// says the same key is in flight, so it is a retryable `Conflict` that names
/// `BEGIN IMMEDIATE`, not `InFlight` (409).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deferred_transaction_that_read_first_is_a_conflict_not_in_flight() {
    let store = fresh_store().await;
    let service = IdempotencyService::new(store.clone());
    let mut deferred = store.pool().begin().await.unwrap();
    assert_eq!(count_on(&mut deferred).await, 0);
    let holder = store.pool().begin_with("BEGIN IMMEDIATE").await.unwrap();
    let mut tx = SqliteTx::new(deferred);
    let started = Instant::now();
    let result: Result<Outcome<i64>, AppError> = service
        .execute_in(
            &mut tx,
            Call::new("OP", key("deferred"), &1),
            async |_conn| Ok::<_, AppError>(ExecutionResult::success(1)),
        )
        .await;
    let error = result.unwrap_err();
    let AppError::Idempotency(idempotency_core::Error::Store(StoreError::Conflict(source))) =
        &error
    else {
        panic!("expected a store conflict: {error:?}");
    };
    assert!(source.to_string().contains("BEGIN IMMEDIATE"), "{source}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "refused at once"
    );
    tx.rollback().await.unwrap();
    holder.rollback().await.unwrap();
}

async fn count_on(conn: &mut SqliteConnection) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM idempotency_records")
        .fetch_one(conn)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cleanup_waits_for_the_writer_instead_of_skipping_rows() {
    let store = fresh_store().await;
    let service = IdempotencyService::new(store.clone());
    for _ in 0..5 {
        let _: Outcome<i32> = service
            .execute(
                Call::new("OP", key("expired"), &0).ttl(Duration::from_millis(1)),
                async |_conn| Ok::<_, AppError>(ExecutionResult::success(0)),
            )
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    let writer = store.begin().await.unwrap();
    let purge = {
        let store = store.clone();
        tokio::spawn(async move { purge_expired(&store, 2).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !purge.is_finished(),
        "cleanup did not wait for the open writer"
    );
    SqliteStore::rollback(writer).await.unwrap();
    let report = purge.await.unwrap().unwrap();
    assert_eq!((report.deleted, report.batches), (5, 3));
    assert_eq!(count(store.pool(), "idempotency_records").await, 0);
}
