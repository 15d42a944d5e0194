//! Storage on SQLite: atomicity with business rows, joining an application transaction, and how
//! time and payloads are stored.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

mod support;

use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idempotency_core::store::{IdempotencyStore, StoreError};
use idempotency_core::{
    Call, ExecutionResult, Fingerprint, IdempotencyService, Operation, Outcome, RecordId, Scope,
    StoredOutcome,
};
use idempotency_sqlite::{SqliteStore, SqliteTx};
use support::{
    AppError, as_str, claim, count, create_config, fresh_store, insert_charge, key, temp_db_path,
    with_charges,
};

#[tokio::test]
async fn business_row_and_record_are_atomic() {
    let store = fresh_store().await;
    with_charges(&store).await;
    let service = IdempotencyService::new(store.clone());
    let k = key("atomic");
    let failed: Result<Outcome<i64>, AppError> = service
        .execute(Call::new("CHARGE", k.clone(), &1), async |conn| {
            insert_charge(conn, "lost").await?;
            Err(AppError::Boom)
        })
        .await;
    assert!(matches!(failed, Err(AppError::Boom)), "{failed:?}");
    assert_eq!(count(store.pool(), "charges").await, 0);
    assert_eq!(count(store.pool(), "idempotency_records").await, 0);

    for expect_executed in [true, false] {
        let outcome: Outcome<i64> = service
            .execute(Call::new("CHARGE", k.clone(), &1), async |conn| {
                Ok::<_, AppError>(ExecutionResult::success(insert_charge(conn, "kept").await?))
            })
            .await
            .unwrap();
        assert_eq!(outcome.is_executed(), expect_executed);
    }
    assert_eq!(count(store.pool(), "charges").await, 1);
}

#[tokio::test]
async fn execute_in_joins_an_application_transaction() {
    let store = fresh_store().await;
    with_charges(&store).await;
    let service = IdempotencyService::new(store.clone());
    for commit in [false, true] {
        let tx = store.pool().begin_with("BEGIN IMMEDIATE").await.unwrap();
        let mut tx = SqliteTx::new(tx);
        insert_charge(tx.connection(), "outside").await.unwrap();
        let outcome: Outcome<i64> = service
            .execute_in(
                &mut tx,
                Call::new("CHARGE", key("join"), &2),
                async |conn| {
                    Ok::<_, AppError>(ExecutionResult::success(
                        insert_charge(conn, "inside").await?,
                    ))
                },
            )
            .await
            .unwrap();
        assert!(outcome.is_executed());
        if commit {
            tx.commit().await.unwrap();
        } else {
            tx.rollback().await.unwrap();
        }
    }
    assert_eq!(
        count(store.pool(), "charges").await,
        2,
        "only the committed pair"
    );
    assert_eq!(count(store.pool(), "idempotency_records").await, 1);
}

#[tokio::test]
async fn times_are_integer_milliseconds_from_the_database_clock() {
    let store = fresh_store().await;
    let service = IdempotencyService::new(store.clone());
    let before = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let _: Outcome<i32> = service
        .execute(
            Call::new("OP", key("clock"), &0).ttl(Duration::from_secs(90)),
            async |_conn| Ok::<_, AppError>(ExecutionResult::success(0)),
        )
        .await
        .unwrap();
    let after = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let (kind, created, completed, lifetime): (String, i64, i64, i64) = sqlx::query_as(
        "SELECT typeof(created_at) || ',' || typeof(completed_at) || ',' || typeof(expires_at), \
                created_at, completed_at, expires_at - created_at FROM idempotency_records",
    )
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(kind, "integer,integer,integer");
    // Same machine: the database clock agrees with ours to within a few milliseconds.
    assert!(created >= before - 5 && completed <= after + 5 && created <= completed);
    assert_eq!(lifetime, 90_000);
}

#[tokio::test]
async fn payloads_are_stored_as_written_and_must_be_json() {
    let store = fresh_store().await;
    let fingerprint = Fingerprint::new("b".repeat(64));
    let id = RecordId::new(Operation::new("OP").unwrap(), Scope::default(), key("json"));
    let written = r#"{ "b" : 1.50, "a" : "\u00e9" }"#;
    let mut tx = store.begin().await.unwrap();
    store
        .acquire(&mut tx, &claim(&id, &fingerprint))
        .await
        .unwrap();
    store
        .complete(
            &mut tx,
            &id,
            &StoredOutcome::Completed {
                payload: written.into(),
            },
            None,
        )
        .await
        .unwrap();
    SqliteStore::commit(tx).await.unwrap();
    let stored: String = sqlx::query_scalar("SELECT result_payload FROM idempotency_records")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(stored, written, "stored byte for byte");

    let other = RecordId::new(Operation::new("OP").unwrap(), Scope::default(), key("json"));
    let mut tx = store.begin().await.unwrap();
    store
        .acquire(&mut tx, &claim(&other, &fingerprint))
        .await
        .unwrap();
    let error = store
        .complete(
            &mut tx,
            &other,
            &StoredOutcome::Completed {
                payload: "{not json".into(),
            },
            None,
        )
        .await
        .unwrap_err();
    assert!(matches!(error, StoreError::Database(_)), "{error:?}");
    SqliteStore::rollback(tx).await.unwrap();
}

/// A full disk is the database's lack of resources, like PostgreSQL's class 53: a retryable
/// `Unavailable` (HTTP 503 with `Retry-After`), not an opaque database error (500). The disk is
/// made full with `max_page_count`, which fails writes with the same `SQLITE_FULL`.
#[tokio::test]
async fn a_full_disk_is_unavailable() {
    let path = temp_db_path();
    let options = idempotency_sqlite::connect_options(as_str(&path)).unwrap();
    let store = SqliteStore::connect_with(options.clone(), &create_config())
        .await
        .unwrap();
    let pages: i64 = sqlx::query_scalar("PRAGMA page_count")
        .fetch_one(store.pool())
        .await
        .unwrap();
    store.pool().close().await;
    let full = options.pragma("max_page_count", (pages + 4).to_string());
    let store = SqliteStore::connect_with(full, &create_config())
        .await
        .unwrap();
    let service = IdempotencyService::new(store.clone());
    let large = "x".repeat(64 * 1024);
    let mut outcome = Ok(());
    for n in 0..64 {
        let call = Call::new("OP", key(&format!("full-{n}")), &n);
        let done: Result<Outcome<String>, AppError> = service
            .execute(call, async |_conn| {
                Ok::<_, AppError>(ExecutionResult::success(large.clone()))
            })
            .await;
        if let Err(error) = done {
            outcome = Err(error);
            break;
        }
    }
    let error = outcome.expect_err("the database filled up");
    assert!(
        matches!(
            error,
            AppError::Idempotency(idempotency_core::Error::Store(StoreError::Unavailable(_)))
        ),
        "{error:?}"
    );
}

/// A statement that rolls the whole transaction back (`INSERT OR ROLLBACK` on a taken key;
/// `RAISE(ROLLBACK)` and a full disk do the same) leaves the connection in autocommit. An
/// action that catches it and answers must not have its outcome stored: the record would
/// commit on its own, without the writes it speaks for (before: `execute_optimistic` stored
/// a success whose charge was rolled back; `execute_in` committed the key's record and the
/// action's later write, each alone).
#[tokio::test]
async fn a_statement_that_rolled_the_transaction_back_stores_nothing() {
    async fn roll_back_with_a_taken_key(conn: &mut sqlx::SqliteConnection) {
        let error = sqlx::query("INSERT OR ROLLBACK INTO charges (id, reference) VALUES (1, 'x')")
            .execute(&mut *conn)
            .await
            .unwrap_err();
        assert!(
            error.to_string().contains("UNIQUE"),
            "a unique violation: {error}"
        );
    }
    let store = fresh_store().await;
    with_charges(&store).await;
    insert_charge(&mut store.pool().acquire().await.unwrap(), "taken")
        .await
        .unwrap();
    let service = IdempotencyService::new(store.clone());

    let optimistic: Result<Outcome<i64>, AppError> = service
        .execute_optimistic(Call::new("CHARGE", key("rolled-back"), &1), async |conn| {
            let id = insert_charge(conn, "lost").await?;
            roll_back_with_a_taken_key(conn).await;
            Ok(ExecutionResult::success(id))
        })
        .await;
    assert!(optimistic.is_err(), "{optimistic:?}");

    let tx = store.pool().begin_with("BEGIN IMMEDIATE").await.unwrap();
    let mut tx = SqliteTx::new(tx);
    insert_charge(tx.connection(), "lost too").await.unwrap();
    roll_back_with_a_taken_key(tx.connection()).await;
    let within: Result<Outcome<i64>, AppError> = service
        .execute_in(
            &mut tx,
            Call::new("CHARGE", key("rolled-back-in"), &1),
            async |conn| {
                Ok(ExecutionResult::success(
                    insert_charge(conn, "alone").await?,
                ))
            },
        )
        .await;
    assert!(within.is_err(), "{within:?}");
    drop(tx);

    assert_eq!(count(store.pool(), "idempotency_records").await, 0);
    assert_eq!(
        count(store.pool(), "charges").await,
        1,
        "only the taken one"
    );
}

/// A store on a pool of one connection (so that a broken connection is the next request's),
/// with the charge "taken" (id 1) committed, and its service.
async fn one_connection_with_a_taken_charge() -> (SqliteStore, IdempotencyService<SqliteStore>) {
    let (_, options) = support::fresh_options();
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
        .unwrap();
    let store = SqliteStore::new(pool);
    store.create_schema().await.unwrap();
    with_charges(&store).await;
    insert_charge(&mut store.pool().acquire().await.unwrap(), "taken")
        .await
        .unwrap();
    let service = IdempotencyService::new(store.clone());
    (store, service)
}

/// `execute` (the key claimed first) whose action ran a statement that rolled the transaction
/// back: the claim went with it, the completion finds no claim, nothing is stored, and the
/// connection goes back to the pool usable (before: sqlx still counted the transaction open,
/// its rollback failed, and every later `BEGIN IMMEDIATE` on that connection was refused).
#[tokio::test]
async fn a_claim_rolled_back_by_the_action_leaves_the_connection_usable() {
    let (store, service) = one_connection_with_a_taken_charge().await;
    let rolled_back: Result<Outcome<i64>, AppError> = service
        .execute(
            Call::new("CHARGE", key("claim-rolled-back"), &1),
            async |conn| {
                let id = insert_charge(conn, "lost").await?;
                sqlx::query("INSERT OR ROLLBACK INTO charges (id, reference) VALUES (1, 'x')")
                    .execute(&mut *conn)
                    .await
                    .unwrap_err();
                Ok(ExecutionResult::success(id))
            },
        )
        .await;
    assert!(rolled_back.is_err(), "{rolled_back:?}");
    let next: Outcome<i64> = service
        .execute(Call::new("CHARGE", key("next"), &1), async |conn| {
            Ok::<_, AppError>(ExecutionResult::success(insert_charge(conn, "next").await?))
        })
        .await
        .expect("the pool's one connection is usable");
    assert!(next.is_executed());
    assert_eq!(count(store.pool(), "idempotency_records").await, 1);
}

/// The same, with an action that then returns an error: no completion runs, and sqlx's
/// rollback of the ended transaction must still find one (before: it failed, and the pool's
/// one connection refused every later `BEGIN IMMEDIATE` for good).
#[tokio::test]
async fn an_action_that_failed_after_ending_the_transaction_leaves_the_connection_usable() {
    let (store, service) = one_connection_with_a_taken_charge().await;
    let failed: Result<Outcome<i64>, AppError> = service
        .execute(
            Call::new("CHARGE", key("ended-then-failed"), &1),
            async |conn| {
                sqlx::query("INSERT OR ROLLBACK INTO charges (id, reference) VALUES (1, 'x')")
                    .execute(&mut *conn)
                    .await
                    .unwrap_err();
                Err(AppError::Boom)
            },
        )
        .await;
    assert!(matches!(failed, Err(AppError::Boom)), "{failed:?}");
    let next: Outcome<i64> = service
        .execute(Call::new("CHARGE", key("after"), &1), async |conn| {
            Ok::<_, AppError>(ExecutionResult::success(
                insert_charge(conn, "after").await?,
            ))
        })
        .await
        .expect("the pool's one connection is usable");
    assert!(next.is_executed());
    assert_eq!(count(store.pool(), "idempotency_records").await, 1);
}

/// A nested sqlx transaction whose rollback failed (the statement in it had ended the whole
/// transaction) stays counted by sqlx. The store's rollback must still end every transaction
/// on the connection: before, it rolled back to the savepoint sqlx named and left the
/// transaction the store had begun again open, on a pool connection sqlx counted at depth 1,
/// so the next user's commit released a savepoint and committed nothing.
#[tokio::test]
async fn a_failed_nested_rollback_leaves_no_transaction_open_on_the_connection() {
    for fails in [false, true] {
        let (store, service) = one_connection_with_a_taken_charge().await;
        let ended: Result<Outcome<i64>, AppError> = service
            .execute(Call::new("CHARGE", key("nested-ended"), &1), async |conn| {
                let mut nested = sqlx::Connection::begin(&mut *conn).await?;
                sqlx::query("INSERT OR ROLLBACK INTO charges (id, reference) VALUES (1, 'x')")
                    .execute(&mut *nested)
                    .await
                    .unwrap_err();
                nested.rollback().await.unwrap_err();
                if fails {
                    return Err(AppError::Boom);
                }
                Ok(ExecutionResult::success(1))
            })
            .await;
        assert!(ended.is_err(), "fails {fails}: {ended:?}");
        // The next user of the pool's one connection commits what it writes.
        let mut tx = store.pool().begin().await.unwrap();
        insert_charge(&mut tx, "later").await.unwrap();
        tx.commit().await.unwrap();
        let options = store.pool().connect_options();
        let mut other = <sqlx::SqliteConnection as sqlx::Connection>::connect_with(&options)
            .await
            .unwrap();
        let later: i64 =
            sqlx::query_scalar("SELECT count(*) FROM charges WHERE reference = 'later'")
                .fetch_one(&mut other)
                .await
                .unwrap();
        assert_eq!(later, 1, "fails {fails}: the later commit is on disk");
        assert_eq!(count(store.pool(), "idempotency_records").await, 0);
    }
}

/// `after_commit_first` hooks run before the `after_commit` ones, each in registration order,
/// and only after the commit.
#[tokio::test]
async fn first_hooks_run_before_the_others_after_the_commit() {
    let (_store, service) = one_connection_with_a_taken_charge().await;
    let ran = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let hook = |name: &'static str| {
        let ran = std::sync::Arc::clone(&ran);
        async move { ran.lock().unwrap().push(name) }
    };
    let mut tx = service.begin().await.unwrap();
    tx.after_commit(hook("app-1"));
    tx.after_commit_first(hook("first-1"));
    tx.after_commit(hook("app-2"));
    tx.after_commit_first(hook("first-2"));
    assert_eq!(tx.pending_hooks(), 4);
    assert!(ran.lock().unwrap().is_empty());
    tx.commit().await.unwrap();
    assert_eq!(
        *ran.lock().unwrap(),
        ["first-1", "first-2", "app-1", "app-2"]
    );
    let mut rolled_back = service.begin().await.unwrap();
    rolled_back.after_commit_first(hook("never"));
    rolled_back.rollback().await.unwrap();
    assert_eq!(ran.lock().unwrap().len(), 4);
}

/// A nested transaction dropped without a rollback (a savepoint the caller discards) only
/// queues its rollback: the commit that follows at once must not take it for one left open
/// (the depth sqlx counts is lowered when the connection runs the queued rollback).
#[tokio::test]
async fn a_nested_transaction_dropped_before_the_commit_does_not_refuse_it() {
    let (store, service) = one_connection_with_a_taken_charge().await;
    for i in 0..50 {
        let mut tx = service.begin().await.unwrap();
        insert_charge(&mut tx, &format!("kept-{i}")).await.unwrap();
        {
            let mut nested = sqlx::Connection::begin(&mut *tx).await.unwrap();
            insert_charge(&mut nested, &format!("gone-{i}"))
                .await
                .unwrap();
        }
        tx.commit().await.expect("the commit goes through");
    }
    let kept: i64 =
        sqlx::query_scalar("SELECT count(*) FROM charges WHERE reference LIKE 'kept-%'")
            .fetch_one(store.pool())
            .await
            .unwrap();
    let gone: i64 =
        sqlx::query_scalar("SELECT count(*) FROM charges WHERE reference LIKE 'gone-%'")
            .fetch_one(store.pool())
            .await
            .unwrap();
    assert_eq!((kept, gone), (50, 0));
}

/// An action that leaks a nested transaction (`mem::forget`) leaves sqlx counting it: sqlx's
/// commit of the store's transaction would only release its savepoint and report success with
/// nothing on disk. The store refuses the commit and rolls everything back (before: `Ok`, the
/// record and the charge lost, the pool's connection left in the transaction).
#[tokio::test]
async fn a_leaked_nested_transaction_is_rolled_back_not_reported_committed() {
    let (store, service) = one_connection_with_a_taken_charge().await;
    let leaked: Result<Outcome<i64>, AppError> = service
        .execute(Call::new("CHARGE", key("leaked"), &1), async |conn| {
            let id = insert_charge(conn, "leaked").await?;
            std::mem::forget(sqlx::Connection::begin(&mut *conn).await?);
            Ok(ExecutionResult::success(id))
        })
        .await;
    assert!(leaked.is_err(), "{leaked:?}");
    let next: Outcome<i64> = service
        .execute(Call::new("CHARGE", key("after-leak"), &1), async |conn| {
            Ok::<_, AppError>(ExecutionResult::success(
                insert_charge(conn, "after-leak").await?,
            ))
        })
        .await
        .expect("the pool's one connection is usable");
    assert!(next.is_executed());
    let options = store.pool().connect_options();
    let mut other = <sqlx::SqliteConnection as sqlx::Connection>::connect_with(&options)
        .await
        .unwrap();
    let references: Vec<String> = sqlx::query_scalar("SELECT reference FROM charges ORDER BY id")
        .fetch_all(&mut other)
        .await
        .unwrap();
    assert_eq!(references, ["taken", "after-leak"]);
    let records: i64 = sqlx::query_scalar("SELECT count(*) FROM idempotency_records")
        .fetch_one(&mut other)
        .await
        .unwrap();
    assert_eq!(records, 1);
}

/// A claim whose future is dropped mid-write, after a statement had rolled the caller's
/// transaction back, must not commit on its own when sqlx's worker runs the queued write
/// (before: the guard disarmed on drop, and the write the worker ran next committed alone).
/// The future is dropped after each number of polls in turn, with time for the worker between
/// polls, so that one drop lands between sending the insert and running it.
#[tokio::test]
async fn a_claim_dropped_mid_write_after_the_transaction_ended_commits_nothing() {
    let store = fresh_store().await;
    with_charges(&store).await;
    insert_charge(&mut store.pool().acquire().await.unwrap(), "taken")
        .await
        .unwrap();
    let fingerprint = Fingerprint::new("c".repeat(64));
    for polls in 1..=8 {
        let id = RecordId::new(
            Operation::new("OP").unwrap(),
            Scope::default(),
            key(&format!("dropped-{polls}")),
        );
        let mut tx = store.begin().await.unwrap();
        sqlx::query("INSERT OR ROLLBACK INTO charges (id, reference) VALUES (1, 'x')")
            .execute(&mut *tx)
            .await
            .unwrap_err();
        {
            let claim = claim(&id, &fingerprint);
            let mut acquire = std::pin::pin!(store.acquire(&mut tx, &claim));
            for _ in 0..polls {
                let ready = std::future::poll_fn(|cx| {
                    std::task::Poll::Ready(acquire.as_mut().poll(cx).is_ready())
                })
                .await;
                if ready {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        // Time for the worker to run whatever was queued, then the caller gives up.
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(tx);
    }
    assert_eq!(
        count(store.pool(), "idempotency_records").await,
        0,
        "a claim committed on its own"
    );
}

/// The error of a store write after a statement ended the transaction is not retryable: the
/// caller's statements after the one that ended it have committed one by one, and a retry of
/// the whole transaction would run them again (before: a retryable `Conflict`).
#[tokio::test]
async fn a_write_after_the_transaction_ended_is_not_retryable() {
    let store = fresh_store().await;
    with_charges(&store).await;
    insert_charge(&mut store.pool().acquire().await.unwrap(), "taken")
        .await
        .unwrap();
    let fingerprint = Fingerprint::new("d".repeat(64));
    let id = RecordId::new(
        Operation::new("OP").unwrap(),
        Scope::default(),
        key("ended"),
    );
    let mut tx = store.begin().await.unwrap();
    sqlx::query("INSERT OR ROLLBACK INTO charges (id, reference) VALUES (1, 'x')")
        .execute(&mut *tx)
        .await
        .unwrap_err();
    insert_charge(&mut tx, "committed alone").await.unwrap();
    let error = store
        .acquire(&mut tx, &claim(&id, &fingerprint))
        .await
        .unwrap_err();
    assert!(!error.is_retryable(), "{error:?}");
    let source = std::error::Error::source(&error).unwrap().to_string();
    assert!(source.contains("no transaction was open"), "{source}");
    drop(tx);
    assert_eq!(count(store.pool(), "idempotency_records").await, 0);
}

/// A store write on a connection that sqlx counts in no transaction is refused before it is
/// sent: it would commit on its own.
#[tokio::test]
async fn a_write_outside_a_transaction_is_refused() {
    let store = fresh_store().await;
    let fingerprint = Fingerprint::new("e".repeat(64));
    let id = RecordId::new(Operation::new("OP").unwrap(), Scope::default(), key("bare"));
    let mut conn = store.pool().acquire().await.unwrap();
    let error = store
        .acquire(&mut conn, &claim(&id, &fingerprint))
        .await
        .unwrap_err();
    assert!(!error.is_retryable(), "{error:?}");
    drop(conn);
    assert_eq!(count(store.pool(), "idempotency_records").await, 0);
}

/// A caller's `execute_in` dropped while its claim is on its way to sqlx's worker, then the
/// caller's transaction committed: the worker runs the queued insert, so a commit would store
/// a `PROCESSING` record that answers every retry "in flight" until its TTL, the action never
/// run. The commit refuses the unfinished claim. The future is dropped after each number of
/// polls in turn (no pause between them), so that drops land between sending the insert and
/// reading its answer.
#[tokio::test]
async fn an_execute_in_dropped_mid_claim_cannot_commit_the_claim() {
    let store = fresh_store().await;
    let service = IdempotencyService::new(store.clone());
    let mut refused = 0;
    for polls in 1..=40 {
        let mut tx = service.begin().await.unwrap();
        {
            let call = Call::new("OP", key(&format!("dropped-{polls}")), &"{}");
            let mut execute = std::pin::pin!(service.execute_in(
                &mut tx,
                call,
                async |_conn: &mut sqlx::SqliteConnection| {
                    Ok::<_, idempotency_core::Error>(ExecutionResult::success(1))
                },
            ));
            for _ in 0..polls {
                let ready = std::future::poll_fn(|cx| {
                    std::task::Poll::Ready(execute.as_mut().poll(cx).is_ready())
                })
                .await;
                if ready {
                    break;
                }
            }
        }
        // Time for the worker to run whatever was queued, then the caller commits.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let unfinished = tx.unfinished_claims();
        let committed = tx.commit().await;
        match (unfinished, committed) {
            // The call finished within its polls: its outcome is stored, nothing unfinished.
            (0, Ok(())) => {}
            (1, Err(StoreError::UnfinishedClaim { count: 1 })) => refused += 1,
            other => panic!("after {polls} polls: {other:?}"),
        }
    }
    assert!(refused > 0, "no drop landed while a claim was under way");
    let processing: i64 =
        sqlx::query_scalar("SELECT count(*) FROM idempotency_records WHERE status = 'PROCESSING'")
            .fetch_one(store.pool())
            .await
            .unwrap();
    assert_eq!(
        processing, 0,
        "a claim of a dropped execute_in was committed"
    );
}
