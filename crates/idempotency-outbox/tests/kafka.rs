//! The Kafka publisher against a real Kafka-protocol broker (`KAFKA_URL`, default
//! `127.0.0.1:9092`; `scripts/services.sh` starts tansu there): delivery with key, headers and
//! payload; a 10,000-event drain by two workers, once per outbox id, in per-aggregate order,
//! with a relay killed mid-drain; a broker that stops answering mid-drain; an unknown topic and
//! an unreachable broker; a record over the size limit.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::kafka::{Record, TestTopic};
use common::*;
use idempotency_outbox::config::Ordering;
use idempotency_outbox::publisher::headers;
use idempotency_outbox::publisher::kafka::KafkaPublisher;
use idempotency_outbox::{NewEvent, OutboxMessage, Publisher, Relay};

fn by_id(records: &[Record]) -> HashMap<String, Vec<&Record>> {
    let mut map: HashMap<String, Vec<&Record>> = HashMap::new();
    for record in records {
        map.entry(record.headers[headers::ID].clone())
            .or_default()
            .push(record);
    }
    map
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_events_are_published_once_with_key_headers_and_payload() {
    let config = config(Ordering::Ordered);
    let (pool, outbox) = outbox(&config).await;
    let topic = TestTopic::new(3).await;

    let committed: Vec<NewEvent> = (0..6)
        .map(|n| event(&format!("agg-{}", n % 2), n))
        .collect();
    commit(&pool, &outbox, &committed).await;
    let mut tx = pool.begin().await.unwrap();
    outbox
        .enqueue(&mut tx, &event("agg-rolled-back", 99))
        .await
        .unwrap();
    tx.rollback().await.unwrap();

    let handle = Relay::new(outbox.clone(), topic.publisher(), &config)
        .unwrap()
        .spawn();
    eventually("6 published rows", || async { published(&pool).await == 6 }).await;
    let report = handle.shutdown().await;
    assert!(report.graceful);
    assert_eq!(report.totals.published, 6);

    let records = topic.read(6, Duration::from_millis(500)).await;
    assert_eq!(records.len(), 6, "exactly the committed events");
    let ids = by_id(&records);
    for event in &committed {
        let record = ids
            .get(&event.id().to_string())
            .unwrap_or_else(|| panic!("event {} not in the topic", event.id()))[0];
        assert_eq!(record.key, event.aggregate_id(), "keyed by aggregate");
        assert_eq!(
            record.payload,
            event.payload().as_bytes(),
            "payload bytes unchanged"
        );
        assert_eq!(
            record.headers.get("x-test"),
            event.headers().get("x-test"),
            "the caller's header"
        );
        assert_eq!(record.headers[headers::AGGREGATE_TYPE], "order");
        assert_eq!(record.headers[headers::AGGREGATE_ID], event.aggregate_id());
        assert_eq!(record.headers[headers::EVENT_TYPE], "OrderUpdated");
    }
    for aggregate in ["agg-0", "agg-1"] {
        let mine: Vec<&Record> = records.iter().filter(|r| r.key == aggregate).collect();
        let partitions: HashSet<i32> = mine.iter().map(|r| r.partition).collect();
        assert_eq!(partitions.len(), 1, "{aggregate}: one partition");
        let mut in_partition = mine.clone();
        in_partition.sort_by_key(|r| r.offset);
        let sequences: Vec<&str> = in_partition
            .iter()
            .map(|r| r.headers[headers::SEQUENCE].as_str())
            .collect();
        assert_eq!(sequences, ["1", "2", "3"], "{aggregate}: commit order");
    }
    topic.delete().await;
}

/// 10,000 events over 100 aggregates, two workers; the first relay is aborted mid-drain (as a
/// killed process: no marking of what is in flight) and a second one finishes. Every outbox id
/// is in the topic; the only copies are of ids the first relay had in flight, each with the
/// same id; each aggregate's records, in partition order, are in commit order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_events_each_once_in_aggregate_order_across_a_killed_relay() {
    let mut config = config(Ordering::Ordered);
    config.relay.batch_size = 100;
    let (pool, outbox) = outbox(&config).await;
    let topic = TestTopic::new(3).await;
    let events: Vec<NewEvent> = (0..10_000)
        .map(|n| event(&format!("a{}", n % 100), n))
        .collect();
    for chunk in events.chunks(1_000) {
        commit(&pool, &outbox, chunk).await;
    }

    let first = Relay::new(outbox.clone(), topic.publisher(), &config)
        .unwrap()
        .spawn();
    eventually("a third published", || async {
        published(&pool).await >= 3_000
    })
    .await;
    first.abort();
    let second = Relay::new(outbox.clone(), topic.publisher(), &config)
        .unwrap()
        .spawn();
    let deadline = Instant::now() + Duration::from_secs(120);
    while published(&pool).await < 10_000 {
        assert!(Instant::now() < deadline, "drain did not finish");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(second.shutdown().await.graceful);

    let records = topic.read(10_000, Duration::from_secs(1)).await;
    let ids = by_id(&records);
    let want: HashSet<String> = events.iter().map(|e| e.id().to_string()).collect();
    let got: HashSet<String> = ids.keys().cloned().collect();
    assert_eq!(got, want, "every committed event, nothing else");
    let copies = records.len() - want.len();
    let bound = 2 * config.relay.workers * config.relay.batch_size as usize;
    assert!(copies <= bound, "{copies} copies, more than {bound}");
    for (id, same) in &ids {
        let first = same[0];
        for copy in &same[1..] {
            assert_eq!(
                copy.payload, first.payload,
                "{id}: a copy is the same event"
            );
            assert_eq!(copy.key, first.key);
        }
    }
    let mut by_aggregate: BTreeMap<&str, Vec<&Record>> = BTreeMap::new();
    for record in &records {
        by_aggregate.entry(&record.key).or_default().push(record);
    }
    assert_eq!(by_aggregate.len(), 100);
    for (aggregate, mut mine) in by_aggregate {
        let partitions: HashSet<i32> = mine.iter().map(|r| r.partition).collect();
        assert_eq!(partitions.len(), 1, "{aggregate}: one partition");
        mine.sort_by_key(|r| r.offset);
        let sequences: Vec<i64> = mine
            .iter()
            .map(|r| r.headers[headers::SEQUENCE].parse().unwrap())
            .collect();
        // A copy repeats the sequence just sent; nothing goes back further.
        assert!(
            sequences
                .windows(2)
                .all(|w| w[1] == w[0] || w[1] == w[0] + 1),
            "{aggregate}: {sequences:?}"
        );
        assert_eq!(sequences.first(), Some(&1), "{aggregate}");
        assert_eq!(sequences.last(), Some(&100), "{aggregate}");
    }
    eprintln!("kafka drain: 10,000 events, {copies} copies after the kill (bound {bound})");
    topic.delete().await;
}

/// A broker of this test's own, on its own port, that can be stopped.
struct Broker {
    child: Child,
    url: String,
}

impl Broker {
    fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let listen = format!("tcp://127.0.0.1:{port}");
        let binary = std::env::var("TANSU_BIN").unwrap_or_else(|_| "tansu".to_owned());
        let child = Command::new(&binary)
            .args(["broker", "--listener-url", &listen])
            .args(["--advertised-listener-url", &listen])
            .args(["--storage-engine", "memory://tansu/"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{binary} (TANSU_BIN): {e}"));
        let url = format!("127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(&url).is_err() {
            assert!(Instant::now() < deadline, "tansu did not start on {url}");
            std::thread::sleep(Duration::from_millis(50));
        }
        Self { child, url }
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The broker stops answering mid-drain (SIGSTOP: connections open, nothing answered) for
/// longer than the publish timeout, then goes on: publishes time out and are retried without
/// counting attempts, nothing is dead-lettered, nothing is marked published without its
/// delivery report, and every event is in the topic at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_that_stops_mid_drain_loses_nothing_and_dead_letters_nothing() {
    let broker = Broker::start();
    let mut config = config(Ordering::Ordered);
    config.relay.max_attempts = 2; // an attempt counted for the outage would dead-letter
    let (pool, outbox) = outbox(&config).await;
    let topic = TestTopic {
        url: broker.url.clone(),
        ..TestTopic::named(3)
    };
    topic.create().await;
    let events: Vec<NewEvent> = (0..2_000)
        .map(|n| event(&format!("a{}", n % 20), n))
        .collect();
    commit(&pool, &outbox, &events).await;

    let handle = Relay::new(outbox.clone(), topic.publisher(), &config)
        .unwrap()
        .spawn();
    eventually("some published", || async { published(&pool).await >= 200 }).await;
    broker.signal("-STOP");
    let stopped_at = published(&pool).await;
    tokio::time::sleep(Duration::from_secs(5)).await; // > message.timeout.ms (2 s)
    let during = published(&pool).await;
    assert!(
        during - stopped_at <= 2 * 50,
        "only the batches in flight at the stop may finish: {stopped_at} -> {during}"
    );
    assert!(handle.totals().failed > 0, "publishes failed while stopped");
    broker.signal("-CONT");
    let deadline = Instant::now() + Duration::from_secs(60);
    while published(&pool).await < 2_000 {
        if Instant::now() > deadline {
            let errors: Vec<(String, i64)> = sqlx::query_as(
                "SELECT coalesce(last_error, '-'), count(*) FROM outbox \
                 WHERE published_at IS NULL GROUP BY 1",
            )
            .fetch_all(&pool)
            .await
            .unwrap();
            panic!("drain did not finish after the broker came back: {errors:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    handle.shutdown().await;
    let dead = scalar_i64(
        &pool,
        "SELECT count(*) FROM outbox WHERE dead_lettered_at IS NOT NULL",
    )
    .await;
    assert_eq!(dead, 0, "an outage dead-letters nothing");
    let records = topic.read(2_000, Duration::from_secs(1)).await;
    let got: HashSet<String> = by_id(&records).into_keys().collect();
    let want: HashSet<String> = events.iter().map(|e| e.id().to_string()).collect();
    assert_eq!(got, want, "none lost");
}

fn message(aggregate_type: &str, payload: String) -> OutboxMessage {
    OutboxMessage::new(
        uuid::Uuid::now_v7(),
        aggregate_type,
        "a-1",
        None,
        "Happened",
        payload,
        BTreeMap::new(),
        chrono::Utc::now(),
        1,
    )
}

/// A topic the broker does not have (tansu creates none on first use) and a broker nobody
/// listens on: each publish fails within the message timeout as a failure the relay retries
/// without counting attempts; never a hang. `check_connection` names the unreachable broker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_topic_or_an_unreachable_broker_is_a_retryable_failure_never_a_hang() {
    let missing = TestTopic::named(1);
    let started = Instant::now();
    let error = missing
        .publisher()
        .publish(&message("order", "{}".to_owned()))
        .await
        .unwrap_err();
    assert!(error.kind().is_transient(), "{error:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port(); // closed again: nothing listens there
    let nowhere = KafkaPublisher::new(&format!("127.0.0.1:{port}"))
        .with_message_timeout(Duration::from_secs(1))
        .connect()
        .unwrap();
    let started = Instant::now();
    let error = nowhere
        .publish(&message("order", "{}".to_owned()))
        .await
        .unwrap_err();
    assert!(error.kind().is_transient(), "{error:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert!(
        nowhere
            .check_connection(Duration::from_millis(500))
            .await
            .is_err()
    );
    missing
        .publisher()
        .check_connection(Duration::from_secs(5))
        .await
        .unwrap();

    // Not a property librdkafka knows: refused at connect, naming it.
    let error = KafkaPublisher::new("127.0.0.1:9092")
        .with_property("no.such.property", "1")
        .connect()
        .unwrap_err();
    let mut chain = error.to_string();
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        chain = format!("{chain}: {cause}");
        source = cause.source();
    }
    assert!(chain.contains("no.such.property"), "{chain}");
}

/// A record over the size limit is a permanent failure of that message alone: dead-lettered
/// at its first attempt with the reason; its aggregate's next event and the batch's other
/// messages are published. A topic name Kafka cannot take is the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_over_the_size_limit_is_dead_lettered_and_the_others_published() {
    let mut config = config(Ordering::Ordered);
    config.relay.max_attempts = 5;
    let (pool, outbox) = outbox(&config).await;
    let topic = TestTopic::new(1).await;
    let publisher = KafkaPublisher::new(&topic.url)
        .with_topic(&topic.template())
        .unwrap()
        .with_property("message.max.bytes", "10000")
        .connect()
        .unwrap();

    let too_large = NewEvent::new("order", "big", "OrderUpdated", &"x".repeat(20_000)).unwrap();
    let bad_topic = NewEvent::new("bad type", "s", "OrderUpdated", &1).unwrap();
    let good = [event("big", 2), event("other", 1)];
    commit(&pool, &outbox, &[too_large.clone(), bad_topic.clone()]).await;
    commit(&pool, &outbox, &good).await;
    let handle = Relay::new(outbox.clone(), publisher, &config)
        .unwrap()
        .spawn();
    eventually("settled", || async { pending(&pool).await == 0 }).await;
    handle.shutdown().await;
    for (event, what) in [(&too_large, "size"), (&bad_topic, "topic")] {
        let (attempts, dead, error): (i32, bool, String) = sqlx::query_as(
            "SELECT attempts, dead_lettered_at IS NOT NULL, last_error FROM outbox WHERE id = $1",
        )
        .bind(event.id())
        .fetch_one(&pool)
        .await
        .unwrap();
        assert!(dead, "{what}: {error}");
        assert_eq!(attempts, 1, "{what}: at the first attempt ({error})");
        assert!(
            error.starts_with("message invalid for the broker"),
            "{what}: {error}"
        );
    }
    let records = topic.read(2, Duration::from_millis(500)).await;
    let got: HashSet<String> = by_id(&records).into_keys().collect();
    let want: HashSet<String> = good.iter().map(|e| e.id().to_string()).collect();
    assert_eq!(
        got, want,
        "the large one's successor and the other aggregate"
    );
    topic.delete().await;
}

/// Kafka does not deduplicate across producer sessions: the relay has no window to check,
/// and says so (`None`), so its start-up check passes.
#[tokio::test]
async fn kafka_has_no_duplicate_window_to_check() {
    let topic = TestTopic::named(1);
    assert_eq!(topic.publisher().duplicate_window().await.unwrap(), None);
}

// The consumer side: `examples/kafka_inbox.rs`, run here as it is.
#[allow(dead_code, unreachable_pub)]
#[path = "../examples/kafka_inbox.rs"]
mod kafka_inbox;

/// The sum of the offsets `group` committed on `topic`'s partitions: the records it is done
/// with, when it began at offset 0.
fn committed(topic: &TestTopic, group: &str) -> i64 {
    use idempotency_outbox::publisher::kafka::rdkafka::consumer::{BaseConsumer, Consumer};
    use idempotency_outbox::publisher::kafka::rdkafka::{ClientConfig, Offset, TopicPartitionList};

    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &topic.url)
        .set("group.id", group)
        .create()
        .unwrap();
    let mut partitions = TopicPartitionList::new();
    for partition in 0..topic.partitions {
        partitions.add_partition(&topic.name(), partition);
    }
    let Ok(offsets) = consumer.committed_offsets(partitions, Duration::from_secs(5)) else {
        return 0;
    };
    offsets
        .elements()
        .iter()
        .map(|e| match e.offset() {
            Offset::Offset(n) => n,
            _ => 0,
        })
        .sum()
}

/// The example consumer (`examples/kafka_inbox.rs`): 20 events, 5 of them published twice (a
/// relay's republish: same `Outbox-Id`), read by a group; each event is applied once, the 5
/// copies dropped by the inbox, and every offset committed (after its inbox transaction). The
/// group restarted reads only a record published since (its committed offsets hold); a group
/// that reads it all again (as after a crash between the database commit and the offset
/// commit) applies nothing twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_consumer_applies_each_event_once_and_commits_offsets_after_the_inbox() {
    let pool = idempotency_testing::pg_pool().await;
    let topic = TestTopic::new(2).await;
    let publisher = topic.publisher();
    let messages: Vec<OutboxMessage> = (0..20)
        .map(|n| {
            OutboxMessage::new(
                uuid::Uuid::now_v7(),
                "order",
                format!("a{}", n % 4),
                Some(n / 4 + 1),
                "OrderUpdated",
                format!("{{\"n\":{n}}}"),
                BTreeMap::new(),
                chrono::Utc::now(),
                1,
            )
        })
        .collect();
    for message in messages.iter().chain(messages.iter().step_by(4)) {
        publisher.publish(message).await.unwrap();
    }

    let inbox = kafka_inbox::prepare(&pool).await.unwrap();
    let group = idempotency_testing::unique_name("billing");
    let consume = async |kafka_group: &str, records: i64| {
        let consumer = kafka_inbox::consumer(&topic.url, kafka_group, &topic.name()).unwrap();
        let stop = async {
            let deadline = Instant::now() + Duration::from_secs(60);
            while committed(&topic, kafka_group) < records {
                assert!(
                    Instant::now() < deadline,
                    "{kafka_group}: offsets not committed"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        // The inbox consumer name is `group` throughout: the same logical consumer.
        kafka_inbox::run(consumer, &pool, &inbox, &group, stop)
            .await
            .unwrap()
    };

    let first = consume(group.as_str(), 25).await;
    assert_eq!(
        (first.applied, first.duplicates, first.foreign),
        (20, 5, 0),
        "{first:?}"
    );
    let counts: Vec<(String, i64)> =
        sqlx::query_as("SELECT aggregate_id, events FROM order_events ORDER BY aggregate_id")
            .fetch_all(&pool)
            .await
            .unwrap();
    let want: Vec<(String, i64)> = (0..4).map(|a| (format!("a{a}"), 5)).collect();
    assert_eq!(counts, want, "each event applied once");

    // Restarted: the offsets were committed; only a record published since is read.
    let late = OutboxMessage::new(
        uuid::Uuid::now_v7(),
        "order",
        "late",
        Some(1),
        "OrderUpdated",
        "{}",
        BTreeMap::new(),
        chrono::Utc::now(),
        1,
    );
    publisher.publish(&late).await.unwrap();
    let again = consume(group.as_str(), 26).await;
    assert_eq!(
        again,
        kafka_inbox::Consumed {
            applied: 1,
            ..Default::default()
        }
    );

    // Every record delivered again: the inbox drops them all.
    let other_group = idempotency_testing::unique_name("replay");
    let replay = consume(other_group.as_str(), 26).await;
    assert_eq!((replay.applied, replay.duplicates), (0, 26), "{replay:?}");
    let after: Vec<(String, i64)> =
        sqlx::query_as("SELECT aggregate_id, events FROM order_events ORDER BY aggregate_id")
            .fetch_all(&pool)
            .await
            .unwrap();
    let mut want = want;
    want.push(("late".to_owned(), 1));
    assert_eq!(after, want, "nothing applied twice");
    topic.delete().await;
}

/// The example consumer stopped by an error (its projection table gone): [`kafka_inbox::run`]
/// took the consumer and dropped it, so the next run needs a new one, which starts from the
/// group's committed offset and applies the record that failed. (A consumer kept for a second
/// run would have read past it: its position was already beyond the failed record, and the
/// next record's offset commit would have covered it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_consumer_applies_a_failed_record_in_its_next_consumer() {
    let pool = idempotency_testing::pg_pool().await;
    let topic = TestTopic::new(1).await;
    let publisher = topic.publisher();
    for n in 1..=2 {
        let message = OutboxMessage::new(
            uuid::Uuid::now_v7(),
            "order",
            "a1",
            Some(n),
            "OrderUpdated",
            format!("{{\"n\":{n}}}"),
            BTreeMap::new(),
            chrono::Utc::now(),
            1,
        );
        publisher.publish(&message).await.unwrap();
    }
    let inbox = kafka_inbox::prepare(&pool).await.unwrap();
    let group = idempotency_testing::unique_name("retry");

    sqlx::query("ALTER TABLE order_events RENAME TO order_events_away")
        .execute(&pool)
        .await
        .unwrap();
    let consumer = kafka_inbox::consumer(&topic.url, &group, &topic.name()).unwrap();
    let failed = tokio::time::timeout(
        Duration::from_secs(60),
        kafka_inbox::run(consumer, &pool, &inbox, &group, std::future::pending()),
    )
    .await
    .expect("the first record fails");
    assert!(
        matches!(failed, Err(kafka_inbox::ConsumeError::Database(_))),
        "{failed:?}"
    );
    assert_eq!(committed(&topic, &group), 0, "nothing committed");
    sqlx::query("ALTER TABLE order_events_away RENAME TO order_events")
        .execute(&pool)
        .await
        .unwrap();

    let consumer = kafka_inbox::consumer(&topic.url, &group, &topic.name()).unwrap();
    let stop = async {
        let deadline = Instant::now() + Duration::from_secs(60);
        while committed(&topic, &group) < 2 {
            assert!(Instant::now() < deadline, "offsets not committed");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let again = kafka_inbox::run(consumer, &pool, &inbox, &group, stop)
        .await
        .unwrap();
    assert_eq!(again.applied, 2, "{again:?}");
    let events: i64 =
        sqlx::query_scalar("SELECT events FROM order_events WHERE aggregate_id = 'a1'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(events, 2, "both records applied");
    topic.delete().await;
}

/// A record whose `Outbox-Id` is not an outbox id (empty, too long for the inbox, not a UUID)
/// is not from the outbox: skipped and committed like one without the header (before: an empty
/// or overlong id was refused by the inbox on every delivery, and the partition stopped there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_consumer_skips_a_record_whose_outbox_id_is_not_one() {
    use idempotency_outbox::publisher::kafka::rdkafka::ClientConfig;
    use idempotency_outbox::publisher::kafka::rdkafka::message::{Header, OwnedHeaders};
    use idempotency_outbox::publisher::kafka::rdkafka::producer::{FutureProducer, FutureRecord};

    let pool = idempotency_testing::pg_pool().await;
    let topic = TestTopic::new(1).await;
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &topic.url)
        .create()
        .unwrap();
    let long = "x".repeat(300);
    for id in ["", long.as_str(), "not-a-uuid"] {
        let headers = OwnedHeaders::new().insert(Header {
            key: headers::ID,
            value: Some(id),
        });
        producer
            .send(
                FutureRecord::to(&topic.name())
                    .key("a1")
                    .payload("{}")
                    .headers(headers),
                Duration::from_secs(10),
            )
            .await
            .unwrap();
    }
    let message = OutboxMessage::new(
        uuid::Uuid::now_v7(),
        "order",
        "a1",
        Some(1),
        "OrderUpdated",
        "{}",
        BTreeMap::new(),
        chrono::Utc::now(),
        1,
    );
    topic.publisher().publish(&message).await.unwrap();
    let inbox = kafka_inbox::prepare(&pool).await.unwrap();
    let group = idempotency_testing::unique_name("foreign");
    let consumer = kafka_inbox::consumer(&topic.url, &group, &topic.name()).unwrap();
    let stop = async {
        let deadline = Instant::now() + Duration::from_secs(60);
        while committed(&topic, &group) < 4 {
            assert!(Instant::now() < deadline, "offsets not committed");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let consumed = tokio::time::timeout(
        Duration::from_secs(90),
        kafka_inbox::run(consumer, &pool, &inbox, &group, stop),
    )
    .await
    .expect("the run ends")
    .unwrap();
    assert_eq!(
        consumed,
        kafka_inbox::Consumed {
            applied: 1,
            duplicates: 0,
            foreign: 3
        }
    );
    topic.delete().await;
}
