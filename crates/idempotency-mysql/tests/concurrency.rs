//! Concurrency and faults on MySQL / MariaDB: 20 duplicates on one key, the REPEATABLE READ
//! snapshot of a caller that read before the key's holder committed, a connection killed in the
//! middle of its transaction, and cleanup that skips rows a request holds.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

mod support;

use std::sync::Arc;
use std::time::Duration;

use idempotency_core::store::{ExpiredCleanup, IdempotencyStore};
use idempotency_core::testing::CountingAction;
use idempotency_core::{Call, Error, ExecutionResult, IdempotencyService, Outcome};
use serde_json::{Value, json};
use support::{AppError, count, fresh_store, hold_key, insert_charge, key, with_charges};
use tokio::sync::Barrier;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_concurrent_duplicates_run_the_action_once() {
    let store = fresh_store().await;
    with_charges(store.pool()).await;
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
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        Ok::<_, AppError>(ExecutionResult::success(id))
                    })
                    .await
            })
        })
        .collect();
    let (mut executed, mut replayed, mut in_flight) = (0, 0, 0);
    let mut values = Vec::new();
    for task in tasks {
        match task.await.unwrap() {
            Ok(outcome) => {
                if outcome.is_executed() {
                    executed += 1;
                } else {
                    replayed += 1;
                }
                values.push(outcome.result().value().copied());
            }
            // 409 with `idempotency-axum`: the duplicate's wait budget ran out.
            Err(AppError::Idempotency(Error::InFlight)) => in_flight += 1,
            Err(other) => panic!("a duplicate failed otherwise: {other:?}"),
        }
    }
    assert_eq!(counter.count(), 1, "the action ran more than once");
    assert_eq!(executed, 1);
    assert_eq!(executed + replayed + in_flight, 20);
    assert!(values.windows(2).all(|w| w[0] == w[1]), "{values:?}");
    assert_eq!(count(store.pool(), "charges").await, 1);
    assert_eq!(count(store.pool(), "idempotency_records").await, 1);
}

/// InnoDB's REPEATABLE READ fixes a transaction's snapshot at its first read. A caller that
/// read before the key's holder committed must still replay the holder's outcome, not loop on
/// a record its snapshot cannot see.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_caller_whose_snapshot_predates_the_holders_commit_replays_it() {
    let store = fresh_store().await;
    let service = IdempotencyService::new(store.clone());
    let k = key("snapshot");
    let (started, release, holder) = hold_key(&service, &k);
    started.await.unwrap();

    let mut tx = service.begin().await.unwrap();
    let before: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM idempotency_records")
        .fetch_one(&mut *tx.connection())
        .await
        .unwrap();
    assert_eq!(before, 0, "the holder's record is not committed yet");
    let late = {
        let (service, k) = (service.clone(), k.clone());
        tokio::spawn(async move {
            let outcome: Result<Outcome<Value>, AppError> = service
                .execute_in(
                    &mut tx,
                    Call::new("OP", k, &json!({"h": 1})),
                    async |_conn| Ok::<_, AppError>(ExecutionResult::success(json!("late"))),
                )
                .await;
            tx.commit().await.unwrap();
            outcome
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !late.is_finished(),
        "the duplicate did not wait for the holder"
    );
    release.send(()).unwrap();
    holder.await.unwrap().unwrap();
    let outcome = late.await.unwrap().unwrap();
    assert!(outcome.is_replayed());
    assert_eq!(outcome.result().value(), Some(&json!("holder")));
}

/// Two transactions whose snapshots predate the holder's commit are both told `Exists` for the
/// key: each one's `find` sees the record (a locking read, as the snapshot cannot), not only
/// the first one's (before: one remembered `Exists` per key, which the first `find` took; the
/// second read its snapshot and answered `None`, an acquire round lost).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_caller_told_exists_finds_the_record_whatever_its_snapshot() {
    use idempotency_core::{Claim, Fingerprint, LockWait, Operation, RecordId, Scope};
    let store = fresh_store().await;
    let service = IdempotencyService::new(store.clone());
    let k = key("two-snapshots");
    let (started, release, holder) = hold_key(&service, &k);
    started.await.unwrap();
    let mut late = Vec::new();
    for _ in 0..2 {
        let mut tx = service.begin().await.unwrap();
        let before: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM idempotency_records")
            .fetch_one(&mut *tx.connection())
            .await
            .unwrap();
        assert_eq!(before, 0, "the holder's record is not committed yet");
        late.push(tx);
    }
    release.send(()).unwrap();
    holder.await.unwrap().unwrap();
    let id = RecordId::new(Operation::new("OP").unwrap(), Scope::default(), k);
    let fingerprint = Fingerprint::new("f".repeat(64));
    let claim = Claim {
        id: &id,
        fingerprint: &fingerprint,
        ttl: None,
        wait: LockWait::Unbounded,
    };
    for tx in &mut late {
        let acquired = store.acquire(tx.connection(), &claim).await.unwrap();
        assert_eq!(acquired, idempotency_core::Acquire::Exists);
    }
    for (n, tx) in late.iter_mut().enumerate() {
        let found = store.find(tx.connection(), &id).await.unwrap();
        assert!(found.is_some(), "transaction {n} told Exists found nothing");
    }
    for tx in late {
        tx.rollback().await.unwrap();
    }
}

/// The server kills the request's connection (as an operator's `KILL` or a crash would) after
/// the action wrote: nothing of the transaction stays, and the retry runs from scratch.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_connection_leaves_nothing_and_the_retry_runs_from_scratch() {
    let store = fresh_store().await;
    with_charges(store.pool()).await;
    let service = IdempotencyService::new(store.clone());
    let k = key("killed");
    let request = json!({"orderId": "o-kill"});
    let admin = store.pool().clone();
    let first: Result<Outcome<i64>, AppError> = service
        .execute(Call::new("CHARGE", k.clone(), &request), async |conn| {
            insert_charge(conn, "o-kill").await?;
            let thread: u64 = sqlx::query_scalar("SELECT CONNECTION_ID()")
                .fetch_one(&mut *conn)
                .await?;
            // Only this test's own connection: the shared server keeps running.
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!("KILL CONNECTION {thread}")))
                .execute(&admin)
                .await?;
            let id = insert_charge(conn, "o-kill-2").await?;
            Ok::<_, AppError>(ExecutionResult::success(id))
        })
        .await;
    let error = first.expect_err("the killed connection cannot commit");
    if let AppError::Idempotency(error) = &error {
        assert!(error.is_retryable(), "{error:?}");
    }
    assert_eq!(
        count(store.pool(), "charges").await,
        0,
        "half a transaction stayed"
    );
    assert_eq!(count(store.pool(), "idempotency_records").await, 0);

    let retry: Outcome<i64> = service
        .execute(Call::new("CHARGE", k, &request), async |conn| {
            let id = insert_charge(conn, "o-kill").await?;
            Ok::<_, AppError>(ExecutionResult::success(id))
        })
        .await
        .unwrap();
    assert!(retry.is_executed());
    assert_eq!(count(store.pool(), "charges").await, 1);
}

/// A cleanup batch skips an expired row that a transaction holds (`SKIP LOCKED`) instead of
/// waiting for it, and deletes the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cleanup_skips_rows_a_transaction_holds() {
    let store = fresh_store().await;
    for (i, label) in ["a", "b", "c"].iter().enumerate() {
        sqlx::query(
            "INSERT INTO idempotency_records (operation, scope, idempotency_key, request_hash, \
                 status, result_payload, created_at, completed_at, expires_at) \
             VALUES ('OP', '', ?, 'h', 'COMPLETED', '1', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), \
                     UTC_TIMESTAMP(6) - INTERVAL ? SECOND)",
        )
        .bind(*label)
        .bind(i64::try_from(i).unwrap() + 10)
        .execute(store.pool())
        .await
        .unwrap();
    }
    let mut holder = store.begin().await.unwrap();
    // By primary key: a scan would lock every row it reads.
    sqlx::query(
        "SELECT 1 FROM idempotency_records \
         WHERE operation = 'OP' AND scope = '' AND idempotency_key = 'b' FOR UPDATE",
    )
    .execute(&mut *holder)
    .await
    .unwrap();
    let deleted = tokio::time::timeout(Duration::from_secs(5), store.delete_expired_batch(10))
        .await
        .expect("cleanup waited for a held row")
        .unwrap();
    assert_eq!(deleted, 2);
    holder.rollback().await.unwrap();
    assert_eq!(store.delete_expired_batch(10).await.unwrap(), 1);
}

/// `lookup_before_acquire` with `execute_in` on a one-connection pool: the lookup of a new key
/// must not need a second connection while the transaction holds the only one.
#[tokio::test]
async fn lookup_before_acquire_needs_no_second_connection() {
    let pool = idempotency_testing::mysql_pool_with_options(1, |options| {
        options.acquire_timeout(Duration::from_secs(2))
    })
    .await;
    let store = support::store_on(pool).await;
    let config = idempotency_core::ServiceOptions {
        lookup_before_acquire: true,
        ..idempotency_core::ServiceOptions::default()
    };
    let service = IdempotencyService::builder(store).config(config).build();
    let started = std::time::Instant::now();
    let mut tx = service.begin().await.unwrap();
    let outcome: Outcome<Value> = service
        .execute_in(
            &mut tx,
            Call::new("OP", key("lookup-first"), &json!({"n": 1})),
            async |_conn| Ok::<_, AppError>(ExecutionResult::success(json!("done"))),
        )
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert!(outcome.is_executed());
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "took {:?}",
        started.elapsed()
    );
}

/// A service whose duplicates wait for the holder (at most 10 s) or are rejected at once.
fn service_with(
    store: &idempotency_mysql::MysqlStore,
    wait: bool,
) -> IdempotencyService<idempotency_mysql::MysqlStore> {
    let config = idempotency_core::ServiceOptions {
        in_flight: if wait {
            idempotency_core::InFlightPolicy::Wait {
                timeout: Some(Duration::from_secs(10)),
            }
        } else {
            idempotency_core::InFlightPolicy::Reject
        },
        ..idempotency_core::ServiceOptions::default()
    };
    IdempotencyService::builder(store.clone())
        .config(config)
        .build()
}

/// Two duplicates wait on a holder that then rolls back: one of them takes the key and runs,
/// the other replays its outcome; neither is a deadlock victim (3 trials).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_waiters_on_a_holder_that_rolls_back_run_once_without_a_deadlock() {
    let store = fresh_store().await;
    let service = service_with(&store, true);
    for trial in 0..3 {
        let k = key(&format!("rolled-back-{trial}"));
        let (started_tx, started) = tokio::sync::oneshot::channel();
        let (release, release_rx) = tokio::sync::oneshot::channel::<()>();
        let holder = {
            let (service, k) = (service.clone(), k.clone());
            tokio::spawn(async move {
                service
                    .execute(Call::new("OP", k, &json!({"n": 1})), async |_conn| {
                        let _ = started_tx.send(());
                        let _ = release_rx.await;
                        Err::<ExecutionResult<Value>, _>(AppError::Database(
                            sqlx::Error::RowNotFound,
                        ))
                    })
                    .await
            })
        };
        started.await.unwrap();
        let counter = CountingAction::default();
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let (service, k, counter) = (service.clone(), k.clone(), counter.clone());
                tokio::spawn(async move {
                    service
                        .execute(Call::new("OP", k, &json!({"n": 1})), async |_conn| {
                            counter.hit();
                            Ok::<_, AppError>(ExecutionResult::success(json!("waiter")))
                        })
                        .await
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(300)).await;
        release.send(()).unwrap();
        assert!(holder.await.unwrap().is_err());
        let mut executed = 0;
        for waiter in waiters {
            let outcome: Outcome<Value> = waiter.await.unwrap().unwrap();
            assert_eq!(outcome.result().value(), Some(&json!("waiter")));
            executed += usize::from(outcome.is_executed());
        }
        assert_eq!((executed, counter.count()), (1, 1), "trial {trial}");
    }
}

/// Replays of a committed key take no lock that blocks other replays: with the reject
/// policy, a replay while another replayer's transaction is still open replays too.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replays_of_a_committed_key_do_not_block_each_other() {
    let store = fresh_store().await;
    let service = service_with(&store, false);
    let k = key("replayed");
    let request = json!({"n": 1});
    let call = || Call::new("OP", k.clone(), &request);
    let first: Outcome<Value> = service
        .execute(call(), async |_conn| {
            Ok::<_, AppError>(ExecutionResult::success(json!("first")))
        })
        .await
        .unwrap();
    assert!(first.is_executed());
    let mut open = service.begin().await.unwrap();
    let replay: Outcome<Value> = service
        .execute_in(&mut open, call(), async |_conn| {
            Ok::<_, AppError>(ExecutionResult::success(json!("again")))
        })
        .await
        .unwrap();
    assert!(replay.is_replayed());
    // `open` is still open: another replay must not wait for it.
    let started = std::time::Instant::now();
    let second: Result<Outcome<Value>, AppError> = service
        .execute(call(), async |_conn| {
            Ok::<_, AppError>(ExecutionResult::success(json!("again")))
        })
        .await;
    let second = second.unwrap();
    assert!(second.is_replayed());
    assert_eq!(second.result().value(), Some(&json!("first")));
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    open.commit().await.unwrap();
}

/// The store's own defence: an outcome nested deeper than `idempotency_core::MAX_JSON_DEPTH`
/// handed to `complete` directly (the service refuses it before, with
/// `SerializationError::TooDeep`: the conformance case
/// `outcomes_nested_deeper_than_the_limit_are_refused_before_writing`) is refused before the
/// statement, with `JsonTooDeep` as the source; the transaction stays usable and the record is
/// completed with a shallower outcome.
#[tokio::test]
async fn outcomes_nested_deeper_than_the_limit_are_refused_before_the_statement() {
    use idempotency_core::store::{Acquire, Claim, LockWait};
    use idempotency_core::{Fingerprint, RecordId, Scope, StoreError, StoredOutcome};

    let store = fresh_store().await;
    let nested = |depth: usize| format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    let deepest = idempotency_core::MAX_JSON_DEPTH;
    let id = RecordId::new(
        idempotency_core::testing::op("OP"),
        Scope::default(),
        key("deep"),
    );
    let fingerprint = Fingerprint::new("ab".repeat(32));
    let claim = Claim {
        id: &id,
        fingerprint: &fingerprint,
        ttl: None,
        wait: LockWait::NoWait,
    };
    let mut tx = store.begin().await.unwrap();
    assert_eq!(
        store.acquire(&mut tx, &claim).await.unwrap(),
        Acquire::Acquired
    );
    let refused = store
        .complete(
            &mut tx,
            &id,
            &StoredOutcome::Completed {
                payload: nested(deepest + 1),
            },
            None,
        )
        .await;
    let Err(StoreError::Database(source)) = &refused else {
        panic!("{refused:?}");
    };
    assert_eq!(
        source.downcast_ref::<idempotency_core::JsonTooDeep>(),
        Some(&idempotency_core::JsonTooDeep { depth: deepest + 1 }),
        "{source:?}"
    );
    let stored = store
        .complete(
            &mut tx,
            &id,
            &StoredOutcome::Completed {
                payload: nested(deepest),
            },
            None,
        )
        .await
        .expect("the transaction is still usable and the deepest outcome is stored");
    assert!(stored.is_terminal());
    idempotency_mysql::MysqlStore::commit(tx).await.unwrap();
}

/// A cleanup batch larger than one statement can carry: 22,000 expired keys, three
/// placeholders each, are deleted in statements of 1,000 keys (before: one `DELETE` with
/// 66,000 placeholders, refused by the server, error 1390, every run the same: retention
/// stopped for good once that many had expired).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cleanup_batch_over_the_placeholder_limit_deletes_every_key() {
    let store = fresh_store().await;
    // Numbers 0..22000 from five tables of digits (no recursion, whose limits differ between
    // MySQL and MariaDB).
    sqlx::query(
        "INSERT INTO idempotency_records (operation, scope, idempotency_key, request_hash, \
             status, result_payload, created_at, completed_at, expires_at) \
         WITH d (d) AS (SELECT 0 UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
                        UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 \
                        UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9), \
              n (i) AS (SELECT a.d + 10 * b.d + 100 * c.d + 1000 * e.d + 10000 * f.d \
                        FROM d a, d b, d c, d e, d f) \
         SELECT 'OP', '', CONCAT('k-', i), 'h', 'COMPLETED', '1', UTC_TIMESTAMP(6), \
                UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) - INTERVAL 1 DAY FROM n WHERE i < 22000",
    )
    .execute(store.pool())
    .await
    .unwrap();
    assert_eq!(store.delete_expired_batch(30_000).await.unwrap(), 22_000);
    assert_eq!(count(store.pool(), "idempotency_records").await, 0);
}
