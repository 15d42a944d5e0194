//! The relay against a real RabbitMQ: confirms, `message_id`, persistent delivery, headers;
//! an outage through a proxy we cut; and a redelivery after a worker died, dropped by the
//! consumer's inbox.

#![cfg(feature = "rabbitmq")]
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};

use common::amqp::{TestQueue, header};
use common::*;
use idempotency_core::config::SchemaMode;
use idempotency_outbox::config::{InboxConfig, Ordering};
use idempotency_outbox::publisher::headers;
use idempotency_outbox::publisher::rabbitmq::RabbitMqPublisher;
use idempotency_outbox::{NewEvent, Relay};
use idempotency_pg::PgInbox;

fn publisher(uri: &str, queue: &TestQueue) -> RabbitMqPublisher {
    // The default exchange routes by queue name: a fixed routing key.
    RabbitMqPublisher::new(uri)
        .with_routing_key(&queue.name)
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_events_arrive_confirmed_persistent_with_their_id() {
    let config = config(Ordering::Ordered);
    let (pool, outbox) = outbox(&config).await;
    let queue = TestQueue::new().await;
    let mut consumer = queue.consumer().await;
    let events: Vec<NewEvent> = (0..4).map(|n| event("amqp-1", n)).collect();
    commit(&pool, &outbox, &events).await;
    let mut tx = pool.begin().await.unwrap();
    outbox.enqueue(&mut tx, &event("never", 0)).await.unwrap();
    tx.rollback().await.unwrap();

    let publisher = publisher(&idempotency_testing::amqp_url(), &queue);
    publisher.connect().await.unwrap();
    let handle = Relay::new(outbox.clone(), publisher, &config)
        .unwrap()
        .spawn();
    let deliveries = TestQueue::receive(&mut consumer, 4).await;
    eventually("marked", || async { published(&pool).await == 4 }).await;
    let report = handle.shutdown().await;
    assert_eq!(report.totals.published, 4);

    for (event, delivery) in events.iter().zip(&deliveries) {
        let props = &delivery.properties;
        assert_eq!(
            props.message_id().as_ref().map(|s| s.to_string()),
            Some(event.id().to_string()),
            "in order, with the outbox id"
        );
        assert_eq!(*props.delivery_mode(), Some(2), "persistent");
        assert_eq!(
            props.kind().as_ref().map(|s| s.as_str()),
            Some("OrderUpdated")
        );
        assert_eq!(
            payload_of(&delivery.data),
            serde_json::from_str::<serde_json::Value>(event.payload()).unwrap()
        );
        assert_eq!(
            header(delivery, "x-test"),
            event.headers().get("x-test").cloned()
        );
        assert_eq!(
            header(delivery, headers::AGGREGATE_ID).as_deref(),
            Some("amqp-1")
        );
    }
    // Nothing else (the rolled-back event) is in the queue.
    let extra = tokio::time::timeout(
        std::time::Duration::from_millis(500),
        futures_util::StreamExt::next(&mut consumer),
    )
    .await;
    assert!(extra.is_err(), "unexpected delivery {extra:?}");
    queue.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_outage_keeps_rows_pending_until_it_is_back() {
    let config = config(Ordering::Unordered);
    let (pool, outbox) = outbox(&config).await;
    let queue = TestQueue::new().await;
    let url = idempotency_testing::amqp_url();
    let proxy = Proxy::start(host_port(&url), false).await; // down
    let events: Vec<NewEvent> = (0..30).map(|n| event(&format!("r{n}"), n)).collect();
    commit(&pool, &outbox, &events).await;

    let handle = Relay::new(
        outbox.clone(),
        publisher(&via_port(&url, proxy.port), &queue),
        &config,
    )
    .unwrap()
    .spawn();
    // Failures the broker's, not the messages': each given back its attempt.
    eventually("60 attempts failed", || async {
        handle.totals().failed >= 60
    })
    .await;
    let counted = scalar_i64(&pool, "SELECT count(*) FROM outbox WHERE attempts > 1").await;
    assert_eq!(counted, 0, "no attempt was counted twice");
    assert_eq!(pending(&pool).await, 30);
    let recorded = scalar_i64(
        &pool,
        "SELECT count(*) FROM outbox WHERE last_error LIKE 'broker unavailable%'",
    )
    .await;
    assert_eq!(recorded, 30);

    proxy.enable(); // the broker is back: the publisher reconnects by itself
    let mut consumer = queue.consumer().await;
    let deliveries = TestQueue::receive(&mut consumer, 30).await;
    eventually("all marked", || async { published(&pool).await == 30 }).await;
    let mut got: Vec<String> = deliveries
        .iter()
        .map(|d| d.properties.message_id().as_ref().unwrap().to_string())
        .collect();
    let mut want: Vec<String> = events.iter().map(|e| e.id().to_string()).collect();
    got.sort();
    want.sort();
    assert_eq!(got, want, "every event delivered, none lost or doubled");

    // The connection breaks under a running relay (the proxy cuts it): new rows wait, then go
    // out over a new connection once the broker answers again.
    proxy.disable();
    let later: Vec<NewEvent> = (0..10).map(|n| event(&format!("later{n}"), n)).collect();
    commit(&pool, &outbox, &later).await;
    eventually("the new rows failed at least once", || async {
        scalar_i64(
            &pool,
            "SELECT count(*) FROM outbox WHERE last_error IS NOT NULL AND published_at IS NULL",
        )
        .await
            == 10
    })
    .await;
    proxy.enable();
    let deliveries = TestQueue::receive(&mut consumer, 10).await;
    eventually("all marked", || async { published(&pool).await == 40 }).await;
    handle.shutdown().await;
    let mut got: Vec<String> = deliveries
        .iter()
        .map(|d| d.properties.message_id().as_ref().unwrap().to_string())
        .collect();
    let mut want: Vec<String> = later.iter().map(|e| e.id().to_string()).collect();
    got.sort();
    want.sort();
    assert_eq!(got, want);
    queue.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivery_after_a_crash_is_dropped_by_the_inbox() {
    let mut config = config(Ordering::Ordered);
    config.relay.workers = 1;
    let (pool, outbox) = outbox(&config).await;
    let inbox = PgInbox::from_config(
        pool.clone(),
        &InboxConfig {
            schema: idempotency_core::config::SchemaConfig {
                mode: SchemaMode::Create,
            },
            ..InboxConfig::default()
        },
    )
    .await
    .unwrap();
    sqlx::query("CREATE TABLE projection (aggregate text PRIMARY KEY, applied int NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    let queue = TestQueue::new().await;
    let url = idempotency_testing::amqp_url();
    let the_event = event("inbox-agg", 1);
    commit(&pool, &outbox, std::slice::from_ref(&the_event)).await;

    let acked = Arc::new(AtomicU64::new(0));
    let first = Relay::new(
        outbox.clone(),
        HangAfterAck {
            inner: publisher(&url, &queue),
            hang: Box::new(|_| true),
            acked: Arc::clone(&acked),
        },
        &config,
    )
    .unwrap()
    .spawn();
    eventually("confirmed once", || async {
        acked.load(AtomicOrdering::SeqCst) == 1
    })
    .await;
    first.abort(); // died before marking

    let handle = Relay::new(outbox.clone(), publisher(&url, &queue), &config)
        .unwrap()
        .spawn();
    eventually("marked by the second relay", || async {
        published(&pool).await == 1
    })
    .await;
    handle.shutdown().await;

    // The consumer: RabbitMQ has no deduplication, both copies arrive with the same id.
    let mut consumer = queue.consumer().await;
    let deliveries = TestQueue::receive(&mut consumer, 2).await;
    let mut processed = 0;
    for delivery in &deliveries {
        let id = delivery
            .properties
            .message_id()
            .as_ref()
            .unwrap()
            .to_string();
        assert_eq!(id, the_event.id().to_string());
        let mut tx = pool.begin().await.unwrap();
        if inbox.record(&mut tx, "projector", &id).await.unwrap() {
            sqlx::query(
                "INSERT INTO projection VALUES ($1, 1) \
                 ON CONFLICT (aggregate) DO UPDATE SET applied = projection.applied + 1",
            )
            .bind("inbox-agg")
            .execute(&mut *tx)
            .await
            .unwrap();
            processed += 1;
        }
        tx.commit().await.unwrap();
    }
    assert_eq!(processed, 1, "the inbox dropped the redelivery");
    let applied = scalar_i64(&pool, "SELECT applied::int8 FROM projection").await;
    assert_eq!(applied, 1);
    // Another consumer processes the same message independently.
    let mut tx = pool.begin().await.unwrap();
    assert!(
        inbox
            .record_id(&mut tx, "auditor", the_event.id())
            .await
            .unwrap()
    );
    tx.commit().await.unwrap();
    queue.delete().await;
}

/// AMQP short strings hold at most 255 bytes: a routing key, `type` or header name longer
/// than that cannot be sent. Such a message is dead-lettered at its first attempt with the
/// reason, the shared connection keeps working and the other messages (its aggregate's next
/// one included) are delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_too_long_for_amqp_are_dead_lettered_at_once_and_the_connection_lives_on() {
    let mut config = config(Ordering::Ordered);
    config.relay.workers = 1;
    config.relay.max_attempts = 5;
    let (pool, outbox) = outbox(&config).await;
    let queue = TestQueue::new().await;
    // A topic exchange of its own, routing every key to the queue.
    let exchange = idempotency_testing::unique_name("outbox_x");
    queue
        .channel
        .exchange_declare(
            exchange.as_str().into(),
            lapin::ExchangeKind::Topic,
            lapin::options::ExchangeDeclareOptions::default(),
            lapin::types::FieldTable::default(),
        )
        .await
        .unwrap();
    queue
        .channel
        .queue_bind(
            queue.name.as_str().into(),
            exchange.as_str().into(),
            "#".into(),
            lapin::options::QueueBindOptions::default(),
            lapin::types::FieldTable::default(),
        )
        .await
        .unwrap();
    let json = serde_json::json!({});
    // Routing key `{aggregate_type}`: 200 two-byte characters make a 400-byte key.
    let long_key = NewEvent::new("é".repeat(200), "a", "OrderUpdated", &json).unwrap();
    // A 400-byte `type`; the next event of its aggregate is `good[1]`.
    let long_type = NewEvent::new("order", "b", "é".repeat(200), &json).unwrap();
    let long_header = event("c", 1).header(format!("x-{}", "h".repeat(300)), "v");
    let good = [event("a", 2), event("b", 2), event("c", 2), event("d", 1)];
    let mut all = vec![long_key.clone(), long_type.clone(), long_header.clone()];
    all.extend(good.iter().cloned());
    commit(&pool, &outbox, &all).await;

    let publisher = RabbitMqPublisher::new(idempotency_testing::amqp_url())
        .with_exchange(&exchange)
        .with_routing_key("{aggregate_type}")
        .unwrap();
    publisher.connect().await.unwrap();
    let handle = Relay::new(outbox.clone(), publisher, &config)
        .unwrap()
        .spawn();
    let mut consumer = queue.consumer().await;
    let deliveries = TestQueue::receive(&mut consumer, good.len()).await;
    let mut got: Vec<String> = deliveries
        .iter()
        .map(|d| d.properties.message_id().as_ref().unwrap().to_string())
        .collect();
    let mut want: Vec<String> = good.iter().map(|e| e.id().to_string()).collect();
    got.sort();
    want.sort();
    assert_eq!(got, want, "every other message delivered");
    eventually("the three dead-lettered", || async {
        scalar_i64(
            &pool,
            "SELECT count(*) FROM outbox WHERE dead_lettered_at IS NOT NULL",
        )
        .await
            == 3
    })
    .await;
    for (event, what) in [
        (&long_key, "routing key"),
        (&long_type, "type"),
        (&long_header, "header name"),
    ] {
        let (attempts, error): (i32, String) =
            sqlx::query_as("SELECT attempts, last_error FROM outbox WHERE id = $1")
                .bind(event.id())
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(
            attempts, 1,
            "{what}: refused at the first attempt ({error})"
        );
        assert!(
            error.starts_with("message invalid for the broker") && error.contains(what),
            "{what}: {error}"
        );
        assert!(error.contains("longer than 255 bytes"), "{error}");
    }

    // The same connection still publishes.
    let later = [event("a", 3), event("e", 1)];
    commit(&pool, &outbox, &later).await;
    let deliveries = TestQueue::receive(&mut consumer, later.len()).await;
    assert_eq!(deliveries.len(), 2);
    eventually("all marked", || async { published(&pool).await == 6 }).await;
    let report = handle.shutdown().await;
    assert!(report.graceful, "{report:?}");
    let _ = queue
        .channel
        .exchange_delete(
            exchange.as_str().into(),
            lapin::options::ExchangeDeleteOptions::default(),
        )
        .await;
    queue.delete().await;
}

/// A batch mixing routable and unroutable messages (1 in 3), published concurrently as the relay does
/// (lapin hands a returned message to whichever confirm it completes first): every unroutable
/// one fails as unroutable, every routable one is confirmed, and the queue holds exactly the
/// routable ones, each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_batch_of_routable_and_unroutable_messages_is_told_apart_under_concurrency() {
    use futures_util::future::join_all;
    use idempotency_outbox::{OutboxMessage, PublishErrorKind, Publisher};

    let queue = TestQueue::new().await;
    let exchange = idempotency_testing::unique_name("outbox_mixed");
    queue
        .channel
        .exchange_declare(
            exchange.as_str().into(),
            lapin::ExchangeKind::Direct,
            lapin::options::ExchangeDeclareOptions::default(),
            lapin::types::FieldTable::default(),
        )
        .await
        .unwrap();
    // Only `routed` reaches the queue; `nowhere` has no binding.
    queue
        .channel
        .queue_bind(
            queue.name.as_str().into(),
            exchange.as_str().into(),
            "routed".into(),
            lapin::options::QueueBindOptions::default(),
            lapin::types::FieldTable::default(),
        )
        .await
        .unwrap();
    let publisher = RabbitMqPublisher::new(idempotency_testing::amqp_url())
        .with_exchange(&exchange)
        .with_routing_key("{aggregate_type}")
        .unwrap();
    publisher.connect().await.unwrap();

    // 16,000 publishes: 40 rounds of 4 batches of 100 at once, as 4 relay workers publish.
    let (mut wrong, mut routed) = (Vec::new(), 0u32);
    for round in 0..40 {
        let batch: Vec<OutboxMessage> = (0..400)
            .map(|n| {
                let target = if (round * 400 + n) % 3 == 0 {
                    "nowhere"
                } else {
                    "routed"
                };
                OutboxMessage::new(
                    uuid::Uuid::now_v7(),
                    target,
                    format!("a{n}"),
                    None,
                    "Mixed",
                    "{}",
                    Default::default(),
                    chrono::Utc::now(),
                    1,
                )
            })
            .collect();
        let results = join_all(batch.iter().map(|m| publisher.publish(m))).await;
        for (message, result) in batch.iter().zip(results) {
            let routable = message.aggregate_type == "routed";
            routed += u32::from(routable);
            match (routable, &result) {
                (true, Ok(_)) => {}
                (false, Err(e)) if e.kind() == PublishErrorKind::Rejected => {}
                _ => wrong.push(format!(
                    "{} {}: {result:?}",
                    message.aggregate_type, message.id
                )),
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} misreported: {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(5)]
    );
    let declared = queue
        .channel
        .queue_declare(
            queue.name.as_str().into(),
            lapin::options::QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            lapin::types::FieldTable::default(),
        )
        .await
        .unwrap();
    assert_eq!(
        declared.message_count(),
        routed,
        "each routable message once, nothing else"
    );
    let _ = queue
        .channel
        .exchange_delete(
            exchange.as_str().into(),
            lapin::options::ExchangeDeleteOptions::default(),
        )
        .await;
    queue.delete().await;
}

/// A broker outage much longer than `max-attempts` backoffs (scaled down: 3 attempts, backoff
/// 20..200 ms, a 3 s outage) dead-letters nothing: an unavailable broker is not a bad message.
/// When it is back, every event goes out, each aggregate in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_longer_than_every_attempt_dead_letters_nothing_and_keeps_order() {
    let mut config = config(Ordering::Ordered);
    config.relay.max_attempts = 3;
    config.relay.backoff = idempotency_outbox::config::BackoffConfig {
        base: std::time::Duration::from_millis(20),
        max: std::time::Duration::from_millis(200),
    };
    let (pool, outbox) = outbox(&config).await;
    let queue = TestQueue::new().await;
    let url = idempotency_testing::amqp_url();
    let proxy = Proxy::start(host_port(&url), false).await; // down
    let events: Vec<NewEvent> = (1..=4)
        .map(|n| event("o-1", n))
        .chain((1..=2).map(|n| event("o-2", n)))
        .collect();
    commit(&pool, &outbox, &events).await;
    let handle = Relay::new(
        outbox.clone(),
        publisher(&via_port(&url, proxy.port), &queue),
        &config,
    )
    .unwrap()
    .spawn();
    eventually("both heads failed", || async {
        scalar_i64(
            &pool,
            "SELECT count(*) FROM outbox WHERE last_error LIKE 'broker unavailable%'",
        )
        .await
            == 2
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let dead = scalar_i64(
        &pool,
        "SELECT count(*) FROM outbox WHERE dead_lettered_at IS NOT NULL",
    )
    .await;
    assert_eq!(dead, 0, "an outage dead-letters nothing");
    let attempts = scalar_i64(&pool, "SELECT max(attempts)::int8 FROM outbox").await;
    assert!(attempts <= 1, "outage failures are not counted: {attempts}");

    proxy.enable();
    let mut consumer = queue.consumer().await;
    let deliveries = TestQueue::receive(&mut consumer, events.len()).await;
    eventually("all marked", || async { published(&pool).await == 6 }).await;
    let report = handle.shutdown().await;
    assert_eq!(report.totals.dead_lettered, 0);
    let seen: Vec<String> = deliveries
        .iter()
        .map(|d| {
            format!(
                "{}#{}",
                header(d, headers::AGGREGATE_ID).unwrap(),
                header(d, headers::SEQUENCE).unwrap()
            )
        })
        .collect();
    for aggregate in ["o-1", "o-2"] {
        let order: Vec<&String> = seen.iter().filter(|s| s.starts_with(aggregate)).collect();
        let want: Vec<String> = (1..=if aggregate == "o-1" { 4 } else { 2 })
            .map(|n| format!("{aggregate}#{n}"))
            .collect();
        assert_eq!(order, want.iter().collect::<Vec<_>>(), "{seen:?}");
    }
    queue.delete().await;
}

/// A queue at its `x-max-length` with `x-overflow: reject-publish` answers every publish with
/// a negative confirm until a consumer makes room. The refused events wait in the outbox
/// without spending attempts (within `full-patience`), then go out in their aggregate's order (before:
/// each was dead-lettered after `max-attempts`, and the aggregate's later events were left to
/// pass it once the queue had room).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_holds_events_back_without_dead_lettering_them() {
    use lapin::types::{AMQPValue, FieldTable, LongString};
    let mut config = config(Ordering::Ordered);
    config.relay.max_attempts = 2;
    let (pool, outbox) = outbox(&config).await;
    let mut arguments = FieldTable::default();
    arguments.insert("x-max-length".into(), AMQPValue::LongLongInt(2));
    arguments.insert(
        "x-overflow".into(),
        AMQPValue::LongString(LongString::from("reject-publish")),
    );
    let queue = TestQueue::with_arguments(arguments).await;
    let events: Vec<NewEvent> = (1..=4).map(|n| event("o-1", n)).collect();
    commit(&pool, &outbox, &events).await;
    let url = idempotency_testing::amqp_url();
    let handle = Relay::new(outbox.clone(), publisher(&url, &queue), &config)
        .unwrap()
        .spawn();
    let refused = || async {
        sqlx::query_scalar::<_, Option<String>>("SELECT last_error FROM outbox WHERE id = $1")
            .bind(events[2].id())
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    eventually("the third event refused by the full queue", || async {
        refused().await.is_some()
    })
    .await;
    // Counted failures (max-attempts 2, backoff at most 300ms) would have dead-lettered it
    // several times over by now.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let dead = scalar_i64(
        &pool,
        "SELECT count(*) FROM outbox WHERE dead_lettered_at IS NOT NULL",
    )
    .await;
    let error = refused().await.unwrap_or_default();
    assert_eq!(dead, 0, "dead-lettered by a full queue: {error}");
    let attempts = scalar_i64(&pool, "SELECT max(attempts)::int8 FROM outbox").await;
    assert!(attempts <= 1, "attempts spent on a full queue: {attempts}");
    assert!(error.contains("negative confirm"), "{error}");
    assert_eq!(published(&pool).await, 2);

    let mut consumer = queue.consumer().await;
    let deliveries = TestQueue::receive(&mut consumer, events.len()).await;
    eventually("all four marked", || async { published(&pool).await == 4 }).await;
    let report = handle.shutdown().await;
    assert_eq!(report.totals.dead_lettered, 0);
    let sent: Vec<String> = deliveries
        .iter()
        .map(|d| d.properties.message_id().as_ref().unwrap().to_string())
        .collect();
    let committed: Vec<String> = events.iter().map(|e| e.id().to_string()).collect();
    assert_eq!(sent, committed, "the aggregate's events in commit order");
    queue.delete().await;
}

/// A body over the publisher's `max-message-size` (set to the broker's `max_message_size`) is
/// refused before anything is sent and dead-lettered at its first attempt; the broker would
/// close the channel with reply 406 instead. The other messages go out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_max_message_size_is_dead_lettered_at_once() {
    let mut config = config(Ordering::Ordered);
    config.relay.max_attempts = 5;
    let (pool, outbox) = outbox(&config).await;
    let queue = TestQueue::new().await;
    let large = NewEvent::new("order", "big", "OrderUpdated", &"x".repeat(4096)).unwrap();
    let others = [event("big", 2), event("small", 1)];
    commit(&pool, &outbox, std::slice::from_ref(&large)).await;
    commit(&pool, &outbox, &others).await;
    let publisher = publisher(&idempotency_testing::amqp_url(), &queue).with_max_message_size(1024);
    let handle = Relay::new(outbox.clone(), publisher, &config)
        .unwrap()
        .spawn();
    let mut consumer = queue.consumer().await;
    let deliveries = TestQueue::receive(&mut consumer, others.len()).await;
    eventually("settled", || async { pending(&pool).await == 0 }).await;
    handle.shutdown().await;
    let mut got: Vec<String> = deliveries
        .iter()
        .map(|d| d.properties.message_id().as_ref().unwrap().to_string())
        .collect();
    let mut want: Vec<String> = others.iter().map(|e| e.id().to_string()).collect();
    got.sort();
    want.sort();
    assert_eq!(got, want);
    let (attempts, dead, error): (i32, bool, String) = sqlx::query_as(
        "SELECT attempts, dead_lettered_at IS NOT NULL, last_error FROM outbox WHERE id = $1",
    )
    .bind(large.id())
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(dead && attempts == 1, "{attempts} {error}");
    assert!(error.contains("larger than max-message-size"), "{error}");
    queue.delete().await;
}

/// A body the broker refuses although the publisher's limit lets it through (the client's
/// `max-message-size` raised above the broker's `max_message_size`, 128 MiB by default on
/// RabbitMQ 3.8 to 3.13 and 16 MiB on 4.x: the body here is over both): the broker closes the
/// publish's channel with reply 406 (`PRECONDITION_FAILED`), the publish fails as an
/// `InvalidMessage`, and the message is dead-lettered at its first attempt, never marked
/// published. The other messages, on other channels, are delivered, and so are later ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_the_broker_refuses_is_dead_lettered_at_once_and_not_marked_published() {
    use idempotency_outbox::publisher::rabbitmq::DEFAULT_MAX_MESSAGE_SIZE;
    let mut config = config(Ordering::Ordered);
    config.relay.max_attempts = 5;
    // Time to carry the body to the broker in a debug build: the answer must be the broker's.
    config.relay.publish_timeout = std::time::Duration::from_secs(60);
    let (pool, outbox) = outbox(&config).await;
    let queue = TestQueue::new().await;
    // A JSON string: the body is this many bytes plus its two quotes.
    let body = "x".repeat(DEFAULT_MAX_MESSAGE_SIZE);
    let large = NewEvent::new("order", "big", "OrderUpdated", &body).unwrap();
    drop(body);
    let others = [event("big", 2), event("small", 1)];
    commit(&pool, &outbox, std::slice::from_ref(&large)).await;
    commit(&pool, &outbox, &others).await;
    let publisher =
        publisher(&idempotency_testing::amqp_url(), &queue).with_max_message_size(usize::MAX);
    let handle = Relay::new(outbox.clone(), publisher, &config)
        .unwrap()
        .spawn();
    let mut consumer = queue.consumer().await;
    let deliveries = TestQueue::receive(&mut consumer, others.len()).await;
    eventually("settled", || async { pending(&pool).await == 0 }).await;
    let (attempts, dead, marked, error): (i32, bool, bool, String) = sqlx::query_as(
        "SELECT attempts, dead_lettered_at IS NOT NULL, published_at IS NOT NULL, last_error \
         FROM outbox WHERE id = $1",
    )
    .bind(large.id())
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(dead && !marked && attempts == 1, "{attempts} {error}");
    assert!(
        error.starts_with("message invalid for the broker") && error.contains("PRECONDITION"),
        "{error}"
    );
    // Later messages go out on the same publisher.
    let later = [event("big", 3), event("small", 2)];
    commit(&pool, &outbox, &later).await;
    let more = TestQueue::receive(&mut consumer, later.len()).await;
    eventually("all marked", || async { published(&pool).await == 4 }).await;
    let report = handle.shutdown().await;
    assert!(report.graceful, "{report:?}");
    let mut got: Vec<String> = deliveries
        .iter()
        .chain(&more)
        .map(|d| d.properties.message_id().as_ref().unwrap().to_string())
        .collect();
    let mut want: Vec<String> = others
        .iter()
        .chain(&later)
        .map(|e| e.id().to_string())
        .collect();
    got.sort();
    want.sort();
    assert_eq!(got, want, "the refused message never reached the queue");
    queue.delete().await;
}

/// `outbox.publisher.rabbitmq`: the configured publisher connects, declares its exchange with
/// `create`, publishes there with its routing-key template; what cannot work is refused naming
/// the property.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_configured_rabbitmq_publisher_declares_its_exchange_and_refuses_what_cannot_work() {
    use idempotency_outbox::Publisher;
    use idempotency_outbox::config::{OutboxConfig, PublisherConfig, RabbitMqPublisherConfig};
    use idempotency_outbox::publisher::ConfiguredPublisher;
    use lapin::options::{ExchangeDeleteOptions, QueueBindOptions};

    let queue = TestQueue::new().await;
    let exchange = format!("cfg-{}", uuid::Uuid::now_v7().simple());
    let configured = |rabbitmq: RabbitMqPublisherConfig| OutboxConfig {
        publisher: Some(PublisherConfig::Rabbitmq(rabbitmq)),
        ..OutboxConfig::default()
    };
    let good = RabbitMqPublisherConfig {
        url: idempotency_testing::amqp_url(),
        exchange: exchange.clone(),
        routing_key: "orders.{event_type}".to_owned(),
        create: true,
        channels: Some(8),
    };
    for (config, property) in [
        (
            RabbitMqPublisherConfig {
                url: String::new(),
                ..good.clone()
            },
            "outbox.publisher.rabbitmq.url",
        ),
        (
            RabbitMqPublisherConfig {
                url: "amqp://guest:guest@127.0.0.1:1/%2f".to_owned(),
                ..good.clone()
            },
            "outbox.publisher.rabbitmq.url",
        ),
        (
            RabbitMqPublisherConfig {
                exchange: String::new(),
                ..good.clone()
            },
            "outbox.publisher.rabbitmq.create",
        ),
        (
            RabbitMqPublisherConfig {
                routing_key: "{nope}".to_owned(),
                ..good.clone()
            },
            "outbox.publisher.rabbitmq.routing-key",
        ),
        (
            RabbitMqPublisherConfig {
                channels: Some(0),
                ..good.clone()
            },
            "outbox.publisher.rabbitmq.channels",
        ),
        (
            // Above RabbitMQ's default channel_max (2047): refused at start-up, not publish
            // by publish.
            RabbitMqPublisherConfig {
                channels: Some(60_000),
                ..good.clone()
            },
            "outbox.publisher.rabbitmq.channels",
        ),
    ] {
        let error = ConfiguredPublisher::from_config(&configured(config))
            .await
            .unwrap_err()
            .to_string();
        assert!(error.starts_with(property), "{property}: {error}");
    }

    let publisher = ConfiguredPublisher::from_config(&configured(good))
        .await
        .unwrap()
        .unwrap();
    let ConfiguredPublisher::RabbitMq(rabbitmq) = &publisher else {
        panic!("a RabbitMQ publisher: {publisher:?}");
    };
    assert_eq!(rabbitmq.channels(), 8, "outbox.publisher.rabbitmq.channels");
    // The exchange exists now: bind the test queue to it and publish through it.
    queue
        .channel
        .queue_bind(
            queue.name.as_str().into(),
            exchange.as_str().into(),
            "orders.#".into(),
            QueueBindOptions::default(),
            Default::default(),
        )
        .await
        .unwrap();
    let mut consumer = queue.consumer().await;
    let message = idempotency_outbox::OutboxMessage::new(
        uuid::Uuid::now_v7(),
        "order",
        "1",
        None,
        "OrderCreated",
        r#"{"n":1}"#,
        Default::default(),
        chrono::Utc::now(),
        0,
    );
    publisher.publish(&message).await.unwrap();
    let delivery = TestQueue::receive(&mut consumer, 1).await;
    assert_eq!(delivery[0].routing_key.as_str(), "orders.OrderCreated");
    queue
        .channel
        .exchange_delete(exchange.as_str().into(), ExchangeDeleteOptions::default())
        .await
        .unwrap();
}

/// `Publisher::health`: `Up` through a proxy that forwards (connecting as a publish would),
/// `Down` naming the failure once the proxy refuses, `Up` again when it forwards again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_follows_the_broker_connection() {
    use idempotency_outbox::{BrokerHealth, Publisher};
    let queue = TestQueue::new().await;
    let url = idempotency_testing::amqp_url();
    let proxy = Proxy::start(host_port(&url), true).await;
    let publisher = publisher(&via_port(&url, proxy.port), &queue);
    assert_eq!(publisher.health().await, BrokerHealth::Up, "connects");
    assert_eq!(
        publisher.health().await,
        BrokerHealth::Up,
        "stays connected"
    );
    proxy.disable();
    eventually("down", || async {
        matches!(publisher.health().await, BrokerHealth::Down(_))
    })
    .await;
    proxy.enable();
    assert_eq!(publisher.health().await, BrokerHealth::Up, "reconnects");
    queue.delete().await;
}
