//! Messages that never complete, on SQLite: a row claimed `max-attempts` times without being
//! marked (each publish crashed its relay) is dead-lettered by the next claim, and a publisher
//! that panics costs one attempt of one message, not the worker.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

mod outbox_common;

use std::time::Duration;

use idempotency_outbox::config::Ordering;
use idempotency_outbox::store::{ClaimRequest, DeadLetters, RelayStore};
use idempotency_outbox::{Ack, OutboxMessage, PublishError, Publisher, Relay};
use idempotency_sqlite::SqliteOutbox;
use outbox_common::*;
use uuid::Uuid;

async fn row_state(outbox: &SqliteOutbox, id: Uuid) -> (i64, bool, Option<String>) {
    sqlx::query_as(
        "SELECT attempts, dead_lettered_at IS NOT NULL, last_error FROM outbox WHERE id = ?1",
    )
    .bind(id.to_string())
    .fetch_one(outbox.pool())
    .await
    .unwrap()
}

#[tokio::test]
async fn claims_that_never_complete_end_in_the_dead_letters_after_max_attempts() {
    let (_, outbox) = fresh(&config(Ordering::Ordered)).await;
    let ids = commit(&outbox, &[event("crashing", 1), event("crashing", 2)]).await;
    let (doomed, behind) = (ids[0], ids[1]);
    // Each claim's relay crashes before marking; its lease ends at once.
    let crash = || ClaimRequest {
        limit: 10,
        lease: Duration::ZERO,
        token: Uuid::now_v7(),
        ordering: Ordering::Ordered,
        max_attempts: 3,
    };
    for attempt in 1..=3 {
        let claimed = outbox.claim(&crash()).await.unwrap();
        let got: Vec<_> = claimed.messages.iter().map(|m| m.id).collect();
        assert_eq!(got, [doomed], "claim {attempt}");
        assert!(claimed.dead_lettered.is_empty());
    }
    let fourth = outbox.claim(&crash()).await.unwrap();
    assert_eq!(
        fourth.dead_lettered,
        [doomed],
        "dead-lettered, not handed out"
    );
    assert!(fourth.messages.iter().all(|m| m.id != doomed));
    let fifth = outbox.claim(&crash()).await.unwrap();
    let got: Vec<_> = fifth.messages.iter().map(|m| m.id).collect();
    assert_eq!(got, [behind], "the aggregate is no longer blocked");
    assert!(fifth.dead_lettered.is_empty());

    let (attempts, dead, error) = row_state(&outbox, doomed).await;
    assert!(dead);
    assert_eq!(
        attempts, 4,
        "3 attempts, then the claim that dead-lettered it"
    );
    assert_eq!(error.as_deref(), Some("claimed 3 times without completing"));
    let letters = outbox.dead_letters(10).await.unwrap();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].message.id, doomed);
}

/// Panics for the message `doomed`; records the others.
#[derive(Clone)]
struct PanicsOn {
    inner: Recorder,
    doomed: Uuid,
}

impl Publisher for PanicsOn {
    fn destination(&self) -> &str {
        self.inner.destination()
    }

    async fn publish(&self, message: &OutboxMessage) -> Result<Ack, PublishError> {
        assert!(
            message.id != self.doomed,
            "boom: cannot encode {}",
            message.id
        );
        self.inner.publish(message).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publisher_panic_is_a_failed_attempt_and_the_other_messages_still_publish() {
    let mut config = config(Ordering::Ordered);
    config.relay.max_attempts = 3;
    let (_, outbox) = fresh(&config).await;
    let doomed = commit(&outbox, &[event("panicking", 1)]).await[0];
    let others: Vec<_> = (0..6)
        .map(|n| event(&format!("fine-{}", n % 3), n))
        .collect();
    commit(&outbox, &others).await;
    let recorder = Recorder::default();
    let publisher = PanicsOn {
        inner: recorder.clone(),
        doomed,
    };
    let handle = Relay::new(outbox.clone(), publisher, &config)
        .unwrap()
        .spawn();
    eventually("the others published", || async { recorder.count() == 6 }).await;
    eventually("the panicking message dead-lettered", || async {
        row_state(&outbox, doomed).await.1
    })
    .await;
    let (attempts, _, error) = row_state(&outbox, doomed).await;
    assert_eq!(attempts, 3);
    let error = error.unwrap();
    assert!(
        error.starts_with("publisher panicked: boom: cannot encode"),
        "{error}"
    );
    let report = handle.shutdown().await;
    assert!(report.graceful, "a caught publish panic stops no worker");
    assert_eq!(report.worker_panics, 0);
    assert_eq!((report.totals.published, report.totals.failed), (6, 3));
    assert_eq!(published(outbox.pool()).await, 6);
}
