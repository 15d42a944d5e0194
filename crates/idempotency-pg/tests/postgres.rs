//! PostgreSQL-specific behaviour: real business rows next to the record, the lock-timeout
//! round trip, savepoints, cleanup that skips locked rows, and a backend killed mid-transaction.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

use std::sync::Arc;
use std::time::{Duration, Instant};

use idempotency_core::store::{Acquire, Claim, IdempotencyStore, LockWait};
use idempotency_core::{
    Call, Error, ExecutionResult, Fingerprint, IdempotencyKey, IdempotencyService, Operation,
    Outcome, RecordId, Scope, StoreError,
};
use idempotency_pg::{PgStore, PgTx};
use sqlx::{Connection, PgConnection, PgPool};

#[derive(Debug, thiserror::Error)]
enum AppError {
    #[error(transparent)]
    Idempotency(#[from] Error),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
    #[error("boom")]
    Boom,
}

async fn setup() -> (PgPool, IdempotencyService<PgStore>) {
    let pool = idempotency_testing::pg_pool().await;
    let store = PgStore::new(pool.clone());
    store.create_schema().await.unwrap();
    sqlx::raw_sql(
        "CREATE TABLE payments (id bigserial PRIMARY KEY, order_id text NOT NULL UNIQUE, amount numeric(12,2) NOT NULL)",
    )
    .execute(&pool)
    .await
    .unwrap();
    (pool, IdempotencyService::new(store))
}

async fn count(pool: &PgPool, table: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn insert_payment(conn: &mut PgConnection, order: &str) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("INSERT INTO payments (order_id, amount) VALUES ($1, 100.00) RETURNING id")
        .bind(order)
        .fetch_one(conn)
        .await
}

/// The business row and the record commit together, fail together, and a replay adds nothing.
#[tokio::test]
async fn business_row_and_record_are_atomic() {
    let (pool, service) = setup().await;
    let key = IdempotencyKey::new("pay-1").unwrap();
    let request = serde_json::json!({"orderId": "o-1"});

    let failed: Result<Outcome<i64>, AppError> = service
        .execute(
            Call::new("CREATE_PAYMENT", key.clone(), &request),
            async |conn| {
                insert_payment(conn, "o-1").await?;
                Err(AppError::Boom) // a technical failure after the business insert
            },
        )
        .await;
    assert!(matches!(failed, Err(AppError::Boom)));
    assert_eq!(
        count(&pool, "payments").await,
        0,
        "business row rolled back"
    );
    assert_eq!(
        count(&pool, "idempotency_records").await,
        0,
        "record rolled back"
    );

    let mut ids = Vec::new();
    for _ in 0..3 {
        let outcome: Outcome<i64> = service
            .execute(
                Call::new("CREATE_PAYMENT", key.clone(), &request),
                async |conn| {
                    Ok::<_, AppError>(ExecutionResult::success(insert_payment(conn, "o-1").await?))
                },
            )
            .await
            .unwrap();
        ids.push(outcome.into_result().into_result().unwrap());
    }
    assert!(ids.windows(2).all(|w| w[0] == w[1]), "{ids:?}");
    assert_eq!(count(&pool, "payments").await, 1);
    assert_eq!(count(&pool, "idempotency_records").await, 1);
}

/// A transaction the application began itself, wrapped in `PgTx`, carries the record.
#[tokio::test]
async fn wrapping_an_application_transaction() {
    let (pool, service) = setup().await;
    let sqlx_tx = pool.begin().await.unwrap();
    let mut tx = PgTx::new(sqlx_tx);
    insert_payment(&mut tx, "before").await.unwrap();
    let _: Outcome<i64> = service
        .execute_in(
            &mut tx,
            Call::new("OP", IdempotencyKey::new("wrap").unwrap(), &()),
            async |conn| {
                Ok::<_, AppError>(ExecutionResult::success(
                    insert_payment(conn, "inside").await?,
                ))
            },
        )
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(count(&pool, "payments").await, 2);
    assert_eq!(count(&pool, "idempotency_records").await, 1);
}

/// The bounded acquire restores the session's `lock_timeout` for the caller's own statements.
#[tokio::test]
async fn bounded_acquire_restores_lock_timeout() {
    let (_pool, service) = setup().await;
    let store = service.store();
    let mut tx = store.begin().await.unwrap();
    sqlx::query("SET LOCAL lock_timeout = '7s'")
        .execute(&mut *tx)
        .await
        .unwrap();
    let id = RecordId::new(
        Operation::new("OP").unwrap(),
        Scope::default(),
        IdempotencyKey::new("lt").unwrap(),
    );
    let fingerprint = Fingerprint::new("0".repeat(64));
    for _ in 0..2 {
        store
            .acquire(
                &mut tx,
                &Claim {
                    id: &id,
                    fingerprint: &fingerprint,
                    ttl: None,
                    wait: LockWait::Timeout(Duration::from_millis(250)),
                },
            )
            .await
            .unwrap();
        let setting: String = sqlx::query_scalar("SHOW lock_timeout")
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        assert_eq!(setting, "7s");
    }
}

/// A wait budget longer than PostgreSQL's `lock_timeout` range (i32::MAX ms, about 24.8 days)
/// is capped, not refused by the server on every acquire.
#[tokio::test]
async fn a_wait_budget_beyond_the_servers_range_is_capped() {
    let (_pool, service) = setup().await;
    let store = service.store();
    let mut tx = store.begin().await.unwrap();
    let id = RecordId::new(
        Operation::new("OP").unwrap(),
        Scope::default(),
        IdempotencyKey::new("long-wait").unwrap(),
    );
    let fingerprint = Fingerprint::new("0".repeat(64));
    let acquired = store
        .acquire(
            &mut tx,
            &Claim {
                id: &id,
                fingerprint: &fingerprint,
                ttl: None,
                wait: LockWait::Timeout(Duration::from_secs(60 * 60 * 24 * 365)),
            },
        )
        .await
        .unwrap();
    assert!(matches!(acquired, Acquire::Acquired));
}

/// Errors are classified by SQLSTATE, raised here by the real server.
#[tokio::test]
async fn errors_are_classified_by_sqlstate() {
    let (pool, _service) = setup().await;
    fn kind(error: &StoreError) -> &'static str {
        match error {
            StoreError::LockTimeout(_) => "lock-timeout",
            StoreError::Conflict(_) => "conflict",
            StoreError::Unavailable(_) => "unavailable",
            StoreError::Database(_) => "database",
            _ => "other",
        }
    }
    let cases = [
        ("55P03", "lock-timeout"),
        ("40001", "conflict"),
        ("40P01", "conflict"),
        ("08006", "unavailable"),
        ("53300", "unavailable"),
        ("53100", "unavailable"),
        ("57P01", "unavailable"),
        ("23505", "database"),
    ];
    for (code, expected) in cases {
        let raised = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "DO $$ BEGIN RAISE EXCEPTION 'raised by the test' USING ERRCODE = '{code}'; END $$"
        )))
        .execute(&pool)
        .await
        .unwrap_err();
        let classified = idempotency_pg::store_error(raised);
        assert_eq!(kind(&classified), expected, "{code}: {classified:?}");
        assert_eq!(
            classified.is_retryable(),
            !matches!(classified, StoreError::Database(_)),
            "{code}"
        );
    }
}

/// After a failed statement PostgreSQL aborts the transaction; an action that catches a SQL
/// error must run it in a savepoint (`conn.begin()`) for the record to be written.
#[tokio::test]
async fn caught_sql_error_needs_a_savepoint() {
    let (pool, service) = setup().await;
    sqlx::query("INSERT INTO payments (order_id, amount) VALUES ('dup', 1)")
        .execute(&pool)
        .await
        .unwrap();

    let without: Result<Outcome<i64>, AppError> = service
        .execute(
            Call::new("OP", IdempotencyKey::new("no-savepoint").unwrap(), &1),
            async |conn| match insert_payment(conn, "dup").await {
                Ok(id) => Ok(ExecutionResult::success(id)),
                Err(_) => Ok(ExecutionResult::rejected("DUPLICATE_ORDER")),
            },
        )
        .await;
    let Err(AppError::Idempotency(Error::Store(StoreError::Database(_)))) = without else {
        panic!("storing after an aborted statement must fail loudly: {without:?}");
    };

    let with: Outcome<i64> = service
        .execute(
            Call::new("OP", IdempotencyKey::new("savepoint").unwrap(), &1),
            async |conn| {
                let mut savepoint = conn.begin().await?;
                match insert_payment(&mut savepoint, "dup").await {
                    Ok(id) => {
                        savepoint.commit().await?;
                        Ok::<_, AppError>(ExecutionResult::success(id))
                    }
                    Err(_) => Ok(ExecutionResult::rejected("DUPLICATE_ORDER")),
                }
            },
        )
        .await
        .unwrap();
    assert_eq!(
        with.result().rejection().map(|r| r.code()),
        Some("DUPLICATE_ORDER")
    );
    assert_eq!(count(&pool, "idempotency_records").await, 1);
}

/// Cleanup skips rows locked by other transactions instead of waiting for them.
#[tokio::test]
async fn cleanup_skips_locked_rows() {
    let (pool, service) = setup().await;
    let store = service.store().clone();
    let config = idempotency_core::ServiceOptions {
        default_ttl: Some(Duration::from_millis(1)),
        ..Default::default()
    };
    let service = IdempotencyService::builder(store.clone())
        .config(config)
        .build();
    for i in 0..3 {
        let _: Outcome<()> = service
            .execute(
                Call::new("OP", IdempotencyKey::new(format!("c-{i}")).unwrap(), &()),
                async |_c| Ok::<_, Error>(ExecutionResult::success(())),
            )
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    let mut locker = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM idempotency_records WHERE idempotency_key = 'c-0' FOR UPDATE")
        .execute(&mut *locker)
        .await
        .unwrap();
    // Waiting for the lock would wait for ever: `locker` ends only after the cleanup returns.
    let report = tokio::time::timeout(
        Duration::from_secs(30),
        idempotency_core::cleanup::purge_expired(&store, 100),
    )
    .await
    .expect("cleanup waited for a locked row")
    .unwrap();
    assert_eq!(report.deleted, 2);
    locker.rollback().await.unwrap();
    assert_eq!(count(&pool, "idempotency_records").await, 1);
}

/// The backend is killed between the acquire and the commit: no record, no business row; the
/// retry with the same key runs once and succeeds.
#[tokio::test]
async fn backend_killed_mid_transaction_leaves_nothing() {
    let (pool, service) = setup().await;
    let key = IdempotencyKey::new("killed").unwrap();
    let request = serde_json::json!({"orderId": "o-k"});
    let killer = pool.clone();
    let failed: Result<Outcome<i64>, AppError> = service
        .execute(
            Call::new("CREATE_PAYMENT", key.clone(), &request),
            async |conn| {
                let id = insert_payment(conn, "o-k").await?;
                let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
                    .fetch_one(&mut *conn)
                    .await?;
                let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
                    .bind(pid)
                    .fetch_one(&killer)
                    .await?;
                assert!(killed);
                Ok(ExecutionResult::success(id))
            },
        )
        .await;
    let error = failed.expect_err("the commit cannot succeed on a dead backend");
    let AppError::Idempotency(Error::Store(store_error)) = &error else {
        panic!("{error:?}")
    };
    assert!(
        store_error.is_retryable(),
        "a lost connection is retryable: {store_error:?}"
    );
    assert_eq!(count(&pool, "payments").await, 0);
    assert_eq!(count(&pool, "idempotency_records").await, 0);

    let runs = std::sync::atomic::AtomicUsize::new(0);
    for _ in 0..2 {
        let _: Outcome<i64> = service
            .execute(
                Call::new("CREATE_PAYMENT", key.clone(), &request),
                async |conn| {
                    runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    Ok::<_, AppError>(ExecutionResult::success(insert_payment(conn, "o-k").await?))
                },
            )
            .await
            .unwrap();
    }
    assert_eq!(runs.into_inner(), 1);
    assert_eq!(count(&pool, "payments").await, 1);
}

/// `NoWait` only concerns in-flight holders: a committed key still reports `Exists`.
#[tokio::test]
async fn acquire_reports_exists_for_committed_keys_without_waiting() {
    let (_pool, service) = setup().await;
    let store = service.store();
    let id = RecordId::new(
        Operation::new("OP").unwrap(),
        Scope::default(),
        IdempotencyKey::new("nw").unwrap(),
    );
    let fingerprint = Fingerprint::new("0".repeat(64));
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
    store
        .complete(
            &mut tx,
            &id,
            &idempotency_core::StoredOutcome::Completed {
                payload: "1".into(),
            },
            None,
        )
        .await
        .unwrap();
    PgStore::commit(tx).await.unwrap();
    let mut tx = store.begin().await.unwrap();
    assert_eq!(
        store.acquire(&mut tx, &claim).await.unwrap(),
        Acquire::Exists,
        "NoWait applies to in-flight holders only"
    );
}

/// `execute_optimistic` with real business rows: 20 simultaneous duplicates leave exactly one
/// payment row, because every loser's transaction rolls back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn optimistic_duplicates_leave_one_business_row() {
    let (pool, service) = setup().await;
    sqlx::raw_sql("CREATE TABLE ledger (id bigserial PRIMARY KEY, amount int NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    let request = serde_json::json!({"amount": 5});
    let barrier = Arc::new(tokio::sync::Barrier::new(20));
    let tasks: Vec<_> = (0..20)
        .map(|_| {
            let (service, request, barrier) = (service.clone(), request.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                service
                    .execute_optimistic(
                        Call::new("LEDGER", IdempotencyKey::new("opt").unwrap(), &request),
                        async |conn| {
                            let id: i64 = sqlx::query_scalar(
                                "INSERT INTO ledger (amount) VALUES (5) RETURNING id",
                            )
                            .fetch_one(&mut *conn)
                            .await?;
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            Ok::<_, AppError>(ExecutionResult::success(id))
                        },
                    )
                    .await
            })
        })
        .collect();
    let mut ids = Vec::new();
    for task in tasks {
        ids.push(
            task.await
                .unwrap()
                .unwrap()
                .into_result()
                .into_result()
                .unwrap(),
        );
    }
    assert!(ids.windows(2).all(|w| w[0] == w[1]), "{ids:?}");
    assert_eq!(count(&pool, "ledger").await, 1);
    assert_eq!(count(&pool, "idempotency_records").await, 1);
}

/// Under REPEATABLE READ or SERIALIZABLE, the loser of two optimistic duplicates took its
/// snapshot before the winner committed: its insert of the record (or its commit) fails with a
/// serialization failure, not a conflict on the key. The committed record still answers it.
async fn optimistic_loser_replays_the_winner_under(isolation: &str) {
    let (pool, plain) = setup().await;
    let counts = Arc::new(KeyCounts::default());
    let service = IdempotencyService::builder(plain.store().clone())
        .metrics(Arc::clone(&counts))
        .build();
    let request = serde_json::json!({"amount": 7});
    let key = IdempotencyKey::new("opt-isolated").unwrap();
    let (committed, winner_committed) = tokio::sync::watch::channel(false);
    let (started, mut loser_started) = tokio::sync::watch::channel(false);
    let loser = {
        let (service, request, key) = (service.clone(), request.clone(), key.clone());
        let isolation = isolation.to_owned();
        tokio::spawn(async move {
            service
                .execute_optimistic(Call::new("LEDGER", key, &request), async |conn| {
                    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                        "SET TRANSACTION ISOLATION LEVEL {isolation}"
                    )))
                    .execute(&mut *conn)
                    .await?;
                    // The snapshot: taken before the winner commits.
                    let _: i64 = sqlx::query_scalar("SELECT count(*) FROM payments")
                        .fetch_one(&mut *conn)
                        .await?;
                    insert_payment(conn, "loser").await?;
                    started.send_replace(true);
                    let mut winner_committed = winner_committed.clone();
                    winner_committed.wait_for(|done| *done).await.unwrap();
                    Ok::<_, AppError>(ExecutionResult::success("loser".to_owned()))
                })
                .await
        })
    };
    loser_started.wait_for(|started| *started).await.unwrap();
    let winner: Outcome<String> = service
        .execute_optimistic(Call::new("LEDGER", key, &request), async |conn| {
            insert_payment(conn, "winner").await?;
            Ok::<_, AppError>(ExecutionResult::success("winner".to_owned()))
        })
        .await
        .unwrap();
    assert!(winner.is_executed());
    committed.send_replace(true);
    let loser = loser.await.unwrap().expect("the loser replays the winner");
    assert!(!loser.is_executed(), "{isolation}");
    assert_eq!(
        loser.into_result().into_result().unwrap(),
        "winner",
        "{isolation}"
    );
    let orders: Vec<String> = sqlx::query_scalar("SELECT order_id FROM payments")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(orders, ["winner"], "the loser's row was rolled back");
    // The loser found the key taken, as a loser of the insert does (before: its serialization
    // failure counted neither as a conflict, and under SERIALIZABLE, where the commit fails,
    // it counted as acquired).
    assert_eq!(
        counts.snapshot(),
        (1, 1, 2),
        "{isolation}: acquired, conflicts, waits"
    );
}

/// What the service counts of its keys: acquired, found taken, waits measured.
#[derive(Default)]
struct KeyCounts {
    acquired: std::sync::atomic::AtomicUsize,
    conflicts: std::sync::atomic::AtomicUsize,
    waits: std::sync::atomic::AtomicUsize,
    persisted: std::sync::atomic::AtomicUsize,
}

impl KeyCounts {
    fn snapshot(&self) -> (usize, usize, usize) {
        let load = |n: &std::sync::atomic::AtomicUsize| n.load(std::sync::atomic::Ordering::SeqCst);
        (
            load(&self.acquired),
            load(&self.conflicts),
            load(&self.waits),
        )
    }
}

impl idempotency_core::IdempotencyMetrics for KeyCounts {
    fn acquired(&self, _: &str) {
        self.acquired
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
    fn acquire_conflict(&self, _: &str) {
        self.conflicts
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
    fn acquire_wait(&self, _: &str, _: Duration) {
        self.waits.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
    fn persisted(&self, _: &str, _: idempotency_core::RecordStatus) {
        self.persisted
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn optimistic_loser_replays_the_winner_under_repeatable_read() {
    optimistic_loser_replays_the_winner_under("REPEATABLE READ").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn optimistic_loser_replays_the_winner_under_serializable() {
    optimistic_loser_replays_the_winner_under("SERIALIZABLE").await;
}

/// The loser of two optimistic duplicates catches the unique violation the winner's row
/// caused and answers a rejection: its transaction is aborted, so its insert of the record
/// fails (25P02). The committed outcome answers it, not a store error.
#[tokio::test(flavor = "multi_thread")]
async fn optimistic_loser_that_caught_the_winners_violation_replays_the_winner() {
    let (pool, service) = setup().await;
    let request = serde_json::json!({"order": "o-dup"});
    let key = IdempotencyKey::new("opt-caught").unwrap();
    let (committed, winner_committed) = tokio::sync::watch::channel(false);
    let loser = {
        let (service, request, key) = (service.clone(), request.clone(), key.clone());
        tokio::spawn(async move {
            service
                .execute_optimistic(Call::new("PAY", key, &request), async |conn| {
                    let mut winner_committed = winner_committed.clone();
                    winner_committed.wait_for(|done| *done).await.unwrap();
                    match insert_payment(conn, "o-dup").await {
                        Ok(id) => Ok::<_, AppError>(ExecutionResult::success(id)),
                        Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                            Ok(ExecutionResult::rejected("DUPLICATE_ORDER"))
                        }
                        Err(other) => Err(other.into()),
                    }
                })
                .await
        })
    };
    let winner: Outcome<i64> = service
        .execute_optimistic(Call::new("PAY", key, &request), async |conn| {
            Ok::<_, AppError>(ExecutionResult::success(
                insert_payment(conn, "o-dup").await?,
            ))
        })
        .await
        .unwrap();
    assert!(winner.is_executed());
    committed.send_replace(true);
    let loser = loser.await.unwrap().expect("the loser replays the winner");
    assert!(!loser.is_executed());
    assert_eq!(
        loser.into_result().into_result().unwrap(),
        winner.into_result().into_result().unwrap()
    );
    assert_eq!(count(&pool, "payments").await, 1);
}

fn claim_id(key: &str) -> RecordId {
    RecordId::new(
        Operation::new("OP").unwrap(),
        Scope::default(),
        IdempotencyKey::new(key).unwrap(),
    )
}

/// Holds `key` in an open transaction (a concurrent request still running).
async fn hold(
    service: &IdempotencyService<PgStore>,
    key: &str,
) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let store = service.store();
    let mut holder = store.begin().await.unwrap();
    let acquired = store
        .acquire(
            &mut holder,
            &Claim {
                id: &claim_id(key),
                fingerprint: &Fingerprint::new("0".repeat(64)),
                ttl: None,
                wait: LockWait::Unbounded,
            },
        )
        .await
        .unwrap();
    assert_eq!(acquired, Acquire::Acquired);
    holder
}

/// `lock_timeout` aborts the caller's transaction; a caller that commits anyway would get a
/// silent rollback from PostgreSQL and a success from sqlx. `Tx::commit` refuses instead
/// (`StoreError::Poisoned`), so the key completed before in the same transaction is neither
/// stored nor cached.
#[tokio::test]
async fn commit_after_a_lock_timeout_is_refused_and_caches_nothing() {
    use idempotency_core::testing::RecordingCache;
    use idempotency_core::{InFlightPolicy, ServiceOptions};

    let (pool, service) = setup().await;
    let holder = hold(&service, "held").await;
    let cache = RecordingCache::default();
    let config = ServiceOptions {
        in_flight: InFlightPolicy::Reject,
        ..ServiceOptions::default()
    };
    let rejecting = IdempotencyService::builder(service.store().clone())
        .config(config)
        .local_cache(cache.clone())
        .build();
    let request = serde_json::json!({"x": 1});
    let mut tx = rejecting.begin().await.unwrap();
    let first: Outcome<i64> = rejecting
        .execute_in(
            &mut tx,
            Call::new("OP", IdempotencyKey::new("free").unwrap(), &request),
            async |conn| {
                Ok::<_, AppError>(ExecutionResult::success(
                    insert_payment(conn, "o-free").await?,
                ))
            },
        )
        .await
        .unwrap();
    assert!(first.is_executed());
    let second: Result<Outcome<i64>, AppError> = rejecting
        .execute_in(
            &mut tx,
            Call::new("OP", IdempotencyKey::new("held").unwrap(), &request),
            async |conn| {
                Ok(ExecutionResult::success(
                    insert_payment(conn, "o-held").await?,
                ))
            },
        )
        .await;
    assert!(
        matches!(second, Err(AppError::Idempotency(Error::InFlight))),
        "{second:?}"
    );
    assert!(tx.is_poisoned());
    let committed = tx.commit().await;
    assert!(
        matches!(committed, Err(StoreError::Poisoned)),
        "commit of an aborted transaction: {committed:?}"
    );
    assert!(
        cache.is_empty(),
        "an outcome that never committed was cached"
    );
    assert_eq!(count(&pool, "payments").await, 0);
    drop(holder);
}

/// A `statement_timeout` that fires while `acquire` waits for the key's holder is an in-flight
/// wait that ran out (HTTP 409 with `Retry-After`), not a database error (500).
#[tokio::test]
async fn a_statement_timeout_while_waiting_for_the_holder_is_in_flight() {
    use idempotency_core::{InFlightPolicy, ServiceOptions};

    let (_pool, service) = setup().await;
    let holder = hold(&service, "slow").await;
    let config = ServiceOptions {
        in_flight: InFlightPolicy::Wait { timeout: None },
        ..ServiceOptions::default()
    };
    let waiting = IdempotencyService::builder(service.store().clone())
        .config(config)
        .build();
    let mut tx = waiting.begin().await.unwrap();
    sqlx::query("SET LOCAL statement_timeout = '200ms'")
        .execute(&mut *tx)
        .await
        .unwrap();
    let started = Instant::now();
    let waited: Result<Outcome<i64>, AppError> = waiting
        .execute_in(
            &mut tx,
            Call::new(
                "OP",
                IdempotencyKey::new("slow").unwrap(),
                &serde_json::json!({}),
            ),
            async |_conn| Ok(ExecutionResult::success(1)),
        )
        .await;
    assert!(
        matches!(waited, Err(AppError::Idempotency(Error::InFlight))),
        "{waited:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(2));
    tx.rollback().await.unwrap();
    drop(holder);
}

/// A TTL PostgreSQL's timestamps cannot hold (`Duration::MAX` meant as "forever") is refused
/// before any I/O with a typed error naming the limit, instead of failing every acquire (22008).
#[tokio::test]
async fn a_ttl_beyond_the_storable_range_is_refused_before_io() {
    let (pool, service) = setup().await;
    let request = serde_json::json!({});
    let refused: Result<Outcome<i64>, AppError> = service
        .execute(
            Call::new("OP", IdempotencyKey::new("forever").unwrap(), &request).ttl(Duration::MAX),
            async |_conn| Ok(ExecutionResult::success(1)),
        )
        .await;
    assert!(
        matches!(
            refused,
            Err(AppError::Idempotency(Error::InvalidTtl { .. }))
        ),
        "{refused:?}"
    );
    assert_eq!(count(&pool, "idempotency_records").await, 0);
    // The longest accepted TTL is stored.
    let stored: Outcome<i64> = service
        .execute(
            Call::new("OP", IdempotencyKey::new("long").unwrap(), &request)
                .ttl(idempotency_core::MAX_TTL),
            async |_conn| Ok::<_, AppError>(ExecutionResult::success(1)),
        )
        .await
        .unwrap();
    assert!(stored.is_executed());
}

/// Aborts `tx`'s transaction with a failed statement and answers the store's next error: the
/// aborted-transaction error (25P02) a rollback to a savepoint is given.
async fn aborted(tx: &mut PgTx, store: &PgStore) -> StoreError {
    sqlx::query("SELECT 1/0")
        .execute(tx.connection())
        .await
        .unwrap_err();
    let id = RecordId::new(
        Operation::new("OP").unwrap(),
        Scope::default(),
        IdempotencyKey::new("aborted").unwrap(),
    );
    store.find(tx.connection(), &id).await.unwrap_err()
}

/// A `TxMark` whose savepoint a rollback to an earlier one destroyed, or one taken in another
/// `Tx`, returns nowhere and sends nothing (before: `ROLLBACK TO` a savepoint that no longer
/// exists failed with 3B001, which aborted the transaction without poisoning the `Tx`, so its
/// commit was PostgreSQL's silent rollback and its after-commit hooks still ran).
#[tokio::test(flavor = "multi_thread")]
async fn a_stale_savepoint_mark_returns_nowhere_and_leaves_the_transaction_usable() {
    let (pool, service) = setup().await;
    let store = service.store();
    let mut tx = service.begin().await.unwrap();
    let first = tx.savepoint(store).await.unwrap();
    let second = tx.savepoint(store).await.unwrap();
    // A failed statement aborts the transaction; the store's next statement says so (25P02).
    let failed = aborted(&mut tx, store).await;
    assert!(store.aborted_before(&failed), "{failed:?}");
    assert!(
        tx.rollback_to_savepoint(store, first, &failed)
            .await
            .unwrap()
    );
    assert!(
        !tx.rollback_to_savepoint(store, second, &failed)
            .await
            .unwrap(),
        "the second savepoint went with the rollback to the first"
    );
    let mut other = service.begin().await.unwrap();
    let foreign = other.savepoint(store).await.unwrap();
    assert!(
        !tx.rollback_to_savepoint(store, foreign, &failed)
            .await
            .unwrap(),
        "a mark of another Tx"
    );
    other.rollback().await.unwrap();
    insert_payment(tx.connection(), "after-stale-marks")
        .await
        .unwrap();
    assert!(!tx.is_poisoned());
    tx.commit().await.unwrap();
    assert_eq!(count(&pool, "payments").await, 1, "the commit committed");
}

/// A rollback to a savepoint whose future is dropped before the store answered leaves the
/// `Tx` poisoned: whether the transaction returned to the savepoint is unknown, so it must not
/// commit, nor run the hooks of statements that may have been undone (before: not poisoned,
/// and the commit of the still-aborted transaction was PostgreSQL's silent rollback).
#[tokio::test(flavor = "multi_thread")]
async fn a_rollback_to_a_savepoint_dropped_midway_poisons_the_tx() {
    let (_pool, service) = setup().await;
    let store = service.store();
    // Until the first poll leaves the rollback waiting for the server (it nearly always does).
    for _ in 0..10 {
        let mut tx = service.begin().await.unwrap();
        let mark = tx.savepoint(store).await.unwrap();
        let failed = aborted(&mut tx, store).await;
        let ready = {
            let mut rollback = std::pin::pin!(tx.rollback_to_savepoint(store, mark, &failed));
            std::future::poll_fn(|cx| std::task::Poll::Ready(rollback.as_mut().poll(cx).is_ready()))
                .await
        };
        if ready {
            continue;
        }
        assert!(tx.is_poisoned());
        assert!(matches!(tx.commit().await, Err(StoreError::Poisoned)));
        return;
    }
    panic!("the rollback never waited for the server");
}

/// An optimistic duplicate whose action fails on the winner's business row (the usual race
/// under READ COMMITTED: a unique order id) never inserts a record, and replays the winner:
/// it found the key taken, and counts so, as a loser of the insert does.
#[tokio::test]
async fn an_optimistic_loser_failing_on_the_winners_row_counts_a_conflict() {
    let (_pool, plain) = setup().await;
    let counts = Arc::new(KeyCounts::default());
    let service = IdempotencyService::builder(plain.store().clone())
        .metrics(Arc::clone(&counts))
        .build();
    let request = serde_json::json!({"orderId": "o-race"});
    let key = IdempotencyKey::new("opt-failed-loser").unwrap();
    let pay = async |conn: &mut PgConnection| {
        insert_payment(conn, "o-race").await?;
        Ok::<_, AppError>(ExecutionResult::success("paid".to_owned()))
    };
    let winner = service
        .execute_optimistic(Call::new("PAY", key.clone(), &request), pay)
        .await
        .unwrap();
    assert!(winner.is_executed());
    // The loser runs its action: the order's row is taken, its insert fails.
    let loser = service
        .execute_optimistic(Call::new("PAY", key, &request), pay)
        .await
        .expect("the loser replays the winner");
    assert!(!loser.is_executed());
    assert_eq!(
        counts.snapshot(),
        (1, 1, 1),
        "acquired, conflicts, waits (the loser never reached its insert)"
    );
}

/// An L2 whose write never answers.
#[derive(Clone, Copy)]
struct StuckL2;

impl idempotency_core::DistributedCache for StuckL2 {
    async fn get(
        &self,
        _: &RecordId,
    ) -> Result<Option<idempotency_core::IdempotencyRecord>, idempotency_core::CacheError> {
        Ok(None)
    }
    async fn put(
        &self,
        _: &RecordId,
        _: &idempotency_core::IdempotencyRecord,
    ) -> Result<(), idempotency_core::CacheError> {
        std::future::pending().await
    }
}

/// The caches are filled after the commit: a call given up while the L2 write hangs (a
/// timeout, a client gone) has its record committed, and counted as acquired.
#[tokio::test]
async fn an_optimistic_execution_dropped_while_filling_the_caches_counts_as_acquired() {
    let (pool, plain) = setup().await;
    let counts = Arc::new(KeyCounts::default());
    let service = IdempotencyService::builder(plain.store().clone())
        .distributed_cache(StuckL2)
        .metrics(Arc::clone(&counts))
        .build();
    let request = serde_json::json!({"orderId": "o-stuck"});
    let call = service.execute_optimistic(
        Call::new("PAY", IdempotencyKey::new("opt-stuck").unwrap(), &request),
        async |conn| {
            insert_payment(conn, "o-stuck").await?;
            Ok::<_, AppError>(ExecutionResult::success("paid".to_owned()))
        },
    );
    let given_up = tokio::time::timeout(Duration::from_millis(500), call).await;
    assert!(given_up.is_err(), "the L2 write hangs");
    assert_eq!(count(&pool, "idempotency_records").await, 1);
    assert_eq!(count(&pool, "payments").await, 1);
    assert_eq!(counts.snapshot().0, 1, "acquired");
}

/// `execute_in` in a transaction whose caller registered a hook that hangs: the stored record
/// is counted by a first hook, before the caller's; a commit given up while that hook hangs
/// has its record counted (before: the count came after the caller's hooks, so never).
#[tokio::test(flavor = "multi_thread")]
async fn execute_in_counts_its_record_before_the_callers_hanging_hook() {
    let (pool, plain) = setup().await;
    let counts = Arc::new(KeyCounts::default());
    let service = IdempotencyService::builder(plain.store().clone())
        .metrics(Arc::clone(&counts))
        .build();
    let mut tx = service.begin().await.unwrap();
    tx.after_commit(std::future::pending());
    let request = serde_json::json!({"orderId": "o-in"});
    let outcome: Outcome<String> = service
        .execute_in(
            &mut tx,
            Call::new("PAY", IdempotencyKey::new("in-hanging").unwrap(), &request),
            async |conn| {
                insert_payment(conn, "o-in").await?;
                Ok::<_, AppError>(ExecutionResult::success("paid".to_owned()))
            },
        )
        .await
        .unwrap();
    assert!(outcome.is_executed());
    let given_up = tokio::time::timeout(Duration::from_millis(500), tx.commit()).await;
    assert!(given_up.is_err(), "the caller's hook hangs");
    assert_eq!(count(&pool, "idempotency_records").await, 1);
    assert_eq!(
        counts.persisted.load(std::sync::atomic::Ordering::SeqCst),
        1
    );
}

/// A rollback to a savepoint drops the first hooks registered since, as it does the others.
#[tokio::test(flavor = "multi_thread")]
async fn a_rollback_to_a_savepoint_drops_the_first_hooks_registered_since() {
    let (_pool, service) = setup().await;
    let store = service.store();
    let ran = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let hook = || {
        let ran = Arc::clone(&ran);
        async move {
            ran.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    };
    let mut tx = service.begin().await.unwrap();
    tx.after_commit_first(hook());
    let mark = tx.savepoint(store).await.unwrap();
    tx.after_commit_first(hook());
    tx.after_commit(hook());
    assert_eq!(tx.pending_hooks(), 3);
    let failed = aborted(&mut tx, store).await;
    assert!(
        tx.rollback_to_savepoint(store, mark, &failed)
            .await
            .unwrap()
    );
    assert_eq!(tx.pending_hooks(), 1, "the two hooks after the mark went");
    tx.commit().await.unwrap();
    assert_eq!(ran.load(std::sync::atomic::Ordering::SeqCst), 1);
}
