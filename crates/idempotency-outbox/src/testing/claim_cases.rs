//! Claims, leases, fencing, failures, dead letters, stats, retention, notifications.

use std::time::Duration;

use uuid::Uuid;

use super::support::{commit, event, request, suite_config};
use super::{Capabilities, OutboxBackend};
use crate::config::Ordering;
use crate::store::{DeadLetters, Enqueue, Failure, Housekeeping, NotificationListener, RelayStore};

const LEASE: Duration = Duration::from_secs(30);

fn ids<'a>(messages: impl IntoIterator<Item = &'a crate::OutboxMessage>) -> Vec<Uuid> {
    let mut ids: Vec<Uuid> = messages.into_iter().map(|m| m.id).collect();
    ids.sort_unstable();
    ids
}

/// An ordered claim takes only the first pending row of each aggregate, and none of an
/// aggregate whose first pending row is leased; an unordered claim ignores that rule.
pub async fn ordered_claims_take_the_first_pending_row_of_each_aggregate<B: OutboxBackend>(
    backend: B,
    _caps: Capabilities,
) {
    let outbox = backend.outbox(&suite_config(Ordering::Ordered)).await;
    commit(
        &backend,
        &outbox,
        &[event("a", 1), event("a", 2), event("b", 1)],
    )
    .await;
    commit(&backend, &outbox, &[event("a", 3)]).await;
    let ordered = request(Ordering::Ordered, LEASE);
    let mut batch = outbox.claim(&ordered).await.expect("claim").messages;
    batch.sort_by_key(|m| m.aggregate_id.clone());
    let got: Vec<_> = batch
        .iter()
        .map(|m| (m.aggregate_id.as_str(), m.sequence))
        .collect();
    assert_eq!(got, [("a", Some(1)), ("b", Some(1))]);
    assert!(
        outbox
            .claim(&ordered)
            .await
            .expect("claim")
            .messages
            .is_empty(),
        "while a#1 is leased, a's later rows wait"
    );
    let published = outbox
        .mark_published(ordered.token, &ids(&batch))
        .await
        .expect("mark");
    assert_eq!(published, 2);
    let next = outbox.claim(&ordered).await.expect("claim").messages;
    let got: Vec<_> = next
        .iter()
        .map(|m| (m.aggregate_id.as_str(), m.sequence))
        .collect();
    assert_eq!(got, [("a", Some(2))]);
    let unordered = outbox
        .claim(&request(Ordering::Unordered, LEASE))
        .await
        .expect("claim")
        .messages;
    let got: Vec<_> = unordered.iter().map(|m| m.sequence).collect();
    assert_eq!(got, [Some(3)], "only a#3 is neither leased nor published");
}

/// An unordered claim takes every due row, up to the limit, and leaves leased rows alone.
pub async fn unordered_claims_take_every_due_row<B: OutboxBackend>(
    backend: B,
    _caps: Capabilities,
) {
    let outbox = backend.outbox(&suite_config(Ordering::Unordered)).await;
    let events: Vec<_> = (1..=5).map(|n| event("a", n)).collect();
    let mut sent = commit(&backend, &outbox, &events).await;
    sent.sort_unstable();
    let mut limited = request(Ordering::Unordered, LEASE);
    limited.limit = 3;
    let first = outbox.claim(&limited).await.expect("claim").messages;
    assert_eq!(first.len(), 3, "the limit holds");
    let rest = outbox
        .claim(&request(Ordering::Unordered, LEASE))
        .await
        .expect("claim")
        .messages;
    assert_eq!(rest.len(), 2, "leased rows are not claimed twice");
    assert_eq!(ids(first.iter().chain(&rest)), sent);
}

/// A claim is a lease: the row stays invisible until it ends, then it is claimed again with
/// one more attempt counted.
pub async fn a_claim_is_a_lease_and_an_expired_lease_returns_the_row<B: OutboxBackend>(
    backend: B,
    _caps: Capabilities,
) {
    let outbox = backend.outbox(&suite_config(Ordering::Unordered)).await;
    let sent = commit(&backend, &outbox, &[event("a", 1)]).await;
    // Long enough that the second claim cannot come after it ends, even behind a slow commit.
    let short = request(Ordering::Unordered, Duration::from_secs(2));
    let first = outbox.claim(&short).await.expect("claim").messages;
    assert_eq!((ids(&first), first[0].attempts), (sent.clone(), 1));
    assert!(
        outbox
            .claim(&short)
            .await
            .expect("claim")
            .messages
            .is_empty()
    );
    tokio::time::sleep(Duration::from_millis(2300)).await;
    let again = outbox
        .claim(&request(Ordering::Unordered, LEASE))
        .await
        .expect("claim")
        .messages;
    assert_eq!((ids(&again), again[0].attempts), (sent, 2));
}

/// Marks apply only to rows that still hold the claim's token: a worker whose lease ran out
/// cannot overwrite the work of the worker that took the row over.
pub async fn a_stale_token_cannot_mark_rows_another_claim_took_over<B: OutboxBackend>(
    backend: B,
    _caps: Capabilities,
) {
    let outbox = backend.outbox(&suite_config(Ordering::Unordered)).await;
    let sent = commit(&backend, &outbox, &[event("a", 1)]).await;
    let stale = request(Ordering::Unordered, Duration::from_millis(200));
    assert_eq!(outbox.claim(&stale).await.expect("claim").messages.len(), 1);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let current = request(Ordering::Unordered, LEASE);
    assert_eq!(
        outbox.claim(&current).await.expect("claim").messages.len(),
        1
    );
    let failure = Failure {
        id: sent[0],
        error: "late".to_owned(),
        retry_in: Duration::ZERO,
        dead_letter: true,
        transient: false,
    };
    assert_eq!(
        outbox
            .mark_failed(stale.token, std::slice::from_ref(&failure))
            .await
            .expect("mark"),
        0
    );
    assert_eq!(
        outbox
            .mark_published(stale.token, &sent)
            .await
            .expect("mark"),
        0
    );
    assert_eq!(
        outbox
            .mark_published(current.token, &sent)
            .await
            .expect("mark"),
        1
    );
    let stats = outbox.stats().await.expect("stats");
    assert_eq!((stats.pending, stats.dead_lettered), (0, 0));
}

/// A failure records the error and backs off from the database clock; a dead-lettered row
/// leaves the pending rows, is listed with its error, and `requeue` makes it due again with
/// its attempts reset.
pub async fn failures_back_off_and_dead_letters_can_be_requeued<B: OutboxBackend>(
    backend: B,
    _caps: Capabilities,
) {
    let outbox = backend.outbox(&suite_config(Ordering::Unordered)).await;
    let sent = commit(&backend, &outbox, &[event("a", 1), event("b", 1)]).await;
    let (retried, dead) = (sent[0], sent[1]);
    let claim = request(Ordering::Unordered, LEASE);
    assert_eq!(outbox.claim(&claim).await.expect("claim").messages.len(), 2);
    let failures = [
        Failure {
            id: retried,
            error: "broker away".to_owned(),
            // Long enough that the next claim cannot come after it ends, even behind a slow
            // commit.
            retry_in: Duration::from_secs(2),
            dead_letter: false,
            transient: false,
        },
        Failure {
            id: dead,
            error: "poison".to_owned(),
            retry_in: Duration::ZERO,
            dead_letter: true,
            transient: false,
        },
    ];
    assert_eq!(
        outbox
            .mark_failed(claim.token, &failures)
            .await
            .expect("mark"),
        2
    );
    assert!(
        outbox
            .claim(&request(Ordering::Unordered, LEASE))
            .await
            .expect("claim")
            .messages
            .is_empty(),
        "backing off, and dead"
    );
    tokio::time::sleep(Duration::from_millis(2300)).await;
    let back = outbox
        .claim(&request(Ordering::Unordered, LEASE))
        .await
        .expect("claim")
        .messages;
    assert_eq!((ids(&back), back[0].attempts), (vec![retried], 2));

    let letters = outbox.dead_letters(10).await.expect("dead letters");
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].message.id, dead);
    assert_eq!(letters[0].last_error.as_deref(), Some("poison"));
    assert_eq!(outbox.stats().await.expect("stats").dead_lettered, 1);

    let requeued = outbox
        .requeue(&[dead, Uuid::now_v7(), retried])
        .await
        .expect("requeue");
    assert_eq!(requeued, 1, "only dead-lettered ids are requeued");
    let again = outbox
        .claim(&request(Ordering::Unordered, LEASE))
        .await
        .expect("claim")
        .messages;
    assert_eq!((ids(&again), again[0].attempts), (vec![dead], 1));
    assert!(
        outbox
            .dead_letters(10)
            .await
            .expect("dead letters")
            .is_empty()
    );
}

/// The gauges: pending rows, the age of the oldest one, dead letters.
pub async fn stats_count_pending_and_dead_rows_and_age_the_oldest<B: OutboxBackend>(
    backend: B,
    _caps: Capabilities,
) {
    let outbox = backend.outbox(&suite_config(Ordering::Unordered)).await;
    let empty = outbox.stats().await.expect("stats");
    assert_eq!(
        (empty.pending, empty.dead_lettered, empty.oldest_pending_age),
        (0, 0, 0.0)
    );
    let sent = commit(
        &backend,
        &outbox,
        &[event("a", 1), event("b", 1), event("c", 1)],
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stats = outbox.stats().await.expect("stats");
    assert_eq!((stats.pending, stats.dead_lettered), (3, 0));
    assert!(
        (0.2..60.0).contains(&stats.oldest_pending_age),
        "{}",
        stats.oldest_pending_age
    );
    let claim = request(Ordering::Unordered, LEASE);
    outbox.claim(&claim).await.expect("claim");
    let poison = Failure {
        id: sent[0],
        error: "poison".to_owned(),
        retry_in: Duration::ZERO,
        dead_letter: true,
        transient: false,
    };
    outbox
        .mark_failed(claim.token, &[poison])
        .await
        .expect("mark");
    outbox
        .mark_published(claim.token, &sent[1..])
        .await
        .expect("mark");
    let stats = outbox.stats().await.expect("stats");
    assert_eq!(
        (stats.pending, stats.dead_lettered, stats.oldest_pending_age),
        (0, 1, 0.0)
    );
}

/// Retention deletes published and dead-lettered rows older than the cut-off, at most `limit`
/// per call, and never a pending row.
pub async fn retention_deletes_in_bounded_batches<B: OutboxBackend>(
    backend: B,
    _caps: Capabilities,
) {
    let outbox = backend.outbox(&suite_config(Ordering::Unordered)).await;
    let events: Vec<_> = (1..=5).map(|n| event("p", n)).collect();
    let published = commit(&backend, &outbox, &events).await;
    let claim = request(Ordering::Unordered, LEASE);
    outbox.claim(&claim).await.expect("claim");
    outbox
        .mark_published(claim.token, &published)
        .await
        .expect("mark");
    let events: Vec<_> = (1..=3).map(|n| event("d", n)).collect();
    let dead = commit(&backend, &outbox, &events).await;
    let claim = request(Ordering::Unordered, LEASE);
    outbox.claim(&claim).await.expect("claim");
    let failures: Vec<_> = dead
        .iter()
        .map(|&id| Failure {
            id,
            error: "poison".to_owned(),
            retry_in: Duration::ZERO,
            dead_letter: true,
            transient: false,
        })
        .collect();
    outbox
        .mark_failed(claim.token, &failures)
        .await
        .expect("mark");
    commit(&backend, &outbox, &[event("pending", 1)]).await;
    tokio::time::sleep(Duration::from_millis(50)).await;

    assert_eq!(
        outbox
            .delete_published(Duration::from_secs(3600), 10)
            .await
            .expect("delete"),
        0,
        "nothing is that old"
    );
    let mut batches = Vec::new();
    loop {
        let deleted = outbox
            .delete_published(Duration::ZERO, 2)
            .await
            .expect("delete");
        batches.push(deleted);
        if deleted == 0 {
            break;
        }
    }
    assert_eq!(batches, [2, 2, 1, 0]);
    let mut batches = Vec::new();
    loop {
        let deleted = outbox
            .delete_dead_lettered(Duration::ZERO, 2)
            .await
            .expect("delete");
        batches.push(deleted);
        if deleted == 0 {
            break;
        }
    }
    assert_eq!(batches, [2, 1, 0]);
    let stats = outbox.stats().await.expect("stats");
    assert_eq!(
        (stats.pending, stats.dead_lettered),
        (1, 0),
        "the pending row stays"
    );
}

/// With notifications, a listener wakes after a commit that enqueued, and not for a rollback;
/// without them, `listen` answers `None` (relays poll).
pub async fn notifications_wake_a_listener_after_commit<B: OutboxBackend>(
    backend: B,
    caps: Capabilities,
) {
    let outbox = backend.outbox(&suite_config(Ordering::Ordered)).await;
    let listener = outbox.listen().await.expect("listen");
    if !caps.notifications {
        assert!(listener.is_none(), "no notifications: relays poll");
        return;
    }
    let mut listener = listener.expect("a listener");
    let mut tx = backend.begin().await;
    outbox
        .enqueue_all(&mut tx, &[event("a", 1)])
        .await
        .expect("enqueue");
    B::rollback(tx).await;
    assert!(
        tokio::time::timeout(Duration::from_millis(300), listener.next())
            .await
            .is_err(),
        "a rolled-back enqueue notifies nobody"
    );
    commit(&backend, &outbox, &[event("a", 2)]).await;
    let woke = tokio::time::timeout(Duration::from_secs(5), listener.next())
        .await
        .expect("woken after the commit");
    assert!(woke.is_ok(), "{woke:?}");
}

/// A row claimed `max-attempts` times without ever being marked (each publish crashed its
/// relay, or outlived its lease) is dead-lettered by the next claim instead of being handed out
/// again, and its aggregate's next event goes on.
pub async fn a_row_claimed_max_attempts_times_without_completing_is_dead_lettered<
    B: OutboxBackend,
>(
    backend: B,
    _caps: Capabilities,
) {
    let outbox = backend.outbox(&suite_config(Ordering::Ordered)).await;
    let sent = commit(&backend, &outbox, &[event("a", 1), event("a", 2)]).await;
    let mut crashing = request(Ordering::Ordered, Duration::from_millis(100));
    crashing.max_attempts = 3;
    for attempt in 1..=3 {
        let claimed = outbox.claim(&crashing).await.expect("claim");
        assert_eq!(ids(&claimed.messages), vec![sent[0]], "attempt {attempt}");
        assert!(claimed.dead_lettered.is_empty());
        if attempt == 1 {
            // The first attempt failed the ordinary way, with the longest error kept.
            let failure = Failure {
                id: sent[0],
                error: "e".repeat(crate::store::MAX_ERROR_LEN),
                retry_in: Duration::ZERO,
                dead_letter: false,
                transient: false,
            };
            outbox
                .mark_failed(crashing.token, &[failure])
                .await
                .expect("mark");
        } else {
            tokio::time::sleep(Duration::from_millis(200)).await; // then it crashed twice
        }
    }
    let claimed = outbox.claim(&crashing).await.expect("claim");
    assert_eq!(claimed.dead_lettered, vec![sent[0]]);
    let letters = outbox.dead_letters(10).await.expect("dead letters");
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].message.id, sent[0]);
    let error = letters[0].last_error.as_deref().unwrap_or_default();
    assert!(
        error.starts_with("claimed 3 times without completing; last error: eee"),
        "the earlier error is kept: {error:?}"
    );
    assert!(error.chars().count() <= crate::store::MAX_ERROR_LEN);
    let next = if claimed.messages.is_empty() {
        outbox.claim(&crashing).await.expect("claim").messages
    } else {
        claimed.messages
    };
    assert_eq!(ids(&next), vec![sent[1]], "the aggregate goes on");
}

/// In ordered mode a dead letter whose aggregate already published a later event is not
/// requeued (it would go out after that event): `Error::RequeueOutOfOrder` names it and nothing
/// is requeued; a dead letter whose successors are still pending is requeued.
pub async fn a_requeue_that_would_publish_out_of_order_is_refused<B: OutboxBackend>(
    backend: B,
    _caps: Capabilities,
) {
    let outbox = backend.outbox(&suite_config(Ordering::Ordered)).await;
    let sent = commit(
        &backend,
        &outbox,
        &[event("a", 1), event("a", 2), event("b", 1), event("b", 2)],
    )
    .await;
    let (a1, a2, b1) = (sent[0], sent[1], sent[2]);
    let first = request(Ordering::Ordered, LEASE);
    let heads = outbox.claim(&first).await.expect("claim").messages;
    let mut want = vec![a1, b1];
    want.sort_unstable();
    assert_eq!(ids(&heads), want);
    let poison = |id| Failure {
        id,
        error: "poison".to_owned(),
        retry_in: Duration::ZERO,
        dead_letter: true,
        transient: false,
    };
    let marked = outbox
        .mark_failed(first.token, &[poison(a1), poison(b1)])
        .await;
    assert_eq!(marked.expect("mark"), 2);
    // Their successors come up; a#2 is published, b#2 stays pending.
    let second = request(Ordering::Ordered, LEASE);
    assert_eq!(
        outbox.claim(&second).await.expect("claim").messages.len(),
        2
    );
    let published = outbox.mark_published(second.token, &[a2]).await;
    assert_eq!(published.expect("mark"), 1);

    match outbox.requeue(&[a1, b1]).await {
        Err(crate::Error::RequeueOutOfOrder { ids }) => assert_eq!(ids, vec![a1]),
        other => panic!("a#1 would go out after a#2: {other:?}"),
    }
    let letters = outbox.dead_letters(10).await.expect("dead letters");
    assert_eq!(letters.len(), 2, "nothing was requeued");
    assert_eq!(outbox.requeue(&[b1]).await.expect("requeue"), 1);
}

/// A transient failure (the broker unavailable, a publish timed out) gives back the attempt
/// its claim counted: a row failing that way more than `max-attempts` times is neither
/// dead-lettered by the claim nor by its failure, and its attempts stay where they were.
pub async fn transient_failures_give_back_their_attempt<B: OutboxBackend>(
    backend: B,
    _caps: Capabilities,
) {
    let outbox = backend.outbox(&suite_config(Ordering::Ordered)).await;
    let sent = commit(&backend, &outbox, &[event("a", 1)]).await;
    let mut claim = request(Ordering::Ordered, LEASE);
    claim.max_attempts = 2;
    for round in 1..=5 {
        claim.token = Uuid::now_v7();
        let claimed = outbox.claim(&claim).await.expect("claim");
        assert!(claimed.dead_lettered.is_empty(), "round {round}");
        assert_eq!(ids(&claimed.messages), vec![sent[0]], "round {round}");
        assert_eq!(
            claimed.messages[0].attempts, 1,
            "round {round}: not counted"
        );
        let failure = Failure {
            id: sent[0],
            error: "broker unavailable".to_owned(),
            retry_in: Duration::ZERO,
            dead_letter: false,
            transient: true,
        };
        let marked = outbox.mark_failed(claim.token, &[failure]).await;
        assert_eq!(marked.expect("mark"), 1);
    }
    let stats = outbox.stats().await.expect("stats");
    assert_eq!((stats.pending, stats.dead_lettered), (1, 0));
}

/// A failure whose text holds a NUL character (a broker's or publisher's text echoing a
/// payload) given to the store as it is is recorded with the batch's other failures: PostgreSQL,
/// whose text refuses NUL, stores U+FFFD in its place, SQLite's `substr` keeps the text up to
/// it. (The relay replaces NUL before it marks: `a_poison_message_is_dead_lettered_without_
/// holding_other_aggregates`.) Before: on PostgreSQL the whole batch's mark failed, no failure
/// of it was recorded, and its rows came back only after their lease, one per claim, until
/// dead-lettered as never completed.
pub async fn an_error_text_with_a_nul_character_is_recorded<B: OutboxBackend>(
    backend: B,
    _caps: Capabilities,
) {
    let outbox = backend.outbox(&suite_config(Ordering::Unordered)).await;
    let sent = commit(&backend, &outbox, &[event("a", 1), event("b", 1)]).await;
    let claim = request(Ordering::Unordered, LEASE);
    assert_eq!(outbox.claim(&claim).await.expect("claim").messages.len(), 2);
    let failures = [
        Failure {
            id: sent[0],
            error: "refused: \0 in \"a\0b\"".to_owned(),
            retry_in: Duration::ZERO,
            dead_letter: true,
            transient: false,
        },
        Failure {
            id: sent[1],
            error: "broker away".to_owned(),
            retry_in: Duration::from_secs(60),
            dead_letter: false,
            transient: true,
        },
    ];
    let marked = outbox.mark_failed(claim.token, &failures).await;
    assert_eq!(marked.expect("mark"), 2);
    let letters = outbox.dead_letters(10).await.expect("dead letters");
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].message.id, sent[0]);
    let stored = letters[0].last_error.clone().unwrap_or_default();
    assert!(stored.starts_with("refused: "), "{stored:?}");
    let stats = outbox.stats().await.expect("stats");
    assert_eq!((stats.pending, stats.dead_lettered), (1, 1));
}

/// The rows of a batch whose relay died before marking them (their lease ended with the
/// claim's token still on them) come back one per claim: a message that crashes its relay every
/// time costs only its own attempts, and the healthy rows claimed with it are published, not
/// dead-lettered with it.
pub async fn rows_a_dead_relay_left_unmarked_come_back_one_per_claim<B: OutboxBackend>(
    backend: B,
    _caps: Capabilities,
) {
    let outbox = backend.outbox(&suite_config(Ordering::Unordered)).await;
    let sent = commit(
        &backend,
        &outbox,
        &[event("x", 1), event("a", 1), event("b", 1)],
    )
    .await;
    let crasher = sent[0];
    let claim = || {
        let mut request = request(Ordering::Unordered, Duration::from_millis(100));
        request.max_attempts = 3;
        request
    };
    let first = outbox.claim(&claim()).await.expect("claim");
    assert_eq!(
        first.messages.len(),
        3,
        "one batch; the relay dies before marking it"
    );
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let request = claim();
        let claimed = outbox.claim(&request).await.expect("claim");
        assert!(
            claimed.messages.len() <= 1,
            "rows left unmarked by a dead relay come back one at a time: {:?}",
            ids(&claimed.messages)
        );
        for message in &claimed.messages {
            if message.id != crasher {
                outbox
                    .mark_published(request.token, &[message.id])
                    .await
                    .expect("mark");
            } // the crasher kills its relay again: never marked
        }
        let stats = outbox.stats().await.expect("stats");
        if stats.pending == 0 {
            break;
        }
    }
    let letters = outbox.dead_letters(10).await.expect("dead letters");
    let dead: Vec<_> = letters.iter().map(|l| l.message.id).collect();
    assert_eq!(
        dead,
        vec![crasher],
        "only the crashing message is dead-lettered"
    );
    let stats = outbox.stats().await.expect("stats");
    assert_eq!((stats.pending, stats.dead_lettered), (0, 1));
}
