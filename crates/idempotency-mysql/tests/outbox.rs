//! The outbox and inbox on MySQL / MariaDB beyond the conformance suite: writes outside a
//! transaction are refused, names leave room for `<table>_sequences`, and the single-relay
//! `GET_LOCK` mode lets one process claim at a time.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

use std::time::Duration;

use idempotency_core::config::SchemaMode;
use idempotency_mysql::{DEFAULT_RELAY_LOCK, MysqlInbox, MysqlOutbox};
use idempotency_outbox::config::{InboxConfig, Ordering, OutboxConfig};
use idempotency_outbox::store::{ClaimRequest, RelayStore};
use idempotency_outbox::{Error, NewEvent};
use sqlx::MySqlPool;
use uuid::Uuid;

fn outbox_config(table: &str) -> OutboxConfig {
    let mut config = OutboxConfig {
        table_name: table.to_owned(),
        ..OutboxConfig::default()
    };
    config.schema.mode = SchemaMode::Create;
    config
}

fn event(aggregate: &str) -> NewEvent {
    NewEvent::new("order", aggregate, "Placed", &serde_json::json!({"n": 1})).unwrap()
}

fn request() -> ClaimRequest {
    ClaimRequest {
        limit: 10,
        lease: Duration::from_secs(30),
        token: Uuid::now_v7(),
        ordering: Ordering::Ordered,
        max_attempts: 5,
    }
}

async fn pending(pool: &MySqlPool) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM outbox")
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn enqueue_and_inbox_record_refuse_a_connection_outside_a_transaction() {
    let pool = idempotency_testing::mysql_pool().await;
    let outbox = MysqlOutbox::from_config(pool.clone(), &outbox_config("outbox"))
        .await
        .unwrap();
    let mut inbox_config = InboxConfig::default();
    inbox_config.schema.mode = SchemaMode::Create;
    let inbox = MysqlInbox::from_config(pool.clone(), &inbox_config)
        .await
        .unwrap();
    let mut conn = pool.acquire().await.unwrap();
    let error = outbox.enqueue(&mut conn, &event("o-1")).await.unwrap_err();
    assert!(matches!(error, Error::NotInTransaction { .. }), "{error:?}");
    let error = inbox.record(&mut conn, "c", "m-1").await.unwrap_err();
    assert!(matches!(error, Error::NotInTransaction { .. }), "{error:?}");
    drop(conn);
    assert_eq!(pending(&pool).await, 0);
}

#[tokio::test]
async fn outbox_names_leave_room_for_their_sequences_table() {
    let pool = idempotency_testing::mysql_pool().await;
    let longest = "o".repeat(54);
    let outbox = MysqlOutbox::from_config(pool.clone(), &outbox_config(&longest))
        .await
        .unwrap();
    assert_eq!(outbox.sequences_table().name().len(), 64);
    assert_eq!(outbox.schema_problems().await.unwrap(), vec![]);
    let error = MysqlOutbox::from_config(pool, &outbox_config(&"o".repeat(55)))
        .await
        .unwrap_err();
    assert!(matches!(error, Error::InvalidName { .. }), "{error:?}");
    let error = MysqlOutbox::from_config(
        idempotency_testing::mysql_pool().await,
        &outbox_config("o`; DROP TABLE x"),
    )
    .await
    .unwrap_err();
    assert!(matches!(error, Error::InvalidName { .. }), "{error:?}");
}

/// Two relay processes in the single-relay mode: the one holding `GET_LOCK` claims, the other
/// gets nothing; when the holder's session ends the other takes over at its next claim.
#[tokio::test]
async fn in_the_single_relay_mode_one_process_claims_at_a_time() {
    let pool = idempotency_testing::mysql_pool().await;
    // A lock name of this test's own: the server's lock names are global.
    let lock = format!("{DEFAULT_RELAY_LOCK}:{}", Uuid::now_v7().simple());
    let first = MysqlOutbox::from_config(pool.clone(), &outbox_config("outbox"))
        .await
        .unwrap()
        .with_single_relay(&lock)
        .unwrap();
    let second = MysqlOutbox::from_config(pool.clone(), &outbox_config("outbox"))
        .await
        .unwrap()
        .with_single_relay(&lock)
        .unwrap();
    let mut tx = pool.begin().await.unwrap();
    first.enqueue(&mut tx, &event("o-1")).await.unwrap();
    first.enqueue(&mut tx, &event("o-2")).await.unwrap();
    tx.commit().await.unwrap();

    assert!(first.claim(&request()).await.unwrap().messages.len() == 2);
    let mut tx = pool.begin().await.unwrap();
    first.enqueue(&mut tx, &event("o-3")).await.unwrap();
    tx.commit().await.unwrap();
    assert!(second.claim(&request()).await.unwrap().messages.is_empty());

    // The holder's session ends (here: the server kills it); the lock goes with it.
    let thread: i64 = sqlx::query_scalar("SELECT CAST(IS_USED_LOCK(?) AS SIGNED)")
        .bind(&lock)
        .fetch_one(&pool)
        .await
        .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("KILL CONNECTION {thread}")))
        .execute(&pool)
        .await
        .unwrap();
    let mut taken = Vec::new();
    for _ in 0..50 {
        taken = second.claim(&request()).await.unwrap().messages;
        if !taken.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(taken.len(), 1, "the second relay did not take over");
    assert_eq!(taken[0].aggregate_id, "o-3");
    // The first relay's next claim fails on its dead connection, then finds the lock taken.
    let _ = first.claim(&request()).await;
    assert!(first.claim(&request()).await.unwrap().messages.is_empty());
}

/// `utf8mb4_bin` is PAD SPACE: `m-1` and `m-1 ` compare equal, so the second would be skipped
/// as a redelivery of the first, and `a1 ` would share `a1`'s sequence counter. Values with a
/// trailing space are refused before anything is written.
#[tokio::test]
async fn values_with_a_trailing_space_are_refused_instead_of_merged() {
    let pool = idempotency_testing::mysql_pool().await;
    let mut config = outbox_config("outbox");
    config.ordering = Ordering::Ordered;
    let outbox = MysqlOutbox::from_config(pool.clone(), &config)
        .await
        .unwrap();
    let mut inbox_config = InboxConfig::default();
    inbox_config.schema.mode = SchemaMode::Create;
    let inbox = MysqlInbox::from_config(pool.clone(), &inbox_config)
        .await
        .unwrap();
    let mut tx = idempotency_mysql::begin(&pool).await.unwrap();
    assert!(inbox.record(&mut tx, "consumer", "m-1").await.unwrap());
    let padded = inbox.record(&mut tx, "consumer", "m-1 ").await;
    assert!(
        matches!(padded, Err(Error::InvalidEvent { .. })),
        "{padded:?}"
    );
    let padded = inbox.record(&mut tx, "consumer ", "m-2").await;
    assert!(
        matches!(padded, Err(Error::InvalidEvent { .. })),
        "{padded:?}"
    );
    outbox.enqueue(&mut tx, &event("a1")).await.unwrap();
    let padded = outbox.enqueue(&mut tx, &event("a1 ")).await;
    assert!(
        matches!(padded, Err(Error::InvalidEvent { .. })),
        "{padded:?}"
    );
    let padded_type = NewEvent::new("order ", "a2", "Placed", &serde_json::json!({})).unwrap();
    let padded = outbox.enqueue(&mut tx, &padded_type).await;
    assert!(
        matches!(padded, Err(Error::InvalidEvent { .. })),
        "{padded:?}"
    );
    tx.commit().await.unwrap();
    assert_eq!(pending(&pool).await, 1);
}

/// An outbox whose counters are unsigned (`attempts INT UNSIGNED`, a natural choice for a
/// hand-written table) fails validation, naming the column: sqlx decodes an unsigned integer
/// into no signed one, so every claim would fail and the relay would deliver nothing, with a
/// warning per poll (before: it validated, as `DATA_TYPE` is `int` either way).
#[tokio::test]
async fn unsigned_counters_fail_validation() {
    let pool = idempotency_testing::mysql_pool().await;
    let table = idempotency_mysql::TableName::parse("uns_outbox").unwrap();
    let ddl = idempotency_mysql::outbox_ddl(&table).unwrap();
    let unsigned = ddl.replace(
        "INT           NOT NULL DEFAULT 0",
        "INT UNSIGNED NOT NULL DEFAULT 0",
    );
    assert_ne!(unsigned, ddl, "the DDL names attempts as the test expects");
    sqlx::raw_sql(sqlx::AssertSqlSafe(unsigned))
        .execute(&pool)
        .await
        .unwrap();
    let mut config = outbox_config("uns_outbox");
    config.schema.mode = SchemaMode::Validate;
    let error = MysqlOutbox::from_config(pool.clone(), &config)
        .await
        .unwrap_err();
    let text = error.to_string();
    assert!(text.contains("attempts"), "{text}");
    assert!(text.contains("unsigned"), "{text}");
    // The canonical table validates.
    let mut config = outbox_config("signed_outbox");
    MysqlOutbox::from_config(pool.clone(), &config)
        .await
        .unwrap();
    config.schema.mode = SchemaMode::Validate;
    MysqlOutbox::from_config(pool, &config).await.unwrap();
}
