//! The relay's drain to Kafka (the broker at `KAFKA_URL`, default `127.0.0.1:9092`: tansu in
//! `scripts/services.sh`), beside the drain to JetStream in the same run: the same backlog,
//! configuration and workers, a topic of its own with 3 partitions, every delivery report
//! awaited.

use idempotency_outbox::Relay;
use idempotency_outbox::publisher::kafka::KafkaPublisher;
use idempotency_outbox::publisher::kafka::rdkafka::ClientConfig;
use idempotency_outbox::publisher::kafka::rdkafka::admin::{AdminClient, AdminOptions};
use idempotency_outbox::publisher::kafka::rdkafka::client::DefaultClientContext;

use crate::idempotency::Setup;
use crate::outbox::{backlog, drain_config, drop_outbox, publisher_alone, run_until_published};

/// Partitions of a bench topic: an aggregate's events share one (the record key).
const PARTITIONS: i32 = 3;

fn url() -> String {
    std::env::var("KAFKA_URL").unwrap_or_else(|_| "127.0.0.1:9092".to_owned())
}

/// A publisher to `<prefix>.drain` (the drain's aggregate type), the topic made first.
async fn topic_publisher(prefix: &str) -> KafkaPublisher {
    let publisher = KafkaPublisher::new(&url())
        .with_topic(&format!("{prefix}.{{aggregate_type}}"))
        .expect("topic template")
        .connect()
        .expect("kafka producer");
    publisher
        .ensure_topic(&format!("{prefix}.drain"), PARTITIONS)
        .await
        .expect("kafka topic");
    publisher
}

async fn delete_topic(prefix: &str) {
    let admin: Result<AdminClient<DefaultClientContext>, _> =
        ClientConfig::new().set("bootstrap.servers", url()).create();
    if let Ok(admin) = admin {
        let _ = admin
            .delete_topics(&[&format!("{prefix}.drain")], &AdminOptions::new())
            .await;
    }
}

/// Drains `events` pending events (over `aggregates` aggregates, ordered) from the PostgreSQL
/// outbox with a relay of `workers` workers and `batch` rows per claim, publishing to Kafka
/// and awaiting each delivery report, as [`crate::outbox::relay_drain`] does to JetStream.
/// Returns events/s.
pub(crate) async fn relay_drain(
    setup: &Setup,
    events: usize,
    aggregates: usize,
    workers: usize,
    batch: u32,
) -> f64 {
    let table = idempotency_testing::unique_name("kdrain");
    let config = drain_config(&table, workers, batch);
    let outbox = backlog(setup, &config, events, aggregates).await;
    let prefix = table.replace('_', "-");
    let publisher = topic_publisher(&prefix).await;
    let relay = Relay::new(outbox, publisher, &config).expect("relay");
    let elapsed = run_until_published(&relay, events).await;
    drop_outbox(setup, &table).await;
    delete_topic(&prefix).await;
    events as f64 / elapsed.as_secs_f64()
}

/// The broker's side alone: the same messages published to a topic of their own by
/// `workers` tasks with `batch` publishes in flight each, no database. Returns events/s.
pub(crate) async fn kafka_alone(
    events: usize,
    aggregates: usize,
    workers: usize,
    batch: usize,
) -> f64 {
    let prefix = idempotency_testing::unique_name("kfloor").replace('_', "-");
    let publisher = topic_publisher(&prefix).await;
    let rate = publisher_alone(publisher, events, aggregates, workers, batch).await;
    delete_topic(&prefix).await;
    rate
}
