//! The real `idempotency_outbox::Relay` over `SqliteOutbox`: what commits is published once
//! with its outbox id, what rolls back never is, failures back off and are retried, dead
//! letters leave other aggregates alone and can be requeued, retention deletes published rows.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

mod outbox_common;

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use idempotency_outbox::config::Ordering;
use idempotency_outbox::store::{DeadLetters, Housekeeping};
use idempotency_outbox::{LoggingPublisher, Relay};
use outbox_common::*;

#[tokio::test]
async fn a_rolled_back_transaction_publishes_nothing() {
    let config = config(Ordering::Ordered);
    let (_, outbox) = fresh(&config).await;
    let recorder = Recorder::default();
    let relay = Relay::new(outbox.clone(), recorder.clone(), &config).unwrap();

    let mut tx = outbox.pool().begin_with("BEGIN IMMEDIATE").await.unwrap();
    outbox.enqueue(&mut tx, &event("o-1", 1)).await.unwrap();
    tx.rollback().await.unwrap();
    let report = relay.run_batch().await.unwrap();
    assert_eq!(report.claimed, 0);
    assert_eq!(recorder.count(), 0);
    assert_eq!(
        scalar(outbox.pool(), "SELECT count(*) FROM outbox").await,
        0
    );
    // The counter rolled back too: the next committed event of the aggregate is number 1.
    commit(&outbox, &[event("o-1", 2)]).await;
    relay.run_batch().await.unwrap();
    assert_eq!(recorder.published()[0].sequence, Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_events_are_published_exactly_once_with_their_outbox_id() {
    let config = config(Ordering::Ordered);
    let (_, outbox) = fresh(&config).await;
    let recorder = Recorder::default();
    let handle = Relay::new(outbox.clone(), recorder.clone(), &config)
        .unwrap()
        .spawn();
    let mut expected = BTreeMap::new();
    for tx in 0..20 {
        let events: Vec<_> = (0..3)
            .map(|n| event(&format!("o-{}", tx % 4), tx * 3 + n))
            .collect();
        let ids = commit(&outbox, &events).await;
        for (id, event) in ids.into_iter().zip(events) {
            assert_eq!(id, event.id());
            expected.insert(id, event);
        }
    }
    let pool = outbox.pool().clone();
    eventually("all 60 published", || async {
        published(&pool).await == 60
    })
    .await;
    // More polls find nothing more to publish.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let report = handle.shutdown().await;
    assert!(report.graceful);
    assert_eq!(report.totals.published, 60);

    let messages = recorder.published();
    assert_eq!(messages.len(), 60, "every event exactly once");
    let ids: HashSet<_> = messages.iter().map(|m| m.id).collect();
    assert_eq!(ids.len(), 60);
    for message in &messages {
        let event = &expected[&message.id];
        assert_eq!(message.id.get_version_num(), 7);
        assert_eq!(message.aggregate_id, event.aggregate_id());
        assert_eq!(message.event_type, "OrderUpdated");
        assert_eq!(message.payload, event.payload());
        assert_eq!(&message.headers, event.headers());
        assert_eq!(message.attempts, 1);
    }
    let stats = outbox.stats().await.unwrap();
    assert_eq!((stats.pending, stats.dead_lettered), (0, 0));
}

#[tokio::test]
async fn a_failing_publisher_leaves_rows_pending_with_the_error_then_loses_nothing() {
    let mut config = config(Ordering::Unordered);
    config.relay.backoff.base = Duration::from_millis(400);
    config.relay.backoff.max = Duration::from_secs(1);
    let (_, outbox) = fresh(&config).await;
    let recorder = Recorder::default();
    recorder.fail_when(|_| true);
    let relay = Relay::new(outbox.clone(), recorder.clone(), &config).unwrap();
    let ids = commit(&outbox, &[event("a", 1), event("b", 1), event("c", 1)]).await;

    let report = relay.run_batch().await.unwrap();
    assert_eq!((report.claimed, report.failed, report.published), (3, 3, 0));
    type Row = (i64, Option<String>, Option<i64>, i64, i64);
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT attempts, last_error, published_at, next_attempt_at - created_at, \
                claim_token IS NULL FROM outbox",
    )
    .fetch_all(outbox.pool())
    .await
    .unwrap();
    for (attempts, last_error, published_at, delay, released) in rows {
        assert_eq!(attempts, 1);
        let last_error = last_error.unwrap();
        assert!(
            last_error.starts_with("broker unavailable: broker refused"),
            "{last_error}"
        );
        assert_eq!(published_at, None);
        // Backoff after the first failure: half to all of `base` (400 ms), on the database clock.
        assert!(delay >= 200, "next attempt {delay} ms after creation");
        assert_eq!(released, 1, "the fencing token is cleared");
    }
    // Backing off: an immediate batch finds nothing due.
    assert_eq!(relay.run_batch().await.unwrap().claimed, 0);
    assert_eq!(pending(outbox.pool()).await, 3);

    recorder.heal();
    eventually("all published after the broker healed", || async {
        relay.run_batch().await.unwrap();
        published(outbox.pool()).await == 3
    })
    .await;
    let mut got: Vec<_> = recorder
        .published()
        .iter()
        .map(|m| (m.id, m.attempts))
        .collect();
    got.sort();
    let mut want: Vec<_> = ids.iter().map(|id| (*id, 2)).collect();
    want.sort();
    assert_eq!(got, want, "each published once, on its second attempt");
}

#[tokio::test]
async fn poison_messages_are_dead_lettered_without_holding_back_other_aggregates() {
    let mut config = config(Ordering::Ordered);
    config.relay.max_attempts = 3;
    config.relay.backoff.base = Duration::from_millis(1);
    config.relay.backoff.max = Duration::from_millis(2);
    let (_, outbox) = fresh(&config).await;
    let recorder = Recorder::default();
    recorder.fail_when(|m| m.aggregate_id == "poison");
    let relay = Relay::new(outbox.clone(), recorder.clone(), &config).unwrap();
    let poison = commit(&outbox, &[event("poison", 1), event("poison", 2)]).await;
    commit(
        &outbox,
        &[event("fine", 1), event("fine", 2), event("fine", 3)],
    )
    .await;

    eventually("both poison messages dead-lettered", || async {
        relay.run_batch().await.unwrap();
        outbox.stats().await.unwrap().dead_lettered == 2
    })
    .await;
    eventually("the healthy aggregate published", || async {
        relay.run_batch().await.unwrap();
        recorder.count() == 3
    })
    .await;
    let fine: Vec<_> = recorder.published().iter().map(|m| m.sequence).collect();
    assert_eq!(fine, [Some(1), Some(2), Some(3)]);
    assert_eq!(recorder.failures(), 6, "3 attempts for each poison message");

    let dead = outbox.dead_letters(10).await.unwrap();
    assert_eq!(
        dead.iter().map(|d| d.message.id).collect::<Vec<_>>(),
        poison
    );
    for letter in &dead {
        assert_eq!(letter.message.attempts, 3);
        assert!(
            letter
                .last_error
                .as_deref()
                .unwrap()
                .contains("broker refused poison")
        );
    }
    assert_eq!(relay.totals().dead_lettered, 2);

    recorder.heal();
    assert_eq!(outbox.requeue(&poison).await.unwrap(), 2);
    assert_eq!(
        outbox.requeue(&poison).await.unwrap(),
        0,
        "no longer dead letters"
    );
    eventually("requeued messages published", || async {
        relay.run_batch().await.unwrap();
        recorder.count() == 5
    })
    .await;
    let requeued: Vec<_> = recorder.published()[3..]
        .iter()
        .map(|m| (m.id, m.sequence, m.attempts))
        .collect();
    assert_eq!(requeued, [(poison[0], Some(1), 1), (poison[1], Some(2), 1)]);
    let stats = outbox.stats().await.unwrap();
    assert_eq!((stats.pending, stats.dead_lettered), (0, 0));
}

#[tokio::test]
async fn a_failing_message_holds_back_its_own_aggregate_only() {
    let mut config = config(Ordering::Ordered);
    config.relay.backoff.base = Duration::from_secs(60);
    config.relay.backoff.max = Duration::from_secs(60);
    let (_, outbox) = fresh(&config).await;
    let recorder = Recorder::default();
    recorder.fail_when(|m| m.aggregate_id == "stuck" && m.sequence == Some(1));
    let relay = Relay::new(outbox.clone(), recorder.clone(), &config).unwrap();
    commit(
        &outbox,
        &[event("stuck", 1), event("stuck", 2), event("free", 1)],
    )
    .await;
    commit(&outbox, &[event("free", 2)]).await;
    for _ in 0..4 {
        relay.run_batch().await.unwrap();
    }
    let got: Vec<_> = recorder
        .published()
        .iter()
        .map(|m| (m.aggregate_id.clone(), m.sequence))
        .collect();
    assert_eq!(
        got,
        [("free".to_owned(), Some(1)), ("free".to_owned(), Some(2))]
    );
    assert_eq!(
        pending(outbox.pool()).await,
        2,
        "stuck #1 backs off, stuck #2 waits for it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_that_dies_before_marking_republishes_after_the_lease() {
    let mut config = config(Ordering::Ordered);
    config.relay.publish_timeout = Duration::from_secs(1);
    config.relay.lease_margin = Duration::from_secs(1); // lease: 2 s
    let (_, outbox) = fresh(&config).await;
    let crashing = Recorder::default();
    crashing.hang_when(|_| true);
    let handle = Relay::new(outbox.clone(), crashing.clone(), &config)
        .unwrap()
        .spawn();
    let ids = commit(&outbox, &[event("a", 1), event("a", 2)]).await;
    eventually("the broker got a#1", || async { crashing.count() == 1 }).await;
    handle.abort(); // the process dies: a#1 was sent, never marked

    let mut config = config.clone();
    config.relay.publish_timeout = Duration::from_millis(100);
    let recorder = Recorder::default();
    let relay = Relay::new(outbox.clone(), recorder.clone(), &config).unwrap();
    assert_eq!(
        relay.run_batch().await.unwrap().claimed,
        0,
        "a#1 is leased, a#2 waits"
    );
    let started = std::time::Instant::now();
    eventually("both published by the next relay", || async {
        relay.run_batch().await.unwrap();
        recorder.count() == 2
    })
    .await;
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "not before the lease ended"
    );
    let got: Vec<_> = recorder
        .published()
        .iter()
        .map(|m| (m.id, m.attempts))
        .collect();
    assert_eq!(
        got,
        [(ids[0], 2), (ids[1], 1)],
        "a#1 again (at least once), then a#2"
    );
}

#[tokio::test]
async fn retention_deletes_published_rows_in_bounded_batches() {
    let mut config = config(Ordering::Ordered);
    config.retention.published = Duration::from_millis(1);
    config.retention.dead_lettered = Some(Duration::from_millis(1));
    config.retention.batch_size = 2;
    config.relay.max_attempts = 1;
    let (_, outbox) = fresh(&config).await;
    let recorder = Recorder::default();
    recorder.fail_when(|m| m.aggregate_id == "dead");
    let relay = Relay::new(outbox.clone(), recorder.clone(), &config).unwrap();
    commit(
        &outbox,
        &(1..=5).map(|n| event("kept", n)).collect::<Vec<_>>(),
    )
    .await;
    commit(&outbox, &[event("dead", 1)]).await;
    eventually("five published, one dead", || async {
        relay.run_batch().await.unwrap();
        published(outbox.pool()).await == 5 && outbox.stats().await.unwrap().dead_lettered == 1
    })
    .await;
    commit(&outbox, &[event("pending", 1)]).await;

    // Nothing is old enough for a one-hour retention.
    assert_eq!(
        outbox
            .delete_published(Duration::from_secs(3600), 10)
            .await
            .unwrap(),
        0
    );
    tokio::time::sleep(Duration::from_millis(5)).await;
    let report = relay.purge().await.unwrap();
    assert_eq!((report.published, report.dead_lettered), (5, 1));
    assert_eq!(
        report.batches,
        3 + 1,
        "2 + 2 + 1 published rows, then 1 dead letter"
    );
    assert_eq!(
        scalar(outbox.pool(), "SELECT count(*) FROM outbox").await,
        1
    );
    assert_eq!(
        pending(outbox.pool()).await,
        1,
        "pending rows are never deleted"
    );
    // The counters survive retention: numbering goes on.
    commit(&outbox, &[event("kept", 6)]).await;
    let sequence = scalar(
        outbox.pool(),
        "SELECT sequence FROM outbox WHERE aggregate_id = 'kept'",
    )
    .await;
    assert_eq!(sequence, 6);
}

#[tokio::test]
async fn the_logging_publisher_publishes_through_the_relay() {
    let config = config(Ordering::Ordered);
    let (_, outbox) = fresh(&config).await;
    let relay = Relay::new(outbox.clone(), LoggingPublisher::new(), &config).unwrap();
    commit(&outbox, &[event("log", 1), event("other", 1)]).await;
    let report = relay.run_batch().await.unwrap();
    assert_eq!((report.claimed, report.published), (2, 2));
    assert_eq!(published(outbox.pool()).await, 2);
}
