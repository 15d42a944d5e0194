//! Publishes outbox rows that were already published once more, through the library's NATS
//! publisher, as a relay does after a lost ack: JetStream must ack each copy as a duplicate
//! (its `Nats-Msg-Id` is in the stream's duplicate window) and store none of them. Run after a
//! stream leader change, it shows that the window survived the change.

use std::collections::BTreeMap;

use idempotency_outbox::publisher::nats::NatsPublisher;
use idempotency_outbox::publisher::nats::async_nats;
use idempotency_outbox::uuid::Uuid;
use idempotency_outbox::{OutboxMessage, Publisher};
use serde::Serialize;
use sqlx::{AssertSqlSafe, PgPool};

use crate::Error;

/// What [`run`] sent and what JetStream said.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Republished {
    /// Copies sent (one per published row taken).
    pub sent: u64,
    /// Copies JetStream acked as duplicates (dropped, not stored).
    pub duplicates: u64,
    /// Copies JetStream acked as new: stored a second time.
    pub stored_again: u64,
    /// Copies that failed (no ack).
    pub failed: u64,
}

type Row = (Uuid, String, String, Option<i64>, String, String);

/// Publishes the `count` earliest-published rows of `table` (a plain identifier) again to
/// `subject` (the relay's template) through `client`.
pub async fn run(
    pool: &PgPool,
    table: &str,
    client: async_nats::Client,
    subject: &str,
    count: u32,
) -> Result<Republished, Error> {
    if table.is_empty()
        || !table
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_')
    {
        return Err(Error::Invalid(format!("not a plain table name: {table}")));
    }
    let sql = format!(
        "SELECT id, aggregate_type, aggregate_id, sequence, event_type, payload::text \
         FROM {table} WHERE published_at IS NOT NULL ORDER BY published_at, id LIMIT $1"
    );
    let rows: Vec<Row> = sqlx::query_as(AssertSqlSafe(sql))
        .bind(i64::from(count))
        .fetch_all(pool)
        .await?;
    let publisher = NatsPublisher::new(client).with_subject(subject)?;
    let mut republished = Republished::default();
    for (id, aggregate_type, aggregate_id, sequence, event_type, payload) in rows {
        let message = OutboxMessage::new(
            id,
            aggregate_type,
            aggregate_id,
            sequence,
            event_type,
            payload,
            BTreeMap::new(),
            chrono::Utc::now(),
            1,
        );
        republished.sent += 1;
        match publisher.publish(&message).await {
            Ok(ack) if ack.duplicate => republished.duplicates += 1,
            Ok(_) => republished.stored_again += 1,
            Err(error) => {
                tracing::warn!(%id, error = %error.chain(), "republish failed");
                republished.failed += 1;
            }
        }
    }
    Ok(republished)
}
