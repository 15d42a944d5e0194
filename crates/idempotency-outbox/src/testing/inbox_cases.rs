//! The consumer inbox: one processing per message and consumer.

use std::sync::Arc;
use std::time::Duration;

use super::{Capabilities, OutboxBackend};
use crate::store::Inbox;

async fn record<B: OutboxBackend>(
    backend: &B,
    inbox: &B::Inbox,
    consumer: &str,
    message: &str,
    commit: bool,
) -> bool {
    let mut tx = backend.begin().await;
    let new = inbox
        .record(&mut tx, consumer, message)
        .await
        .expect("record");
    if commit {
        B::commit(tx).await;
    } else {
        B::rollback(tx).await;
    }
    new
}

/// A message is new once per consumer; a rolled-back processing leaves no trace.
pub async fn the_inbox_records_a_message_once_per_consumer<B: OutboxBackend>(
    backend: B,
    _caps: Capabilities,
) {
    let inbox = backend.inbox().await;
    assert!(record(&backend, &inbox, "billing", "m-1", false).await);
    assert!(
        record(&backend, &inbox, "billing", "m-1", true).await,
        "the rollback forgot it"
    );
    assert!(
        !record(&backend, &inbox, "billing", "m-1", true).await,
        "a redelivery"
    );
    assert!(
        record(&backend, &inbox, "shipping", "m-1", true).await,
        "another consumer"
    );
    assert!(record(&backend, &inbox, "billing", "m-2", true).await);
}

/// A consumer name or message id holding a NUL character is refused as the message's fault
/// (`InvalidEvent`) on every backend, nothing recorded (before: PostgreSQL's text refused it
/// with a database error on every delivery, so a consumer retrying errors stopped there, while
/// SQLite and MySQL recorded it).
pub async fn a_nul_in_a_message_id_is_an_invalid_event<B: OutboxBackend>(
    backend: B,
    _caps: Capabilities,
) {
    let inbox = backend.inbox().await;
    for (consumer, message) in [("billing", "m-\0-1"), ("bill\0ing", "m-1")] {
        let mut tx = backend.begin().await;
        let refused = inbox.record(&mut tx, consumer, message).await;
        assert!(
            matches!(refused, Err(crate::Error::InvalidEvent { .. })),
            "{consumer:?} {message:?}: {refused:?}"
        );
        B::rollback(tx).await;
    }
    assert!(record(&backend, &inbox, "billing", "m-1", true).await);
}

/// Concurrent deliveries of one message: exactly one is processed. With concurrent writers
/// the second waits inside `record` for the first: it sees `false` if the first commits,
/// `true` if it rolls back.
pub async fn concurrent_deliveries_of_one_message_are_processed_once<B: OutboxBackend>(
    backend: B,
    caps: Capabilities,
) {
    let backend = Arc::new(backend);
    let inbox = backend.inbox().await;
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (backend, inbox) = (Arc::clone(&backend), inbox.clone());
            tokio::spawn(async move { record(&*backend, &inbox, "billing", "m-1", true).await })
        })
        .collect();
    let mut new = 0;
    for task in tasks {
        new += usize::from(task.await.expect("delivery"));
    }
    assert_eq!(new, 1, "processed once");

    if caps.concurrent_writers {
        for commit_first in [true, false] {
            let message = format!("m-wait-{commit_first}");
            let mut tx = backend.begin().await;
            assert!(
                inbox
                    .record(&mut tx, "billing", &message)
                    .await
                    .expect("record")
            );
            let second = tokio::spawn({
                let (backend, inbox, message) =
                    (Arc::clone(&backend), inbox.clone(), message.clone());
                async move { record(&*backend, &inbox, "billing", &message, true).await }
            });
            tokio::time::sleep(Duration::from_millis(300)).await;
            assert!(!second.is_finished(), "the second delivery waits");
            if commit_first {
                B::commit(tx).await;
            } else {
                B::rollback(tx).await;
            }
            assert_eq!(
                second.await.expect("second delivery"),
                !commit_first,
                "commit_first = {commit_first}"
            );
        }
    }
}

/// `purge` deletes entries older than the cut-off, at most `limit` per call; a purged id is
/// new again.
pub async fn the_inbox_purges_old_entries_in_batches<B: OutboxBackend>(
    backend: B,
    _caps: Capabilities,
) {
    let inbox = backend.inbox().await;
    for n in 0..5 {
        assert!(record(&backend, &inbox, "billing", &format!("m-{n}"), true).await);
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        inbox
            .purge(Duration::from_secs(3600), 10)
            .await
            .expect("purge"),
        0
    );
    let mut batches = Vec::new();
    loop {
        let purged = inbox.purge(Duration::ZERO, 2).await.expect("purge");
        batches.push(purged);
        if purged == 0 {
            break;
        }
    }
    assert_eq!(batches, [2, 2, 1, 0]);
    assert!(
        record(&backend, &inbox, "billing", "m-0", true).await,
        "forgotten"
    );
}
