//! Kafka topics of their own on the broker at `KAFKA_URL` (default `127.0.0.1:9092`), and a
//! consumer that reads a whole topic back.

use std::collections::BTreeMap;
use std::time::Duration;

use idempotency_outbox::publisher::kafka::KafkaPublisher;
use idempotency_outbox::publisher::kafka::rdkafka::admin::{AdminClient, AdminOptions};
use idempotency_outbox::publisher::kafka::rdkafka::client::DefaultClientContext;
use idempotency_outbox::publisher::kafka::rdkafka::consumer::{Consumer, StreamConsumer};
use idempotency_outbox::publisher::kafka::rdkafka::message::{Headers, Message};
use idempotency_outbox::publisher::kafka::rdkafka::{ClientConfig, Offset, TopicPartitionList};

use super::WAIT;

pub fn url() -> String {
    std::env::var("KAFKA_URL").unwrap_or_else(|_| "127.0.0.1:9092".to_owned())
}

/// One record as a consumer saw it.
#[derive(Debug, Clone)]
pub struct Record {
    pub partition: i32,
    pub offset: i64,
    pub key: String,
    pub payload: Vec<u8>,
    pub headers: BTreeMap<String, String>,
}

/// A topic of its own, `prefix.order` for the `order` aggregate type of `common::event`.
pub struct TestTopic {
    pub prefix: String,
    pub partitions: i32,
    pub url: String,
}

impl TestTopic {
    /// Creates `<prefix>.order` with `partitions` partitions.
    pub async fn new(partitions: i32) -> Self {
        let topic = Self::named(partitions);
        topic.create().await;
        topic
    }

    /// Names a topic without creating it.
    pub fn named(partitions: i32) -> Self {
        Self {
            prefix: idempotency_testing::unique_name("outbox").replace('_', "-"),
            partitions,
            url: url(),
        }
    }

    pub fn name(&self) -> String {
        format!("{}.order", self.prefix)
    }

    pub fn template(&self) -> String {
        format!("{}.{{aggregate_type}}", self.prefix)
    }

    /// A connected publisher to this topic's template, `message.timeout.ms` 2 s.
    pub fn publisher(&self) -> KafkaPublisher {
        KafkaPublisher::new(&self.url)
            .with_topic(&self.template())
            .unwrap()
            .with_message_timeout(Duration::from_secs(2))
            .connect()
            .unwrap()
    }

    pub async fn create(&self) {
        self.publisher()
            .ensure_topic(&self.name(), self.partitions)
            .await
            .unwrap();
    }

    /// Every record of the topic, read from the beginning until `expected` arrived and then
    /// `quiet` passed without another.
    pub async fn read(&self, expected: usize, quiet: Duration) -> Vec<Record> {
        let consumer: StreamConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.url)
            .set("group.id", idempotency_testing::unique_name("g"))
            .set("enable.auto.commit", "false")
            .create()
            .unwrap();
        let mut partitions = TopicPartitionList::new();
        for partition in 0..self.partitions {
            partitions
                .add_partition_offset(&self.name(), partition, Offset::Beginning)
                .unwrap();
        }
        consumer.assign(&partitions).unwrap();
        let mut out = Vec::with_capacity(expected);
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let wait = if out.len() >= expected {
                quiet
            } else {
                deadline.saturating_duration_since(tokio::time::Instant::now())
            };
            match tokio::time::timeout(wait, consumer.recv()).await {
                Ok(Ok(message)) => out.push(Record {
                    partition: message.partition(),
                    offset: message.offset(),
                    key: String::from_utf8(message.key().unwrap_or_default().to_vec()).unwrap(),
                    payload: message.payload().unwrap_or_default().to_vec(),
                    headers: message
                        .headers()
                        .map(|headers| {
                            headers
                                .iter()
                                .map(|h| {
                                    (
                                        h.key.to_owned(),
                                        String::from_utf8(h.value.unwrap_or_default().to_vec())
                                            .unwrap(),
                                    )
                                })
                                .collect()
                        })
                        .unwrap_or_default(),
                }),
                Ok(Err(error)) => panic!("consumer: {error}"),
                Err(_) if out.len() >= expected => return out,
                Err(_) => panic!(
                    "topic {} gave {} of {expected} records",
                    self.name(),
                    out.len()
                ),
            }
        }
    }

    pub async fn delete(&self) {
        let admin: Result<AdminClient<DefaultClientContext>, _> = ClientConfig::new()
            .set("bootstrap.servers", &self.url)
            .create();
        if let Ok(admin) = admin {
            let _ = admin
                .delete_topics(&[&self.name()], &AdminOptions::new())
                .await;
        }
    }
}
