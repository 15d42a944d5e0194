//! The relay against a real NATS JetStream: delivery once with the outbox id as `Nats-Msg-Id`,
//! rollback, broker outage, a worker dying between ack and mark, and a poison message.

#![cfg(feature = "nats")]
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::time::Duration;

use common::nats::{TestStream, client, header};
use common::*;
use idempotency_outbox::config::Ordering;
use idempotency_outbox::publisher::headers;
use idempotency_outbox::{DeadLetters, NewEvent, Relay};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_events_are_published_once_and_rolled_back_ones_never() {
    let config = config(Ordering::Ordered);
    let (pool, outbox) = outbox(&config).await;
    let stream = TestStream::new().await;

    let committed: Vec<NewEvent> = (0..5)
        .map(|n| event(&format!("agg-{}", n % 2), n))
        .collect();
    commit(&pool, &outbox, &committed).await;
    let mut tx = pool.begin().await.unwrap();
    outbox
        .enqueue(&mut tx, &event("agg-rolled-back", 99))
        .await
        .unwrap();
    tx.rollback().await.unwrap();

    let relay = Relay::new(outbox.clone(), stream.publisher().await, &config).unwrap();
    let handle = relay.spawn();
    eventually("5 published rows", || async { published(&pool).await == 5 }).await;
    let report = handle.shutdown().await;
    assert!(report.graceful);
    assert_eq!(report.totals.published, 5);
    assert_eq!(report.totals.duplicates, 0);

    let messages = stream.read(5).await;
    assert_eq!(stream.count().await, 5, "exactly the committed events");
    let by_id: BTreeMap<String, &async_nats::jetstream::Message> = messages
        .iter()
        .map(|m| (header(m, "Nats-Msg-Id").unwrap().to_owned(), m))
        .collect();
    assert_eq!(by_id.len(), 5, "five distinct message ids");
    for event in &committed {
        let message = by_id
            .get(&event.id().to_string())
            .unwrap_or_else(|| panic!("event {} not in the stream", event.id()));
        assert_eq!(
            message.subject.as_str(),
            format!("{}.order.OrderUpdated", stream.prefix)
        );
        assert_eq!(
            payload_of(&message.payload),
            serde_json::from_str::<serde_json::Value>(event.payload()).unwrap()
        );
        assert_eq!(
            header(message, "x-test"),
            event.headers().get("x-test").map(String::as_str)
        );
        assert_eq!(
            header(message, headers::AGGREGATE_ID),
            Some(event.aggregate_id())
        );
        assert_eq!(header(message, headers::EVENT_TYPE), Some("OrderUpdated"));
    }
    // Per-aggregate sequences 1.. in enqueue order.
    let seqs: Vec<(String, String)> = messages
        .iter()
        .map(|m| {
            (
                header(m, headers::AGGREGATE_ID).unwrap().to_owned(),
                header(m, headers::SEQUENCE).unwrap().to_owned(),
            )
        })
        .collect();
    for aggregate in ["agg-0", "agg-1"] {
        let got: Vec<&str> = seqs
            .iter()
            .filter(|(a, _)| a == aggregate)
            .map(|(_, s)| s.as_str())
            .collect();
        let want: Vec<String> = (1..=got.len()).map(|n| n.to_string()).collect();
        assert_eq!(got, want, "{aggregate}");
    }
    let rolled_back: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox WHERE aggregate_id = 'agg-rolled-back'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(rolled_back, 0);
    stream.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_wait_while_the_stream_is_missing_and_are_delivered_when_it_exists() {
    let config = config(Ordering::Unordered);
    let (pool, outbox) = outbox(&config).await;
    let stream = TestStream::named().await; // not created: JetStream has no responder
    let events: Vec<NewEvent> = (0..20).map(|n| event(&format!("a{n}"), n)).collect();
    commit(&pool, &outbox, &events).await;

    let relay = Relay::new(outbox.clone(), stream.publisher().await, &config).unwrap();
    let handle = relay.spawn();
    // Failures the broker's, not the messages': each given back its attempt.
    eventually("40 attempts failed", || async {
        handle.totals().failed >= 40
    })
    .await;
    let counted = scalar_i64(&pool, "SELECT count(*) FROM outbox WHERE attempts > 1").await;
    assert_eq!(counted, 0, "no attempt was counted twice");
    assert_eq!(
        pending(&pool).await,
        20,
        "nothing is marked while the broker is down"
    );
    let errors: Vec<String> = sqlx::query_scalar("SELECT DISTINCT last_error::text FROM outbox")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].starts_with("broker unavailable"), "{errors:?}");
    let backing_off = scalar_i64(
        &pool,
        "SELECT count(*) FROM outbox WHERE next_attempt_at > created_at",
    )
    .await;
    assert_eq!(backing_off, 20);

    stream.create().await; // the broker is back
    eventually("all delivered", || async { published(&pool).await == 20 }).await;
    let report = handle.shutdown().await;
    assert!(report.totals.failed >= 40, "{report:?}");
    let messages = stream.read(20).await;
    let ids: HashSet<&str> = messages
        .iter()
        .map(|m| header(m, "Nats-Msg-Id").unwrap())
        .collect();
    let want: HashSet<String> = events.iter().map(|e| e.id().to_string()).collect();
    assert_eq!(ids, want.iter().map(String::as_str).collect(), "none lost");
    assert_eq!(stream.count().await, 20);
    stream.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_dying_after_the_ack_causes_a_republish_that_jetstream_drops() {
    let mut config = config(Ordering::Ordered);
    config.relay.workers = 1;
    let (pool, outbox) = outbox(&config).await;
    let stream = TestStream::new().await;
    let doomed = event("crash", 1);
    let doomed_id = doomed.id();
    commit(&pool, &outbox, &[doomed]).await;

    // First relay: publishes (JetStream acks), then hangs before marking; we abort it.
    let acked = Arc::new(AtomicU64::new(0));
    let hanging = HangAfterAck {
        inner: stream.publisher().await,
        hang: Box::new(|_| true),
        acked: Arc::clone(&acked),
    };
    let first = Relay::new(outbox.clone(), hanging, &config)
        .unwrap()
        .spawn();
    eventually("the first publish acked", || async {
        acked.load(AtomicOrdering::SeqCst) == 1
    })
    .await;
    first.abort();
    assert_eq!(pending(&pool).await, 1, "not marked: the worker died");
    assert_eq!(stream.count().await, 1);

    // Second relay: the lease expires (publish-timeout + lease-margin = 3 s), it publishes the
    // same id again; JetStream reports a duplicate and stores nothing new.
    let second = Relay::new(outbox.clone(), stream.publisher().await, &config).unwrap();
    let handle = second.spawn();
    eventually("republished and marked", || async {
        published(&pool).await == 1
    })
    .await;
    let report = handle.shutdown().await;
    assert_eq!(report.totals.published, 1);
    assert_eq!(
        report.totals.duplicates, 1,
        "JetStream saw the same Nats-Msg-Id twice"
    );
    assert_eq!(
        stream.count().await,
        1,
        "the duplicate was dropped by JetStream"
    );
    let attempts = scalar_i64(&pool, "SELECT attempts::int8 FROM outbox").await;
    assert_eq!(attempts, 2);
    let message = &stream.read(1).await[0];
    assert_eq!(
        header(message, "Nats-Msg-Id"),
        Some(doomed_id.to_string().as_str())
    );
    stream.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_message_is_dead_lettered_without_holding_up_other_aggregates() {
    let mut config = config(Ordering::Ordered);
    config.relay.max_attempts = 3;
    let (pool, outbox) = outbox(&config).await;
    let stream = TestStream::new().await;
    // `payment` events are larger than the stream takes (`max_msg_size`): JetStream refuses
    // every attempt. (A subject no stream captures is the broker unavailable, not the
    // message's fault: retried without end, never dead-lettered.)
    let publisher =
        idempotency_outbox::publisher::nats::NatsPublisher::from_context(stream.js.clone())
            .with_subject(&format!(
                "{}.{{aggregate_type}}.{{event_type}}",
                stream.prefix
            ))
            .unwrap();
    let large = "x".repeat(4096);
    let poison = NewEvent::new("payment", "p-1", "PaymentFailed", &large).unwrap();
    let after_poison = NewEvent::new("payment", "p-1", "PaymentRetried", &large).unwrap();
    let healthy: Vec<NewEvent> = (0..10).map(|n| event(&format!("o{}", n % 3), n)).collect();
    // The stream only takes small messages.
    stream.delete().await;
    stream
        .js
        .create_stream(async_nats::jetstream::stream::Config {
            name: stream.name.clone(),
            subjects: vec![format!("{}.>", stream.prefix)],
            max_message_size: 2048,
            ..Default::default()
        })
        .await
        .unwrap();
    commit(&pool, &outbox, &[poison.clone(), after_poison.clone()]).await;
    commit(&pool, &outbox, &healthy).await;

    let relay = Relay::new(outbox.clone(), publisher, &config).unwrap();
    let handle = relay.spawn();
    eventually("the poison message dead-lettered", || async {
        scalar_i64(
            &pool,
            "SELECT count(*) FROM outbox WHERE dead_lettered_at IS NOT NULL",
        )
        .await
            >= 1
    })
    .await;
    eventually("healthy aggregates published", || async {
        scalar_i64(&pool, "SELECT count(*) FROM outbox WHERE aggregate_type = 'order' AND published_at IS NOT NULL").await == 10
    })
    .await;
    let dead = outbox.dead_letters(10).await.unwrap();
    assert_eq!(dead.first().map(|d| d.message.id), Some(poison.id()));
    assert_eq!(dead[0].message.attempts, 3);
    assert!(
        dead[0]
            .last_error
            .as_deref()
            .unwrap()
            .starts_with("publish failed"),
        "{:?}",
        dead[0].last_error
    );

    // Fix the stream: it now takes larger messages. Requeue the dead letters.
    eventually("both payment events dead-lettered", || async {
        outbox.dead_letters(10).await.unwrap().len() == 2
    })
    .await;
    let mut info = stream
        .js
        .get_stream(&stream.name)
        .await
        .unwrap()
        .get_info()
        .await
        .unwrap()
        .config;
    info.max_message_size = -1;
    stream.js.update_stream(info).await.unwrap();
    let requeued = outbox
        .requeue(&[poison.id(), after_poison.id()])
        .await
        .unwrap();
    assert_eq!(requeued, 2);
    eventually("requeued messages published", || async {
        published(&pool).await == 12
    })
    .await;
    handle.shutdown().await;
    let messages = stream.read(12).await;
    let payment: Vec<&str> = messages
        .iter()
        .filter(|m| header(m, headers::AGGREGATE_TYPE) == Some("payment"))
        .map(|m| header(m, headers::EVENT_TYPE).unwrap())
        .collect();
    assert_eq!(
        payment,
        ["PaymentFailed", "PaymentRetried"],
        "requeued in sequence order"
    );
    stream.delete().await;
}

/// A stream at its limit with `discard: new` refuses every publish until room is made. The
/// refused events wait in the outbox without spending attempts (within `full-patience`), and once
/// the stream takes messages again they go out in their aggregate's order (before: each was
/// dead-lettered after `max-attempts`, and the aggregate's later events were left to pass it
/// once the stream had room).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_stream_holds_events_back_without_dead_lettering_them() {
    let mut config = config(Ordering::Ordered);
    config.relay.max_attempts = 2;
    let (pool, outbox) = outbox(&config).await;
    let stream = TestStream::full_at(2).await;
    let events: Vec<NewEvent> = (0..4).map(|n| event("o-1", n)).collect();
    commit(&pool, &outbox, &events).await;
    let handle = Relay::new(outbox.clone(), stream.publisher().await, &config)
        .unwrap()
        .spawn();
    let refused = || async {
        sqlx::query_scalar::<_, Option<String>>("SELECT last_error FROM outbox WHERE id = $1")
            .bind(events[2].id())
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    eventually("the third event refused by the full stream", || async {
        refused().await.is_some()
    })
    .await;
    // Counted failures (max-attempts 2, backoff at most 300ms) would have dead-lettered it
    // several times over by now.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (dead, attempts): (i64, i32) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE dead_lettered_at IS NOT NULL), max(attempts) \
         FROM outbox WHERE published_at IS NULL",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let error = refused().await.unwrap_or_default();
    assert_eq!(dead, 0, "dead-lettered by a full stream: {error}");
    assert!(attempts <= 1, "attempts spent on a full stream: {attempts}");
    assert!(error.contains("maximum messages exceeded"), "{error}");
    assert_eq!(published(&pool).await, 2);

    let mut info = stream
        .js
        .get_stream(&stream.name)
        .await
        .unwrap()
        .get_info()
        .await
        .unwrap()
        .config;
    info.max_messages = -1;
    stream.js.update_stream(info).await.unwrap();
    eventually("all four published once the stream has room", || async {
        published(&pool).await == 4
    })
    .await;
    handle.shutdown().await;
    let sent: Vec<String> = stream
        .read(4)
        .await
        .iter()
        .map(|m| header(m, "Nats-Msg-Id").unwrap().to_owned())
        .collect();
    let committed: Vec<String> = events.iter().map(|e| e.id().to_string()).collect();
    assert_eq!(sent, committed, "the aggregate's events in commit order");
    stream.delete().await;
}

/// The patience counts from the first refusal, not from when the event was written: events
/// that waited out an outage in the outbox (here: written 25 hours ago, past the default 24 h
/// patience) reach a full stream and still wait, not counted (before: counted from the first
/// refusal on, dead-lettered within a second with `max-attempts: 2`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_older_than_the_patience_gets_it_all_when_its_stream_is_full() {
    let mut config = config(Ordering::Ordered);
    config.relay.max_attempts = 2;
    let (pool, outbox) = outbox(&config).await;
    let stream = TestStream::full_at(1).await;
    let events: Vec<NewEvent> = (0..3).map(|n| event("o-1", n)).collect();
    commit(&pool, &outbox, &events).await;
    sqlx::query("UPDATE outbox SET created_at = created_at - interval '25 hours'")
        .execute(&pool)
        .await
        .unwrap();
    let handle = Relay::new(outbox.clone(), stream.publisher().await, &config)
        .unwrap()
        .spawn();
    eventually("the second event refused by the full stream", || async {
        sqlx::query_scalar::<_, Option<String>>("SELECT last_error FROM outbox WHERE id = $1")
            .bind(events[1].id())
            .fetch_one(&pool)
            .await
            .unwrap()
            .is_some()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (dead, attempts): (i64, i32) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE dead_lettered_at IS NOT NULL), max(attempts) \
         FROM outbox WHERE published_at IS NULL",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    handle.shutdown().await;
    assert_eq!(dead, 0, "an event older than the patience dead-lettered");
    assert!(attempts <= 1, "attempts spent on a full stream: {attempts}");
    assert_eq!(published(&pool).await, 1);
    stream.delete().await;
}

/// `full-patience` bounds a full destination's hold: a stream that stays full (as for a
/// message larger than its `max_bytes`, refused for good under the same answer) counts the
/// event's refusals once it has waited that long, and dead-letters it after `max-attempts`
/// of them, not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_full_for_longer_than_the_patience_dead_letters_the_event() {
    let mut config = config(Ordering::Ordered);
    config.relay.max_attempts = 2;
    config.relay.full_patience = Duration::from_secs(2);
    let (pool, outbox) = outbox(&config).await;
    let stream = TestStream::full_at(1).await;
    let events: Vec<NewEvent> = (0..2).map(|n| event("o-1", n)).collect();
    commit(&pool, &outbox, &events).await;
    let handle = Relay::new(outbox.clone(), stream.publisher().await, &config)
        .unwrap()
        .spawn();
    eventually("the second event dead-lettered", || async {
        sqlx::query_scalar::<_, bool>(
            "SELECT dead_lettered_at IS NOT NULL FROM outbox WHERE id = $1",
        )
        .bind(events[1].id())
        .fetch_one(&pool)
        .await
        .unwrap()
    })
    .await;
    handle.shutdown().await;
    let (waited, attempts, error): (f64, i32, String) = sqlx::query_as(
        "SELECT extract(epoch FROM dead_lettered_at - created_at)::float8, attempts, last_error \
         FROM outbox WHERE id = $1",
    )
    .bind(events[1].id())
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(
        waited >= 2.0,
        "dead-lettered before the patience: {waited}s"
    );
    assert!(attempts >= 2, "{attempts}");
    assert!(error.contains("maximum messages exceeded"), "{error}");
    assert_eq!(published(&pool).await, 1);
    stream.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_wakes_an_idle_relay_long_before_its_poll_interval() {
    let mut config = config(Ordering::Ordered);
    config.relay.poll_interval = Duration::from_secs(3600);
    let (pool, outbox) = outbox(&config).await;
    let stream = TestStream::new().await;
    let handle = Relay::new(outbox.clone(), stream.publisher().await, &config)
        .unwrap()
        .spawn();
    tokio::time::sleep(Duration::from_millis(500)).await; // idle, listening
    for n in 0..3 {
        commit(&pool, &outbox, &[event("woken", n)]).await;
        eventually("published after NOTIFY", || async {
            published(&pool).await == n as i64 + 1
        })
        .await;
    }
    handle.shutdown().await;
    assert_eq!(stream.count().await, 3);
    stream.delete().await;
}

#[tokio::test]
async fn ensure_stream_creates_the_stream_the_template_needs_and_extends_an_existing_one() {
    use idempotency_outbox::publisher::nats::NatsPublisher;
    let url = std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned());
    let client = async_nats::connect(&url).await.unwrap();
    let jetstream = async_nats::jetstream::new(client.clone());
    let unique = uuid::Uuid::now_v7().simple().to_string();
    let name = format!("ENSURE_{unique}");
    let template = format!("ensure{unique}.{{aggregate_type}}.{{event_type}}");
    let publisher = NatsPublisher::new(client.clone())
        .with_subject(&template)
        .unwrap();
    assert_eq!(publisher.subject_filter(), format!("ensure{unique}.>"));

    publisher
        .ensure_stream(&name, Duration::from_secs(90))
        .await
        .unwrap();
    publisher
        .ensure_stream(&name, Duration::from_secs(90))
        .await
        .unwrap(); // idempotent
    let mut stream = jetstream.get_stream(&name).await.unwrap();
    let info = stream.info().await.unwrap();
    assert_eq!(info.config.subjects, vec![format!("ensure{unique}.>")]);
    assert_eq!(info.config.duplicate_window, Duration::from_secs(90));
    // A message on a rendered subject is captured.
    jetstream
        .publish(format!("ensure{unique}.charge.ChargeCreated"), "{}".into())
        .await
        .unwrap()
        .await
        .unwrap();
    assert_eq!(stream.info().await.unwrap().state.messages, 1);

    // A stream that exists with other subjects gains the template's filter, keeping its own.
    let other = NatsPublisher::new(client)
        .with_subject(&format!("more{unique}.{{event_type}}"))
        .unwrap();
    other
        .ensure_stream(&name, Duration::from_secs(90))
        .await
        .unwrap();
    let subjects = stream.info().await.unwrap().config.subjects.clone();
    assert_eq!(
        subjects,
        vec![format!("ensure{unique}.>"), format!("more{unique}.>")]
    );
    jetstream.delete_stream(&name).await.unwrap();
}

/// A stream whose duplicate window is shorter than the relay's republish window (lease plus
/// `relay.backoff.max`) is refused, naming the keys; a long enough one passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_window_shorter_than_the_republish_window_is_refused() {
    let stream = TestStream::new().await; // a 120 s window
    let publisher = stream.publisher().await;
    let relay = idempotency_outbox::config::RelayConfig::default(); // 10 s lease + 5 min
    let error = publisher
        .check_duplicate_window(&stream.name, &relay)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("2m") && error.contains("relay.backoff.max"),
        "{error}"
    );
    let short = idempotency_outbox::config::RelayConfig {
        backoff: idempotency_outbox::config::BackoffConfig {
            base: Duration::from_secs(1),
            max: Duration::from_secs(60),
        },
        ..idempotency_outbox::config::RelayConfig::default()
    };
    publisher
        .check_duplicate_window(&stream.name, &short)
        .await
        .unwrap();
    stream.delete().await;
}

/// The relay asks its publisher for the broker's duplicate window before it starts: a
/// stream whose window is shorter than the republish window is refused naming the keys, a
/// long enough one passes, and no stream at all (every publish would be refused) is an error
/// too; `ensure_stream` lengthens a short window it is asked to lengthen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_checks_the_brokers_duplicate_window_before_it_starts() {
    let mut config = config(Ordering::Unordered);
    config.relay = idempotency_outbox::config::RelayConfig::default(); // republishes within 5m 10s
    let (_pool, outbox) = outbox(&config).await;

    let missing = TestStream::named().await;
    let relay = Relay::new(outbox.clone(), missing.publisher().await, &config).unwrap();
    let error = relay.check_duplicate_window().await.unwrap_err();
    assert!(
        matches!(error, idempotency_outbox::Error::Publisher(_)),
        "{error:?}"
    );
    let mut chain = error.to_string();
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        chain = format!("{chain}: {cause}");
        source = cause.source();
    }
    assert!(chain.contains("no JetStream stream captures"), "{chain}");

    let stream = TestStream::new().await; // a 120 s window
    let publisher = stream.publisher().await;
    let relay = Relay::new(outbox.clone(), publisher.clone(), &config).unwrap();
    let error = relay
        .check_duplicate_window()
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("2m") && error.contains("relay.backoff.max"),
        "{error}"
    );

    publisher
        .ensure_stream(&stream.name, config.relay.republish_window())
        .await
        .unwrap();
    relay.check_duplicate_window().await.unwrap();
    stream.delete().await;
}

/// Messages NATS can never take are dead-lettered at their first attempt, not retried for
/// `max-attempts` while they hold back their aggregate: payload and headers over the server's
/// `max_payload`, a subject a placeholder rendered with whitespace. Their aggregates' next
/// events and the other messages are delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_nats_can_never_take_are_dead_lettered_at_once() {
    let mut config = config(Ordering::Ordered);
    config.relay.max_attempts = 5;
    let (pool, outbox) = outbox(&config).await;
    let stream = TestStream::new().await;
    let max_payload = client().await.server_info().max_payload;
    let too_large =
        NewEvent::new("order", "big", "OrderUpdated", &"x".repeat(max_payload)).unwrap();
    // `{aggregate_type}` renders into the subject: a space cannot be sent.
    let spaced = NewEvent::new("bad type", "s", "OrderUpdated", &1).unwrap();
    let good = [
        event("big", 2),
        NewEvent::new("bad type", "s", "OrderUpdated", &2).unwrap(),
        event("other", 1),
    ];
    commit(&pool, &outbox, &[too_large.clone(), spaced.clone()]).await;
    commit(&pool, &outbox, &good).await;
    let handle = Relay::new(outbox.clone(), stream.publisher().await, &config)
        .unwrap()
        .spawn();
    eventually("settled", || async { pending(&pool).await == 0 }).await;
    handle.shutdown().await;
    for (event, what) in [(&too_large, "max payload"), (&spaced, "whitespace")] {
        let (attempts, dead, error): (i32, bool, String) = sqlx::query_as(
            "SELECT attempts, dead_lettered_at IS NOT NULL, last_error FROM outbox WHERE id = $1",
        )
        .bind(event.id())
        .fetch_one(&pool)
        .await
        .unwrap();
        assert!(dead, "{what}: {error}");
        assert_eq!(
            attempts, 1,
            "{what}: dead-lettered at the first attempt ({error})"
        );
        assert!(
            error.starts_with("message invalid for the broker") && error.contains(what),
            "{what}: {error}"
        );
    }
    let delivered: Vec<uuid::Uuid> =
        sqlx::query_scalar("SELECT id FROM outbox WHERE published_at IS NOT NULL")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert!(
        delivered.contains(&good[0].id()),
        "the large one's successor"
    );
    assert!(delivered.contains(&good[2].id()));
    stream.delete().await;
}

/// `Publisher::health`: `Up` while connected and JetStream answers, `Down` naming the
/// connection's state once the proxy cuts it, `Up` again after the client reconnected; the
/// relay's monitor asks the same publisher.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_follows_the_connection_and_jetstream() {
    use idempotency_outbox::publisher::nats::NatsPublisher;
    use idempotency_outbox::{BrokerHealth, Publisher};
    let url = idempotency_testing::nats_url();
    let proxy = Proxy::start(host_port(&url), true).await;
    let client = async_nats::ConnectOptions::new()
        .connect(format!("nats://127.0.0.1:{}", proxy.port))
        .await
        .unwrap();
    let publisher = Arc::new(NatsPublisher::new(client));
    assert_eq!(publisher.health().await, BrokerHealth::Up);

    let config = config(Ordering::Unordered);
    let (_pool, outbox) = outbox(&config).await;
    let handle = Relay::new(outbox, Arc::clone(&publisher), &config)
        .unwrap()
        .spawn();
    let monitor = handle.monitor();
    assert_eq!(monitor.destination(), "nats");
    assert_eq!(monitor.broker_health().await, BrokerHealth::Up);

    proxy.disable();
    eventually("down", || async {
        matches!(publisher.health().await, BrokerHealth::Down(_))
    })
    .await;
    assert!(matches!(
        monitor.broker_health().await,
        BrokerHealth::Down(_)
    ));
    proxy.enable();
    eventually("up again", || async {
        publisher.health().await == BrokerHealth::Up
    })
    .await;
    handle.shutdown().await;
}
