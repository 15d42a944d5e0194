//! `schema.mode: create` over an existing schema while a writer's transaction is open on the
//! table: it completes without waiting for that transaction (a restart under load does not
//! stall, nor stall the writers behind it); and it still creates what is missing.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use idempotency_outbox::NewEvent;
use idempotency_outbox::config::Ordering;
use idempotency_pg::{PgInbox, PgOutbox, PgStore, TableName};
use sqlx::{AssertSqlSafe, PgPool};

/// Far longer than a catalog lookup; the writer's transaction stays open past it.
const BOUND: Duration = Duration::from_secs(5);

async fn exec(pool: &PgPool, sql: &str) {
    sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
        .execute(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

fn table(name: &str) -> TableName {
    TableName::parse(name).unwrap()
}

#[tokio::test]
async fn outbox_create_does_not_wait_for_an_open_enqueue() {
    let pool = idempotency_testing::pg_pool().await;
    let outbox = PgOutbox::with_options(pool.clone(), table("outbox"), Ordering::Ordered, None);
    outbox.create_schema().await.unwrap();
    let mut writer = pool.begin().await.unwrap();
    let event = NewEvent::new("order", "o1", "OrderPlaced", &1).unwrap();
    outbox.enqueue(&mut writer, &event).await.unwrap();
    let restarted = PgOutbox::with_options(pool.clone(), table("outbox"), Ordering::Ordered, None);
    tokio::time::timeout(BOUND, restarted.create_schema())
        .await
        .expect("create waited for the open enqueue")
        .unwrap();
    writer.commit().await.unwrap();
    assert!(outbox.schema_problems().await.unwrap().is_empty());
}

#[tokio::test]
async fn outbox_create_still_creates_a_missing_index() {
    let pool = idempotency_testing::pg_pool().await;
    let outbox = PgOutbox::with_options(pool.clone(), table("outbox"), Ordering::Ordered, None);
    outbox.create_schema().await.unwrap();
    exec(&pool, "DROP INDEX outbox_pending_idx").await;
    assert!(!outbox.schema_problems().await.unwrap().is_empty());
    outbox.create_schema().await.unwrap();
    assert!(outbox.schema_problems().await.unwrap().is_empty());
}

#[tokio::test]
async fn inbox_create_does_not_wait_for_an_open_insert() {
    let pool = idempotency_testing::pg_pool().await;
    let inbox = PgInbox::with_table(pool.clone(), table("inbox"));
    inbox.create_schema().await.unwrap();
    let mut writer = pool.begin().await.unwrap();
    sqlx::query("INSERT INTO inbox (consumer, message_id) VALUES ('c', 'm1')")
        .execute(&mut *writer)
        .await
        .unwrap();
    tokio::time::timeout(BOUND, inbox.create_schema())
        .await
        .expect("create waited for the open insert")
        .unwrap();
    writer.commit().await.unwrap();
    exec(&pool, "DROP INDEX inbox_received_at_idx").await;
    inbox.create_schema().await.unwrap();
    assert!(inbox.schema_problems().await.unwrap().is_empty());
}

#[tokio::test]
async fn records_create_does_not_wait_for_an_open_insert() {
    let pool = idempotency_testing::pg_pool().await;
    let store = PgStore::with_table(pool.clone(), table("idempotency_records"));
    store.create_schema().await.unwrap();
    let mut writer = pool.begin().await.unwrap();
    sqlx::query(
        "INSERT INTO idempotency_records (operation, idempotency_key, request_hash, status) \
         VALUES ('op', 'k1', 'h', 'PROCESSING')",
    )
    .execute(&mut *writer)
    .await
    .unwrap();
    tokio::time::timeout(BOUND, store.create_schema())
        .await
        .expect("create waited for the open insert")
        .unwrap();
    writer.commit().await.unwrap();
    exec(&pool, "DROP INDEX idempotency_records_expires_at_idx").await;
    store.create_schema().await.unwrap();
    assert!(store.schema_problems().await.unwrap().is_empty());
}
