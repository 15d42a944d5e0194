//! `outbox.publisher: kafka` through the facade: the service built from YAML publishes an
//! event committed with its idempotency record to the topic, creating the topic; a fixed topic
//! is made at start-up with its partitions; settings that cannot work stop start-up naming
//! themselves. On SQLite files and the Kafka-protocol broker at `KAFKA_URL` (default
//! `127.0.0.1:9092`; `scripts/services.sh` starts tansu there).

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use idempotency::outbox::NewEvent;
use idempotency::outbox::publisher::headers;
use idempotency::outbox::publisher::kafka::rdkafka::admin::{AdminClient, AdminOptions};
use idempotency::outbox::publisher::kafka::rdkafka::client::DefaultClientContext;
use idempotency::outbox::publisher::kafka::rdkafka::consumer::{Consumer, StreamConsumer};
use idempotency::outbox::publisher::kafka::rdkafka::message::{Headers, Message};
use idempotency::outbox::publisher::kafka::rdkafka::util::Timeout;
use idempotency::outbox::publisher::kafka::rdkafka::{ClientConfig, Offset, TopicPartitionList};
use idempotency::{
    Call, EnqueueInTx, ExecutionResult, Idempotency, IdempotencyKey, Loader, Settings,
};

fn unique() -> String {
    uuid::Uuid::now_v7().simple().to_string()
}

fn kafka_url() -> String {
    std::env::var("KAFKA_URL").unwrap_or_else(|_| "127.0.0.1:9092".to_owned())
}

fn settings(yaml: &str) -> Settings {
    let file = std::env::temp_dir().join(format!("idempotency-kafka-{}.yaml", unique()));
    std::fs::write(&file, yaml).unwrap();
    let loaded = Loader::new()
        .file(&file)
        .environment(Vec::<(String, String)>::new())
        .load();
    std::fs::remove_file(&file).unwrap();
    loaded.unwrap_or_else(|e| panic!("{yaml}: {e}"))
}

async fn sqlite() -> sqlx::SqlitePool {
    let path = std::env::temp_dir().join(format!("idempotency-kafka-{}.db", unique()));
    sqlx::SqlitePool::connect(&format!("sqlite://{}?mode=rwc", path.display()))
        .await
        .unwrap()
}

/// The settings of a service on SQLite whose relay publishes to Kafka with `kafka` (the
/// lines under `kafka:`, indented by 6).
fn yaml(kafka: &str) -> String {
    // No Redis: with feature `redis` (`--all-features`) the L2 cache is on by default and
    // would need a URL; without it the section is not known.
    let no_redis = if cfg!(feature = "redis") {
        "  distributed-cache:\n    enabled: false\n"
    } else {
        ""
    };
    format!(
        "idempotency:\n  persistence:\n    schema:\n      mode: create\n{no_redis}\
         outbox:\n  schema:\n    mode: create\n  notify-channel: null\n  relay:\n    wake-up: poll\n    poll-interval: 50ms\n\
         \x20 publisher:\n    kafka:\n{kafka}"
    )
}

async fn refusal(yaml: &str) -> String {
    match Idempotency::from_config(&settings(yaml), sqlite().await).await {
        Ok(_) => panic!("{yaml}: accepted"),
        Err(error) => error.to_string(),
    }
}

fn admin() -> AdminClient<DefaultClientContext> {
    ClientConfig::new()
        .set("bootstrap.servers", kafka_url())
        .create()
        .unwrap()
}

/// The partition count of `topic` as the broker reports it (0: no such topic).
fn partitions(topic: &str) -> usize {
    let metadata = admin()
        .inner()
        .fetch_metadata(Some(topic), Timeout::After(Duration::from_secs(5)))
        .unwrap();
    metadata
        .topics()
        .iter()
        .find(|t| t.name() == topic && t.error().is_none())
        .map_or(0, |t| t.partitions().len())
}

async fn delete(topic: &str) {
    let _ = admin().delete_topics(&[topic], &AdminOptions::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_enqueued_in_the_transaction_reaches_kafka_through_the_configured_publisher() {
    let prefix = format!("t{}", unique());
    let topic = format!("{prefix}.order");
    let yaml = yaml(&format!(
        "      brokers: {}\n      topic: \"{prefix}.{{aggregate_type}}\"\n      create: true\n      partitions: 2\n",
        kafka_url()
    ));
    let pool = sqlite().await;
    let idempotency = Idempotency::from_config(&settings(&yaml), pool.clone())
        .await
        .unwrap();
    let outbox = idempotency.outbox().unwrap().clone();
    let service = idempotency.service();

    // One committed with its idempotency record, one rolled back with its failed action.
    let mut committed = None;
    for (key, fail) in [("k-commit", false), ("k-rollback", true)] {
        let mut tx = service.begin().await.unwrap();
        let call = Call::new("ORDER", IdempotencyKey::new(key).unwrap(), &key);
        service
            .execute_in(&mut tx, call, async |_conn| {
                Ok::<_, idempotency::core::Error>(ExecutionResult::success(()))
            })
            .await
            .unwrap();
        let event = NewEvent::new(
            "order",
            key,
            "OrderCreated",
            &serde_json::json!({ "key": key }),
        )
        .unwrap();
        if !fail {
            committed = Some(event.id());
        }
        tx.enqueue(&outbox, event).await.unwrap();
        if fail {
            tx.rollback().await.unwrap();
        } else {
            tx.commit().await.unwrap();
        }
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let published: i64 =
            sqlx::query_scalar("SELECT count(*) FROM outbox WHERE published_at IS NOT NULL")
                .fetch_one(&pool)
                .await
                .unwrap();
        if published == 1 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "not published");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(partitions(&topic), 2, "created on first use, 2 partitions");

    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", kafka_url())
        .set("group.id", format!("g{}", unique()))
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut assignment = TopicPartitionList::new();
    for partition in 0..2 {
        assignment
            .add_partition_offset(&topic, partition, Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&assignment).unwrap();
    let message = tokio::time::timeout(Duration::from_secs(10), consumer.recv())
        .await
        .expect("the event reached Kafka")
        .unwrap();
    assert_eq!(message.key(), Some(&b"k-commit"[..]), "keyed by aggregate");
    let body: serde_json::Value = serde_json::from_slice(message.payload().unwrap()).unwrap();
    assert_eq!(body["key"], "k-commit");
    let id = message
        .headers()
        .unwrap()
        .iter()
        .find(|h| h.key == headers::ID)
        .and_then(|h| h.value)
        .map(|v| String::from_utf8(v.to_vec()).unwrap());
    assert_eq!(id, committed.map(|id| id.to_string()), "the outbox id");
    // The rolled-back event never comes.
    assert!(
        tokio::time::timeout(Duration::from_millis(500), consumer.recv())
            .await
            .is_err()
    );
    let report = idempotency.shutdown().await;
    assert_eq!(report.relay.unwrap().totals.published, 1);
    delete(&topic).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_topic_is_created_at_start_up_with_its_partitions() {
    let topic = format!("fixed-{}", unique());
    let yaml = yaml(&format!(
        "      brokers: {}\n      topic: {topic}\n      create: true\n      partitions: 4\n      message-timeout: 2s\n",
        kafka_url()
    ));
    let idempotency = Idempotency::from_config(&settings(&yaml), sqlite().await)
        .await
        .unwrap();
    assert_eq!(partitions(&topic), 4, "made before the first event");
    idempotency.shutdown().await;
    delete(&topic).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_publisher_settings_that_cannot_work_stop_start_up_naming_themselves() {
    let url = kafka_url();
    for (body, property) in [
        (
            "      topic: t\n".to_owned(),
            "outbox.publisher.kafka.brokers",
        ),
        (
            // Nothing listens there: the metadata request goes unanswered.
            "      brokers: 127.0.0.1:1\n      message-timeout: 1s\n".to_owned(),
            "outbox.publisher.kafka.brokers",
        ),
        (
            format!("      brokers: {url}\n      topic: \"t.{{tenant}}\"\n"),
            "outbox.publisher.kafka.topic",
        ),
        (
            format!("      brokers: {url}\n      partitions: 6\n"),
            "outbox.publisher.kafka.partitions",
        ),
        (
            format!("      brokers: {url}\n      create: true\n      partitions: 0\n"),
            "outbox.publisher.kafka.partitions",
        ),
        (
            // Longer than relay.publish-timeout (5s by default).
            format!("      brokers: {url}\n      message-timeout: 10s\n"),
            "outbox.publisher.kafka.message-timeout",
        ),
        (
            format!("      brokers: {url}\n      message-timeout: 0s\n"),
            "outbox.publisher.kafka.message-timeout",
        ),
    ] {
        let error = refusal(&yaml(&body)).await;
        assert!(error.starts_with(property), "{body}: {error}");
    }
    // A relay.publish-timeout longer than librdkafka's `message.timeout.ms` takes (2^31 - 1
    // ms, about 24.9 days) is refused as the message timeout it becomes, not blamed on the
    // brokers (before: "outbox.publisher.kafka.brokers: ... message.timeout.ms ... out of
    // range").
    let long = yaml(&format!("      brokers: {url}\n")).replace(
        "    poll-interval: 50ms\n",
        "    poll-interval: 50ms\n    publish-timeout: 30d\n",
    );
    let error = refusal(&long).await;
    assert!(
        error.starts_with("outbox.publisher.kafka.message-timeout") && error.contains("24d"),
        "{error}"
    );
}
