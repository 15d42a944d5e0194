//! The relay's metrics through the `metrics` facade, asserted with a local
//! `DebuggingRecorder` on a current-thread runtime (`common::with_recorder`).

#![cfg(feature = "nats")]
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::nats::TestStream;
use common::*;
use idempotency_outbox::config::Ordering;
use idempotency_outbox::{NewEvent, Relay, metrics as names};
use idempotency_testing::recorded::Recorded;
use metrics_util::debugging::DebugValue;

#[test]
fn the_relay_reports_counts_latency_and_gauges() {
    let recorded = with_recorder(async |snapshotter| {
        let mut config = config(Ordering::Ordered);
        config.relay.max_attempts = 2;
        let (pool, outbox) = outbox(&config).await;
        let stream = TestStream::new().await;
        // The stream takes small messages only: JetStream refuses the large payment event
        // twice, then it dead-letters. (A subject no stream captures would be the broker
        // unavailable: retried without counting, never dead-lettered.)
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
        let mut events: Vec<NewEvent> = (0..5).map(|n| event(&format!("m{n}"), n)).collect();
        events.push(NewEvent::new("payment", "p", "PaymentFailed", &"x".repeat(4096)).unwrap());
        commit(&pool, &outbox, &events).await;
        // m0 is in the stream already under its outbox id: JetStream acks the relay's publish
        // of it as a duplicate.
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(
            async_nats::header::NATS_MESSAGE_ID,
            events[0].id().to_string().as_str(),
        );
        stream
            .js
            .publish_with_headers(format!("{}.order.m0", stream.prefix), headers, "{}".into())
            .await
            .unwrap()
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;

        let relay = Relay::new(outbox.clone(), stream.publisher().await, &config).unwrap();
        relay.refresh_gauges().await.unwrap();
        let before = Recorded::take(&snapshotter);
        assert_eq!(before.gauge(names::PENDING, &[]), 6.0);
        let age = before.gauge(names::OLDEST_PENDING_AGE, &[]);
        assert!(age >= 0.1, "{age}");
        assert_eq!(before.gauge(names::DEAD_LETTERED, &[]), 0.0);

        let handle = relay.spawn();
        eventually("5 published and 1 dead letter", || async {
            published(&pool).await == 5
                && scalar_i64(
                    &pool,
                    "SELECT count(*) FROM outbox WHERE dead_lettered_at IS NOT NULL",
                )
                .await
                    == 1
        })
        .await;
        handle.shutdown().await;
        relay.refresh_gauges().await.unwrap();
        stream.delete().await;
        Recorded::take(&snapshotter)
    });

    let nats = [("destination", "nats")];
    assert_eq!(recorded.counter(names::PUBLISHED, &nats), 5);
    assert_eq!(recorded.counter(names::BROKER_DUPLICATES, &nats), 1);
    assert_eq!(recorded.counter(names::ATTEMPTS, &nats), 7);
    assert_eq!(
        recorded.counter(names::FAILED, &[("destination", "nats"), ("kind", "other")]),
        2
    );
    assert_eq!(recorded.counter(names::DEAD_LETTERED_TOTAL, &nats), 1);
    match recorded.get(names::LATENCY, &nats) {
        Some(DebugValue::Histogram(samples)) => {
            assert_eq!(samples.len(), 5);
            assert!(
                samples
                    .iter()
                    .all(|s| s.into_inner() > 0.0 && s.into_inner() < 30.0),
                "{samples:?}"
            );
        }
        other => panic!("latency: {other:?}"),
    }
    assert_eq!(recorded.gauge(names::PENDING, &[]), 0.0);
    assert_eq!(recorded.gauge(names::OLDEST_PENDING_AGE, &[]), 0.0);
    assert_eq!(recorded.gauge(names::DEAD_LETTERED, &[]), 1.0);
}

/// Answers each message's first publish by its aggregate (`a-down`: broker unavailable;
/// `c-late`: timed out; anything else: confirmed) and confirms every later attempt: one batch in which
/// the broker went away mid-batch.
#[derive(Default)]
struct MidBatchOutage {
    tried: std::sync::Mutex<std::collections::HashSet<uuid::Uuid>>,
}

impl idempotency_outbox::Publisher for MidBatchOutage {
    fn destination(&self) -> &str {
        "mid-batch"
    }

    async fn publish(
        &self,
        message: &idempotency_outbox::OutboxMessage,
    ) -> Result<idempotency_outbox::Ack, idempotency_outbox::PublishError> {
        use idempotency_outbox::{PublishError, PublishErrorKind};
        let first = self.tried.lock().unwrap().insert(message.id);
        match (first, message.aggregate_id.as_str()) {
            (true, "a-down") => Err(PublishError::kind_only(PublishErrorKind::Unavailable)),
            (true, "c-late") => Err(PublishError::kind_only(PublishErrorKind::Timeout)),
            _ => Ok(idempotency_outbox::Ack::default()),
        }
    }
}

/// One outage is one "lost" and one "back", whatever order a batch's results come in: a
/// publish sent before the outage started and confirmed after it did proves nothing about the
/// broker now, and a failure of a publish sent before the outage ended does not start
/// another (before: `a-down` lost, `b-up` back, `c-late` lost again, then back again). The batch's
/// order is the aggregates' and the ids'.
#[test]
fn an_outage_within_one_batch_changes_the_broker_state_once_each_way() {
    let recorded = with_recorder(async |snapshotter| {
        let mut config = config(Ordering::Ordered);
        config.relay.workers = 1;
        let (pool, outbox) = outbox(&config).await;
        let events: Vec<NewEvent> = ["a-down", "b-up", "c-late"]
            .iter()
            .enumerate()
            .map(|(n, aggregate)| event(aggregate, n))
            .collect();
        commit(&pool, &outbox, &events).await;
        let relay = Relay::new(outbox.clone(), MidBatchOutage::default(), &config).unwrap();
        let handle = relay.spawn();
        eventually("3 published", || async { published(&pool).await == 3 }).await;
        handle.shutdown().await;
        Recorded::take(&snapshotter)
    });
    let state = |state| {
        recorded.counter(
            names::BROKER_STATE_CHANGES,
            &[("destination", "mid-batch"), ("state", state)],
        )
    };
    assert_eq!((state("lost"), state("back")), (1, 1));
}

/// The broker goes away (the first publish: unavailable), then comes back with no room (every
/// later publish: the destination is full). A `full` answer is the broker answering: the
/// outage ends ("back" once), though nothing is confirmed; the refusals are not an outage of
/// their own (no second "lost") and dead-letter nothing within the patience (before: the
/// relay reported the broker lost until the first confirm, which a full stream may not give
/// for hours).
#[test]
fn a_full_answer_ends_an_outage_and_starts_none() {
    let recorded = with_recorder(async |snapshotter| {
        let mut config = config(Ordering::Ordered);
        config.relay.workers = 1;
        config.relay.max_attempts = 1;
        let (pool, outbox) = outbox(&config).await;
        let events: Vec<NewEvent> = (0..2).map(|n| event(&format!("f{n}"), n)).collect();
        commit(&pool, &outbox, &events).await;
        let publisher = FullAfterAnOutage::default();
        let relay = Relay::new(outbox.clone(), publisher, &config).unwrap();
        let handle = relay.spawn();
        let refused = || async {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM outbox WHERE last_error LIKE '%destination full%'",
            )
            .fetch_one(&pool)
            .await
            .unwrap()
        };
        eventually("both refused as full", || async { refused().await == 2 }).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        handle.shutdown().await;
        let dead: i64 =
            sqlx::query_scalar("SELECT count(*) FROM outbox WHERE dead_lettered_at IS NOT NULL")
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(dead, 0, "max-attempts 1, within the patience");
        Recorded::take(&snapshotter)
    });
    let state = |state| {
        recorded.counter(
            names::BROKER_STATE_CHANGES,
            &[("destination", "full-after-outage"), ("state", state)],
        )
    };
    assert_eq!((state("lost"), state("back")), (1, 1));
}

/// A blip between two refusals (a publish timed out) does not start the patience again: an
/// event a full destination refuses for good is dead-lettered once its refusals have gone on
/// for the patience and counted `max-attempts` times (before the review of this stop: every
/// other failure forgot the event, so a blip a day held it, and its aggregate, for ever).
#[test]
fn a_blip_between_refusals_does_not_start_the_patience_again() {
    with_recorder(async |_snapshotter| {
        let mut config = config(Ordering::Ordered);
        config.relay.workers = 1;
        config.relay.max_attempts = 2;
        config.relay.full_patience = Duration::from_secs(2);
        let (pool, outbox) = outbox(&config).await;
        commit(&pool, &outbox, &[event("blip", 0)]).await;
        let relay = Relay::new(outbox.clone(), FullWithBlips::default(), &config).unwrap();
        let handle = relay.spawn();
        let started = std::time::Instant::now();
        eventually("dead-lettered", || async {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM outbox WHERE dead_lettered_at IS NOT NULL",
            )
            .fetch_one(&pool)
            .await
            .unwrap()
                == 1
        })
        .await;
        handle.shutdown().await;
        assert!(
            started.elapsed() >= Duration::from_secs(2),
            "before the patience: {:?}",
            started.elapsed()
        );
    });
}

/// The destination full, except every third publish, which times out.
#[derive(Default)]
struct FullWithBlips {
    calls: std::sync::atomic::AtomicUsize,
}

impl idempotency_outbox::Publisher for FullWithBlips {
    fn destination(&self) -> &str {
        "full-with-blips"
    }

    async fn publish(
        &self,
        _message: &idempotency_outbox::OutboxMessage,
    ) -> Result<idempotency_outbox::Ack, idempotency_outbox::PublishError> {
        use idempotency_outbox::{PublishError, PublishErrorKind};
        let call = self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let kind = if call % 3 == 2 {
            PublishErrorKind::Timeout
        } else {
            PublishErrorKind::Full
        };
        Err(PublishError::kind_only(kind))
    }
}

/// The first publish: the broker unavailable; every later one: the destination full.
#[derive(Default)]
struct FullAfterAnOutage {
    calls: std::sync::atomic::AtomicUsize,
}

impl idempotency_outbox::Publisher for FullAfterAnOutage {
    fn destination(&self) -> &str {
        "full-after-outage"
    }

    async fn publish(
        &self,
        _message: &idempotency_outbox::OutboxMessage,
    ) -> Result<idempotency_outbox::Ack, idempotency_outbox::PublishError> {
        use idempotency_outbox::{PublishError, PublishErrorKind};
        let kind = match self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) {
            0 => PublishErrorKind::Unavailable,
            _ => PublishErrorKind::Full,
        };
        Err(PublishError::kind_only(kind))
    }
}

/// The housekeeping task goes on after a retention pass whose next one is too far for the
/// clock (`retention.interval = Duration::MAX`): the pending gauge, which only it refreshes,
/// still follows the table (before: its `Instant + Duration` panicked after the first pass,
/// and the gauge stayed where that pass left it).
#[test]
fn housekeeping_goes_on_after_a_retention_interval_too_long_for_the_clock() {
    let pending = with_recorder(async |snapshotter| {
        let mut config = config(Ordering::Ordered);
        config.retention.enabled = true;
        config.retention.interval = Duration::MAX;
        config.relay.stats_interval = Duration::from_millis(50);
        let (pool, outbox) = outbox(&config).await;
        let publisher = idempotency_outbox::testing::CollectingPublisher::default();
        let handle = Relay::new(outbox.clone(), publisher.clone(), &config)
            .unwrap()
            .spawn();
        // The first pass (gauges, then retention) runs before anything is committed.
        tokio::time::sleep(Duration::from_millis(200)).await;
        // Refused by the broker: they stay pending.
        let events: Vec<NewEvent> = (1..=3).map(|n| event("kept", n)).collect();
        for event in &events {
            publisher.refuse(event.id());
        }
        commit(&pool, &outbox, &events).await;
        tokio::time::sleep(Duration::from_millis(400)).await;
        let recorded = Recorded::take(&snapshotter);
        tokio::time::timeout(Duration::from_secs(30), handle.shutdown())
            .await
            .expect("the shutdown finished");
        recorded.gauge(names::PENDING, &[])
    });
    assert_eq!(pending, 3.0, "the gauges are still refreshed");
}
