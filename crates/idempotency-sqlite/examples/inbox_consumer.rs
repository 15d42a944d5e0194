//! A consumer that applies each message once, whatever the broker redelivers: the inbox
//! records the message id in the consumer's own transaction, next to the message's effects.
//!
//! ```sh
//! cargo run -p idempotency-sqlite --example inbox_consumer
//! ```

#![allow(clippy::print_stdout)] // a program that prints what it did

use idempotency_core::config::SchemaMode;
use idempotency_outbox::config::InboxConfig;
use idempotency_sqlite::SqliteInbox;
use sqlx::SqlitePool;
use sqlx::sqlite::SqlitePoolOptions;

/// Applies a `ChargeCreated` message to a read model, once per message id.
async fn consume(
    pool: &SqlitePool,
    inbox: &SqliteInbox,
    message_id: &str,
    amount: i64,
) -> Result<bool, Box<dyn std::error::Error>> {
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
    let new = inbox
        .record(&mut tx, "revenue-projector", message_id)
        .await?;
    if new {
        sqlx::query("UPDATE revenue SET total_cents = total_cents + ?1")
            .bind(amount)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?; // then acknowledge the delivery to the broker
    Ok(new)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // `reusable` keeps a connection released inside a transaction out of the pool (as
    // `idempotency_sqlite::open_pool` does for a file).
    let pool = SqlitePoolOptions::new()
        .after_release(|conn, _| Box::pin(idempotency_sqlite::reusable(conn)))
        .connect("sqlite::memory:")
        .await?;
    sqlx::raw_sql(
        "CREATE TABLE revenue (total_cents INTEGER NOT NULL); INSERT INTO revenue VALUES (0);",
    )
    .execute(&pool)
    .await?;
    let mut config = InboxConfig::default();
    config.schema.mode = SchemaMode::Create;
    let inbox = SqliteInbox::from_config(pool.clone(), &config).await?;

    // The broker delivers m-1 twice (a redelivery after a lost ack), then m-2.
    for (message, amount) in [("m-1", 4900), ("m-1", 4900), ("m-2", 1500)] {
        let applied = consume(&pool, &inbox, message, amount).await?;
        println!(
            "{message}: {}",
            if applied {
                "applied"
            } else {
                "duplicate, skipped"
            }
        );
    }
    let total: i64 = sqlx::query_scalar("SELECT total_cents FROM revenue")
        .fetch_one(&pool)
        .await?;
    println!("revenue: {total} cents"); // 6400, not 11300
    assert_eq!(total, 6400);
    Ok(())
}
