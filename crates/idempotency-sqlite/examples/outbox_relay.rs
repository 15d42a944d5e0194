//! A charge and its `ChargeCreated` event commit together on SQLite; a relay publishes the
//! event after the commit (here to the log), and a rolled-back charge publishes nothing.
//!
//! ```sh
//! cargo run -p idempotency-sqlite --example outbox_relay
//! ```

#![allow(clippy::print_stdout)] // a program that prints what it did

use std::time::Duration;

use idempotency_core::config::{PersistenceConfig, SchemaMode};
use idempotency_outbox::config::OutboxConfig;
use idempotency_outbox::{LoggingPublisher, NewEvent, Relay};
use idempotency_sqlite::{SqliteOutbox, SqliteStore};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().with_env_filter("info").init();
    let mut persistence = PersistenceConfig::default();
    persistence.schema.mode = SchemaMode::Create;
    let store = SqliteStore::connect("sqlite::memory:", &persistence).await?;
    let pool = store.pool().clone();
    sqlx::query("CREATE TABLE charges (id TEXT PRIMARY KEY, amount_cents INTEGER NOT NULL)")
        .execute(&pool)
        .await?;
    let mut config = OutboxConfig::default();
    config.schema.mode = SchemaMode::Create;
    config.relay.poll_interval = Duration::from_millis(50); // SQLite has no notifications
    let outbox = SqliteOutbox::from_config(pool.clone(), &config).await?;
    let relay = Relay::new(outbox.clone(), LoggingPublisher::default(), &config)?.spawn();

    for (charge, commit) in [("ch_1", true), ("ch_2", false)] {
        let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
        sqlx::query("INSERT INTO charges (id, amount_cents) VALUES (?1, 4900)")
            .bind(charge)
            .execute(&mut *tx)
            .await?;
        let event = NewEvent::new(
            "charge",
            charge,
            "ChargeCreated",
            &serde_json::json!({"id": charge}),
        )?;
        outbox.enqueue(&mut tx, &event).await?;
        if commit {
            tx.commit().await?; // the charge and its event, together
        } else {
            tx.rollback().await?; // neither
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let report = relay.shutdown().await;
    println!(
        "published {} event(s), graceful: {}",
        report.totals.published, report.graceful
    );
    Ok(())
}
