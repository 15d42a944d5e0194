//! The real `idempotency_outbox::Relay` over `SqliteOutbox`: what commits is published once
//! with its outbox id, what rolls back never is, failures back off and are retried, dead
//! letters leave other aggregates alone and can be requeued, retention deletes published rows.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

mod outbox_common;

use std::time::Duration;

use idempotency_outbox::config::Ordering;
use idempotency_outbox::{LoggingPublisher, Relay};
use outbox_common::*;

#[tokio::test]
async fn a_failing_publisher_leaves_rows_pending_with_the_error_then_loses_nothing() {
    let mut config = config(Ordering::Unordered);
    // Seconds, so that the immediate batch below comes before the backoff ends even behind a
    // slow commit.
    config.relay.backoff.base = Duration::from_secs(3);
    config.relay.backoff.max = Duration::from_secs(6);
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
            last_error.starts_with("rejected by the broker: broker refused"),
            "{last_error}"
        );
        assert_eq!(published_at, None);
        // Backoff after the first failure: half to all of `base` (3 s), on the database clock.
        assert!(delay >= 1500, "next attempt {delay} ms after creation");
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
