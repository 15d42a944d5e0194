//! An error that ends the server-side transaction (a deadlock, 1213) leaves the session in
//! autocommit while sqlx still counts the transaction as open. Every later statement through
//! that transaction must fail, so that nothing the caller retries commits on its own, and the
//! error must say to retry the whole transaction.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

use std::error::Error as _;
use std::time::Duration;

use idempotency_core::config::SchemaMode;
use idempotency_mysql::MysqlTransaction;
use idempotency_mysql::{MysqlInbox, MysqlOutbox, TransactionRolledBack};
use idempotency_outbox::config::{InboxConfig, OutboxConfig};
use idempotency_outbox::{Error, NewEvent};
use sqlx::MySqlPool;

fn event(aggregate: &str) -> NewEvent {
    NewEvent::new("order", aggregate, "Placed", &serde_json::json!({"n": 1})).unwrap()
}

async fn count(pool: &MySqlPool, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

/// What each transaction of the deadlock runs.
#[derive(Clone)]
enum Step {
    Enqueue(MysqlOutbox),
    Record(MysqlInbox),
    /// The caller's own statement: an insert into a table with a primary key.
    Business,
}

impl Step {
    async fn run(&self, tx: &mut MysqlTransaction, name: &str) -> Result<(), Error> {
        match self {
            Self::Enqueue(outbox) => outbox.enqueue(tx, &event(name)).await.map(drop),
            Self::Record(inbox) => inbox.record(tx, "consumer", name).await.map(drop),
            Self::Business => sqlx::query("INSERT INTO taken (name) VALUES (?)")
                .bind(name)
                .execute(&mut **tx)
                .await
                .map(drop)
                .map_err(|e| Error::Database(Box::new(e))),
        }
    }
}

/// Runs the step on `x` in a, on `y` in b, then on `y` in a (which waits for b) and on `x` in b
/// (which closes the cycle): InnoDB rolls one of them back with 1213. Returns both
/// transactions with the results of their second steps.
async fn deadlock(pool: &MySqlPool, step: Step) -> Vec<(MysqlTransaction, Result<(), Error>)> {
    let mut a = idempotency_mysql::begin(pool).await.unwrap();
    let mut b = idempotency_mysql::begin(pool).await.unwrap();
    sqlx::query("INSERT INTO business (name) VALUES ('a')")
        .execute(&mut *a)
        .await
        .unwrap();
    sqlx::query("INSERT INTO business (name) VALUES ('b')")
        .execute(&mut *b)
        .await
        .unwrap();
    step.run(&mut a, "x").await.unwrap();
    step.run(&mut b, "y").await.unwrap();
    let waiting = {
        let step = step.clone();
        tokio::spawn(async move {
            let result = step.run(&mut a, "y").await;
            (a, result)
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let result = step.run(&mut b, "x").await;
    vec![waiting.await.unwrap(), (b, result)]
}

/// The deadlock victim's error names the whole transaction.
fn assert_rolled_back(error: &Error) {
    assert!(matches!(error, Error::Conflict(_)), "{error:?}");
    assert!(error.is_retryable());
    let source = error.source().unwrap();
    assert!(
        source.downcast_ref::<TransactionRolledBack>().is_some(),
        "the source is {source:?}"
    );
    assert!(
        source.to_string().contains("retry the whole transaction"),
        "{source}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueue_after_a_deadlock_fails_instead_of_autocommitting() {
    let pool = idempotency_testing::mysql_pool().await;
    sqlx::raw_sql("CREATE TABLE business (name VARCHAR(10) NOT NULL) ENGINE = InnoDB")
        .execute(&pool)
        .await
        .unwrap();
    let mut config = OutboxConfig::default();
    config.schema.mode = SchemaMode::Create;
    let outbox = MysqlOutbox::from_config(pool.clone(), &config)
        .await
        .unwrap();
    let mut victims = 0;
    for (mut tx, result) in deadlock(&pool, Step::Enqueue(outbox.clone())).await {
        match result {
            Ok(_) => tx.commit().await.unwrap(),
            Err(error) => {
                victims += 1;
                assert_rolled_back(&error);
                // The caller retries the call in the same transaction, then commits.
                let retried = outbox.enqueue(&mut tx, &event("z")).await;
                assert!(retried.is_err(), "the retried enqueue ran: {retried:?}");
                let business = sqlx::query("INSERT INTO business (name) VALUES ('late')")
                    .execute(&mut *tx)
                    .await;
                assert!(
                    business.is_err(),
                    "a business statement ran after the rollback"
                );
                assert!(tx.commit().await.is_err(), "the commit succeeded");
            }
        }
    }
    assert_eq!(victims, 1);
    assert_eq!(count(&pool, "SELECT COUNT(*) FROM business").await, 1);
    // The survivor's two events, nothing of the victim's.
    assert_eq!(count(&pool, "SELECT COUNT(*) FROM outbox").await, 2);
    assert_eq!(
        count(
            &pool,
            "SELECT COUNT(*) FROM outbox WHERE aggregate_id = 'z'"
        )
        .await,
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inbox_record_after_a_deadlock_fails_instead_of_autocommitting() {
    let pool = idempotency_testing::mysql_pool().await;
    sqlx::raw_sql("CREATE TABLE business (name VARCHAR(10) NOT NULL) ENGINE = InnoDB")
        .execute(&pool)
        .await
        .unwrap();
    let mut config = InboxConfig::default();
    config.schema.mode = SchemaMode::Create;
    let inbox = MysqlInbox::from_config(pool.clone(), &config)
        .await
        .unwrap();
    let mut victims = 0;
    for (mut tx, result) in deadlock(&pool, Step::Record(inbox.clone())).await {
        match result {
            Ok(_) => tx.commit().await.unwrap(),
            Err(error) => {
                victims += 1;
                assert_rolled_back(&error);
                let retried = inbox.record(&mut tx, "consumer", "z").await;
                assert!(retried.is_err(), "the retried record ran: {retried:?}");
                assert!(tx.commit().await.is_err(), "the commit succeeded");
            }
        }
    }
    assert_eq!(victims, 1);
    assert_eq!(count(&pool, "SELECT COUNT(*) FROM business").await, 1);
    assert_eq!(
        count(&pool, "SELECT COUNT(*) FROM inbox").await,
        2,
        "only the survivor's two messages"
    );
}

/// The deadlock hits one of the caller's own statements: the enqueue that follows finds the
/// transaction gone and refuses to run outside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueue_after_the_callers_own_statement_deadlocked_fails() {
    let pool = idempotency_testing::mysql_pool().await;
    sqlx::raw_sql(
        "CREATE TABLE business (name VARCHAR(10) NOT NULL) ENGINE = InnoDB; \
         CREATE TABLE taken (name VARCHAR(10) PRIMARY KEY) ENGINE = InnoDB",
    )
    .execute(&pool)
    .await
    .unwrap();
    let mut config = OutboxConfig::default();
    config.schema.mode = SchemaMode::Create;
    let outbox = MysqlOutbox::from_config(pool.clone(), &config)
        .await
        .unwrap();
    let mut victims = 0;
    for (mut tx, result) in deadlock(&pool, Step::Business).await {
        match result {
            Ok(()) => tx.commit().await.unwrap(),
            Err(_) => {
                victims += 1;
                let error = outbox.enqueue(&mut tx, &event("z")).await.unwrap_err();
                assert_rolled_back(&error);
                assert!(tx.commit().await.is_err(), "the commit succeeded");
            }
        }
    }
    assert_eq!(victims, 1);
    assert_eq!(count(&pool, "SELECT COUNT(*) FROM business").await, 1);
    assert_eq!(count(&pool, "SELECT COUNT(*) FROM outbox").await, 0);
}

/// The deadlock hits one of the caller's own statements: the inbox record that follows finds
/// the transaction gone and refuses to run outside it (the message would be marked processed
/// without the effects the deadlock rolled back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inbox_record_after_the_callers_own_statement_deadlocked_fails() {
    let pool = idempotency_testing::mysql_pool().await;
    sqlx::raw_sql(
        "CREATE TABLE business (name VARCHAR(10) NOT NULL) ENGINE = InnoDB; \
         CREATE TABLE taken (name VARCHAR(10) PRIMARY KEY) ENGINE = InnoDB",
    )
    .execute(&pool)
    .await
    .unwrap();
    let mut config = InboxConfig::default();
    config.schema.mode = SchemaMode::Create;
    let inbox = MysqlInbox::from_config(pool.clone(), &config)
        .await
        .unwrap();
    let mut victims = 0;
    for (mut tx, result) in deadlock(&pool, Step::Business).await {
        match result {
            Ok(()) => tx.commit().await.unwrap(),
            Err(_) => {
                victims += 1;
                let error = inbox.record(&mut tx, "consumer", "z").await.unwrap_err();
                assert_rolled_back(&error);
                assert!(tx.commit().await.is_err(), "the commit succeeded");
            }
        }
    }
    assert_eq!(victims, 1);
    assert_eq!(count(&pool, "SELECT COUNT(*) FROM business").await, 1);
    assert_eq!(
        count(&pool, "SELECT COUNT(*) FROM inbox").await,
        0,
        "the message was recorded outside the caller's transaction"
    );
}

/// The deadlock hits one of the caller's own statements before `execute_in`: the store's
/// acquire finds the transaction gone and refuses to run outside it. Before, the `PROCESSING`
/// record, the action's write and the completed record each committed on their own, and the
/// caller's commit "succeeded" without the business row the deadlock rolled back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn execute_in_after_the_callers_own_statement_deadlocked_fails() {
    use idempotency_core::{Call, ExecutionResult, IdempotencyService, Outcome, StoreError};
    use idempotency_mysql::{MysqlStore, MysqlTx};

    let pool = idempotency_testing::mysql_pool().await;
    sqlx::raw_sql(
        "CREATE TABLE business (name VARCHAR(10) NOT NULL) ENGINE = InnoDB; \
         CREATE TABLE taken (name VARCHAR(10) PRIMARY KEY) ENGINE = InnoDB",
    )
    .execute(&pool)
    .await
    .unwrap();
    let mut config = idempotency_core::config::PersistenceConfig::default();
    config.schema.mode = SchemaMode::Create;
    let store = MysqlStore::from_config(pool.clone(), &config)
        .await
        .unwrap();
    for lookup_before_acquire in [false, true] {
        let service = IdempotencyService::builder(store.clone())
            .config(idempotency_core::ServiceOptions {
                lookup_before_acquire,
                ..Default::default()
            })
            .build();
        let mut victims = 0;
        for (tx, result) in deadlock(&pool, Step::Business).await {
            match result {
                Ok(()) => tx.commit().await.unwrap(),
                Err(_) => {
                    victims += 1;
                    let mut tx = MysqlTx::new(tx);
                    let key = idempotency_core::testing::key("after-deadlock");
                    let ran = std::sync::atomic::AtomicBool::new(false);
                    let executed: Result<Outcome<i32>, idempotency_core::Error> = service
                        .execute_in(
                            &mut tx,
                            Call::new("OP", key, &serde_json::json!({"n": 1})),
                            async |conn| {
                                ran.store(true, std::sync::atomic::Ordering::SeqCst);
                                sqlx::query("INSERT INTO business (name) VALUES ('action')")
                                    .execute(conn)
                                    .await
                                    .map_err(|e| {
                                        idempotency_core::Error::Store(
                                            idempotency_mysql::store_error(e),
                                        )
                                    })?;
                                Ok(ExecutionResult::success(1))
                            },
                        )
                        .await;
                    let error = executed.unwrap_err();
                    let idempotency_core::Error::Store(StoreError::Conflict(source)) = &error
                    else {
                        panic!("not a conflict: {error:?}");
                    };
                    assert!(
                        source.downcast_ref::<TransactionRolledBack>().is_some(),
                        "the source is {source:?}"
                    );
                    assert!(error.is_retryable(), "{error:?}");
                    assert!(
                        !ran.load(std::sync::atomic::Ordering::SeqCst),
                        "the action ran outside the transaction"
                    );
                    assert!(tx.commit().await.is_err(), "the commit succeeded");
                }
            }
        }
        assert_eq!(victims, 1);
        assert_eq!(
            count(&pool, "SELECT COUNT(*) FROM idempotency_records").await,
            0,
            "a record committed outside the caller's transaction"
        );
        assert_eq!(
            count(&pool, "SELECT COUNT(*) FROM business WHERE name = 'action'").await,
            0,
            "the action's write committed outside the caller's transaction"
        );
        sqlx::raw_sql("DELETE FROM business; DELETE FROM taken")
            .execute(&pool)
            .await
            .unwrap();
    }
}

/// An action that goes on after the server ended the transaction under it (here a `ROLLBACK`
/// sent as plain SQL, which leaves the session as a deadlock the action swallowed does: back in
/// autocommit, the transaction still counted by sqlx): `complete` finds the acquired record
/// gone with the transaction and says so, and nothing the caller runs next commits on its own
/// (before: `NotProcessing`, and the caller's next statement autocommitted).
#[tokio::test]
async fn complete_after_the_transaction_ended_under_the_action_fails() {
    use idempotency_core::{Call, ExecutionResult, IdempotencyService, Outcome, StoreError};
    use idempotency_mysql::{MysqlStore, MysqlTx};

    let pool = idempotency_testing::mysql_pool().await;
    sqlx::raw_sql("CREATE TABLE business (name VARCHAR(10) NOT NULL) ENGINE = InnoDB")
        .execute(&pool)
        .await
        .unwrap();
    let mut config = idempotency_core::config::PersistenceConfig::default();
    config.schema.mode = SchemaMode::Create;
    let store = MysqlStore::from_config(pool.clone(), &config)
        .await
        .unwrap();
    let service = IdempotencyService::new(store.clone());
    let mut tx = MysqlTx::new(idempotency_mysql::begin(&pool).await.unwrap());
    let key = idempotency_core::testing::key("ended-under-the-action");
    let executed: Result<Outcome<i32>, idempotency_core::Error> = service
        .execute_in(
            &mut tx,
            Call::new("OP", key, &serde_json::json!({"n": 1})),
            async |conn| {
                sqlx::raw_sql("ROLLBACK").execute(conn).await.unwrap();
                Ok(ExecutionResult::success(1))
            },
        )
        .await;
    let error = executed.unwrap_err();
    let idempotency_core::Error::Store(StoreError::Conflict(source)) = &error else {
        panic!("not a conflict: {error:?}");
    };
    assert!(
        source.downcast_ref::<TransactionRolledBack>().is_some(),
        "the source is {source:?}"
    );
    let later = sqlx::query("INSERT INTO business (name) VALUES ('late')")
        .execute(&mut *tx)
        .await;
    assert!(
        later.is_err(),
        "a statement ran after the transaction ended"
    );
    assert!(tx.commit().await.is_err(), "the commit succeeded");
    assert_eq!(count(&pool, "SELECT COUNT(*) FROM business").await, 0);
    assert_eq!(
        count(&pool, "SELECT COUNT(*) FROM idempotency_records").await,
        0
    );
}
