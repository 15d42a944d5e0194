//! The consumer inbox on SQLite: a redelivered message is dropped, the record commits and rolls
//! back with the consumer's effects, a concurrent duplicate waits for the first, purge is
//! bounded.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

mod outbox_common;

use std::time::Duration;

use idempotency_core::config::SchemaMode;
use idempotency_outbox::config::{InboxConfig, Ordering};
use idempotency_outbox::store::Inbox;
use idempotency_outbox::{Error, OutboxMessage, Relay};
use idempotency_sqlite::SqliteInbox;
use outbox_common::*;
use sqlx::SqlitePool;

async fn inbox(pool: &SqlitePool) -> SqliteInbox {
    let config = InboxConfig {
        schema: idempotency_core::config::SchemaConfig {
            mode: SchemaMode::Create,
        },
        ..InboxConfig::default()
    };
    let inbox = SqliteInbox::from_config(pool.clone(), &config)
        .await
        .unwrap();
    sqlx::query("CREATE TABLE projection (message_id TEXT NOT NULL)")
        .execute(pool)
        .await
        .unwrap();
    inbox
}

/// A consumer: records the message and applies its effect in one transaction.
async fn consume(inbox: &SqliteInbox, message: &OutboxMessage, commit: bool) -> bool {
    let mut tx = inbox.pool().begin_with("BEGIN IMMEDIATE").await.unwrap();
    let new = inbox
        .record_id(&mut tx, "projector", message.id)
        .await
        .unwrap();
    if new {
        sqlx::query("INSERT INTO projection VALUES (?)")
            .bind(message.id.to_string())
            .execute(&mut *tx)
            .await
            .unwrap();
    }
    if commit {
        tx.commit().await.unwrap();
    } else {
        tx.rollback().await.unwrap();
    }
    new
}

#[tokio::test]
async fn a_redelivered_message_is_dropped() {
    let config = config(Ordering::Ordered);
    let (_, outbox) = fresh(&config).await;
    let inbox = inbox(outbox.pool()).await;
    let recorder = Recorder::default();
    commit(&outbox, &[event("a", 1)]).await;
    Relay::new(outbox.clone(), recorder.clone(), &config)
        .unwrap()
        .run_batch()
        .await
        .unwrap();
    let message = recorder.published().remove(0);

    assert!(
        consume(&inbox, &message, false).await,
        "new, then rolled back"
    );
    assert_eq!(
        scalar(inbox.pool(), "SELECT count(*) FROM inbox").await,
        0,
        "rolled back with the effect"
    );
    assert!(consume(&inbox, &message, true).await, "first delivery");
    assert!(!consume(&inbox, &message, true).await, "redelivery");
    assert!(!consume(&inbox, &message, true).await, "and again");
    assert_eq!(
        scalar(inbox.pool(), "SELECT count(*) FROM projection").await,
        1
    );
    // Another consumer processes the same message once for itself.
    let mut tx = inbox.pool().begin_with("BEGIN IMMEDIATE").await.unwrap();
    assert!(
        Inbox::record(&inbox, &mut tx, "auditor", &message.id.to_string())
            .await
            .unwrap()
    );
    tx.commit().await.unwrap();
}

#[tokio::test]
async fn names_are_bounded_and_purge_deletes_old_entries_in_batches() {
    let (_, outbox) = fresh(&config(Ordering::Ordered)).await;
    let inbox = inbox(outbox.pool()).await;
    let mut tx = inbox.pool().begin_with("BEGIN IMMEDIATE").await.unwrap();
    for (consumer, id) in [("", "m"), ("c", ""), ("c", &"x".repeat(256))] {
        let error = inbox.record(&mut tx, consumer, id).await.unwrap_err();
        assert!(matches!(error, Error::InvalidEvent { .. }), "{error:?}");
    }
    for n in 0..5 {
        assert!(inbox.record(&mut tx, "c", &format!("m-{n}")).await.unwrap());
    }
    tx.commit().await.unwrap();
    assert_eq!(
        inbox
            .purge_older_than(Duration::from_secs(3600), 2)
            .await
            .unwrap(),
        0
    );
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(
        Inbox::purge(&inbox, Duration::from_millis(1), 2)
            .await
            .unwrap(),
        2
    );
    assert_eq!(
        inbox
            .purge_older_than(Duration::from_millis(1), 2)
            .await
            .unwrap(),
        3
    );
    assert_eq!(scalar(inbox.pool(), "SELECT count(*) FROM inbox").await, 0);
}

#[tokio::test]
async fn injection_through_the_inbox_table_name_is_an_error_not_sql() {
    let (store, _outbox) = fresh(&config(Ordering::Ordered)).await;
    let pool = store.pool().clone();
    sqlx::query("CREATE TABLE victim (id INTEGER)")
        .execute(&pool)
        .await
        .unwrap();
    for name in [
        "inbox; DROP TABLE victim",
        "inbox\"; DROP TABLE victim; --",
        "other.inbox",
        "",
    ] {
        let config = InboxConfig {
            table_name: name.to_owned(),
            schema: idempotency_core::config::SchemaConfig {
                mode: SchemaMode::Create,
            },
            ..InboxConfig::default()
        };
        let error = SqliteInbox::from_config(pool.clone(), &config)
            .await
            .unwrap_err();
        assert!(
            matches!(error, Error::InvalidName { .. }),
            "{name}: {error:?}"
        );
    }
    assert_eq!(
        scalar(&pool, "SELECT count(*) FROM victim").await,
        0,
        "the victim table is still there"
    );
}

/// A statement that rolled the consumer's transaction back (`INSERT OR ROLLBACK` on a taken
/// key) left the connection in autocommit: the inbox entry must not commit on its own, or the
/// redelivery would be dropped with none of the consumer's effects applied (before: it did).
#[tokio::test]
async fn an_entry_after_a_statement_rolled_the_transaction_back_is_not_written() {
    let (_, outbox) = fresh(&config(Ordering::Unordered)).await;
    let inbox = inbox(outbox.pool()).await;
    sqlx::raw_sql("CREATE TABLE applied (id INTEGER PRIMARY KEY); INSERT INTO applied VALUES (1)")
        .execute(inbox.pool())
        .await
        .unwrap();
    let mut tx = inbox.pool().begin_with("BEGIN IMMEDIATE").await.unwrap();
    sqlx::query("INSERT OR ROLLBACK INTO applied VALUES (1)")
        .execute(&mut *tx)
        .await
        .unwrap_err();
    let error = inbox.record(&mut tx, "consumer", "m-1").await.unwrap_err();
    assert!(
        matches!(error, Error::Database(_)),
        "not retryable: {error:?}"
    );
    tx.rollback().await.unwrap();
    let mut tx = inbox.pool().begin_with("BEGIN IMMEDIATE").await.unwrap();
    assert!(
        inbox.record(&mut tx, "consumer", "m-1").await.unwrap(),
        "the message is new: nothing was recorded"
    );
    tx.commit().await.unwrap();
}

/// The same inside a nested sqlx transaction (a savepoint): the connection goes back to the
/// pool in the state sqlx counts, neither inside a transaction that would swallow the next
/// user's commit nor counted in one (before: sqlx's rollbacks named savepoints that were
/// gone, and every later `BEGIN IMMEDIATE` on the connection was refused).
#[tokio::test]
async fn a_refused_entry_in_a_nested_transaction_leaves_no_transaction_behind() {
    let path = temp_db_path();
    let options = idempotency_sqlite::connect_options(as_str(&path)).unwrap();
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(options.clone())
        .await
        .unwrap();
    let inbox = inbox(&pool).await;
    sqlx::raw_sql("CREATE TABLE applied (id INTEGER PRIMARY KEY); INSERT INTO applied VALUES (1)")
        .execute(&pool)
        .await
        .unwrap();
    {
        let mut tx = pool.begin().await.unwrap();
        let mut inner = sqlx::Connection::begin(&mut *tx).await.unwrap();
        sqlx::query("INSERT OR ROLLBACK INTO applied VALUES (1)")
            .execute(&mut *inner)
            .await
            .unwrap_err();
        let error = inbox
            .record(&mut inner, "consumer", "m-1")
            .await
            .unwrap_err();
        assert!(
            matches!(error, Error::Database(_)),
            "not retryable: {error:?}"
        );
    }
    // The pool's one connection, next user: its commit is seen from another connection.
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
    sqlx::query("INSERT INTO applied VALUES (2)")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let other = SqlitePool::connect_with(options).await.unwrap();
    let applied: i64 = sqlx::query_scalar("SELECT count(*) FROM applied")
        .fetch_one(&other)
        .await
        .unwrap();
    assert_eq!(applied, 2, "the next user's commit was swallowed");
}
