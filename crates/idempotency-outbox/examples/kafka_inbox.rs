//! The consumer side of the Kafka publisher: an rdkafka `StreamConsumer` in a consumer group
//! that applies each outbox event once, through the PostgreSQL inbox.
//!
//! For each record: read its `Outbox-Id` header (the outbox id), then in **one database
//! transaction** record `(group, id)` in the inbox and, when the inbox had not seen it, apply
//! the event's effects (here: count it in a projection table); commit that transaction, and
//! only **then** commit the record's offset to Kafka. A crash between the two commits
//! redelivers the record to the group, and the inbox drops it; a crash before the database
//! commit loses nothing either (neither the inbox entry nor the effects were written, the
//! offset was not committed). A relay that republished an event (Kafka keeps no message id)
//! shows up as a second record with the same `Outbox-Id`: dropped the same way.
//!
//! ```text
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres KAFKA_URL=127.0.0.1:9092 \
//!   cargo run -p idempotency-outbox --features kafka --example kafka_inbox -- outbox.order billing
//! ```
//!
//! `tests/kafka.rs` runs this file's [`run`] against the broker and PostgreSQL (duplicates
//! dropped, offsets committed, a restarted group applying nothing twice, a record that failed
//! applied by the next consumer).

use std::future::Future;

use idempotency_outbox::config::InboxConfig;
use idempotency_outbox::publisher::headers;
use idempotency_outbox::publisher::kafka::rdkafka::ClientConfig;
use idempotency_outbox::publisher::kafka::rdkafka::consumer::{
    CommitMode, Consumer, StreamConsumer,
};
use idempotency_outbox::publisher::kafka::rdkafka::error::KafkaError;
use idempotency_outbox::publisher::kafka::rdkafka::message::{BorrowedMessage, Headers, Message};
use idempotency_pg::PgInbox;
use idempotency_pg::sqlx::{self, PgConnection, PgPool};
use uuid::Uuid;

/// Why the consumer stopped. Nothing of the record in hand was committed anywhere: it is
/// delivered again to the group's next consumer ([`run`] took and dropped this one).
#[derive(Debug, thiserror::Error)]
pub enum ConsumeError {
    /// Kafka: receiving, or committing an offset.
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
    /// The inbox (its table, or the transaction it must be in).
    #[error("inbox: {0}")]
    Inbox(#[from] idempotency_outbox::Error),
    /// The database, applying the effects or committing.
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
}

/// What a run did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Consumed {
    /// Records applied: the inbox had not seen their outbox id.
    pub applied: u64,
    /// Records dropped by the inbox: their outbox id was applied before (a republished event,
    /// or a record redelivered after a crash between the database and the offset commit).
    pub duplicates: u64,
    /// Records without an `Outbox-Id` header holding an outbox id (a UUID): not from the
    /// outbox, skipped (offset committed).
    pub foreign: u64,
}

/// The projection this consumer maintains: events per aggregate.
pub const PROJECTION_DDL: &str = "CREATE TABLE IF NOT EXISTS order_events (\
     aggregate_id text PRIMARY KEY, events bigint NOT NULL)";

/// A consumer in `group`, subscribed to `topic`: offsets committed by hand only
/// (`enable.auto.commit=false`), a new group reading from the earliest record.
pub fn consumer(brokers: &str, group: &str, topic: &str) -> Result<StreamConsumer, KafkaError> {
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()?;
    consumer.subscribe(&[topic])?;
    Ok(consumer)
}

/// The record's outbox id, from its `Outbox-Id` header: `None` when it has none, or one that
/// is not an outbox id (the outbox writes a UUID). Such a record is not from the outbox; were
/// an empty or 300-character id passed on, the inbox would refuse it on every delivery and the
/// partition would stop there.
fn outbox_id(message: &BorrowedMessage<'_>) -> Option<Uuid> {
    let headers = message.headers()?;
    headers
        .iter()
        .find(|header| header.key == headers::ID)
        .and_then(|header| header.value)
        .and_then(|value| Uuid::try_parse_ascii(value).ok())
}

/// The event's effects, in the inbox's transaction.
async fn apply(tx: &mut PgConnection, message: &BorrowedMessage<'_>) -> Result<(), sqlx::Error> {
    let aggregate = String::from_utf8_lossy(message.key().unwrap_or_default()).into_owned();
    sqlx::query(
        "INSERT INTO order_events (aggregate_id, events) VALUES ($1, 1) \
         ON CONFLICT (aggregate_id) DO UPDATE SET events = order_events.events + 1",
    )
    .bind(aggregate)
    .execute(tx)
    .await?;
    Ok(())
}

/// Applies one record: inbox entry and effects in one transaction, committed; then the offset.
async fn handle(
    consumer: &StreamConsumer,
    pool: &PgPool,
    inbox: &PgInbox,
    group: &str,
    message: &BorrowedMessage<'_>,
    consumed: &mut Consumed,
) -> Result<(), ConsumeError> {
    match outbox_id(message) {
        None => consumed.foreign += 1,
        Some(id) => {
            let mut tx = idempotency_pg::begin(pool).await?;
            if inbox.record_id(&mut tx, group, id).await? {
                apply(&mut tx, message).await?;
                consumed.applied += 1;
            } else {
                consumed.duplicates += 1;
            }
            tx.commit().await?;
        }
    }
    // Only now: a crash before this line redelivers the record, which the inbox drops.
    consumer.commit_message(message, CommitMode::Sync)?;
    Ok(())
}

/// Consumes until `stop` resolves (between records) or an error, which leaves the record in
/// hand uncommitted on both sides.
///
/// It takes the consumer and drops it on an error: librdkafka's position is already past the
/// record that failed, so a consumer kept for another `run` would read the next record, whose
/// offset commit covers the failed one, and that one would never be applied. A new consumer
/// ([`consumer`]) starts from the group's committed offset: the failed record again.
pub async fn run(
    consumer: StreamConsumer,
    pool: &PgPool,
    inbox: &PgInbox,
    group: &str,
    stop: impl Future<Output = ()>,
) -> Result<Consumed, ConsumeError> {
    let mut consumed = Consumed::default();
    let mut stop = std::pin::pin!(stop);
    loop {
        let message = tokio::select! {
            biased;
            () = &mut stop => return Ok(consumed),
            message = consumer.recv() => message?,
        };
        handle(&consumer, pool, inbox, group, &message, &mut consumed).await?;
    }
}

/// The inbox (table `inbox`, created when missing) and the projection table.
pub async fn prepare(pool: &PgPool) -> Result<PgInbox, ConsumeError> {
    let mut config = InboxConfig::default();
    config.schema.mode = idempotency_core::config::SchemaMode::Create;
    let inbox = PgInbox::from_config(pool.clone(), &config).await?;
    sqlx::query(PROJECTION_DDL).execute(pool).await?;
    Ok(inbox)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt::init();
    let mut args = std::env::args().skip(1);
    let topic = args.next().unwrap_or_else(|| "outbox.order".to_owned());
    let group = args.next().unwrap_or_else(|| "billing".to_owned());
    let brokers = std::env::var("KAFKA_URL").unwrap_or_else(|_| "127.0.0.1:9092".to_owned());
    let database = std::env::var("DATABASE_URL")?;
    let pool = PgPool::connect(&database).await?;
    let inbox = prepare(&pool).await?;
    let consumer = consumer(&brokers, &group, &topic)?;
    tracing::info!(%topic, %group, "consuming; Ctrl-C stops");
    let stop = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let consumed = run(consumer, &pool, &inbox, &group, stop).await?;
    tracing::info!(?consumed, "stopped");
    Ok(())
}
