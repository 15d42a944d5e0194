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
