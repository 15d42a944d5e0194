//! The relay on top of the store: delivery, order, poison messages, crashes.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use super::support::{CollectingPublisher, WAIT, commit, event, request, suite_config};
use super::{Capabilities, OutboxBackend};
use crate::config::Ordering;
use crate::relay::Relay;
use crate::store::{DeadLetters, Enqueue, Housekeeping, RelayStore};

/// Every committed event is published once, with its id; a rolled-back one never; each
/// aggregate's events in sequence order, with two workers.
pub async fn the_relay_publishes_committed_events_once_in_aggregate_order<B: OutboxBackend>(
    backend: B,
    _caps: Capabilities,
) {
    let mut config = suite_config(Ordering::Ordered);
    config.relay.workers = 2;
    let outbox = backend.outbox(&config).await;
    let publisher = CollectingPublisher::default();
    let relay = Relay::new(outbox.clone(), publisher.clone(), &config).expect("relay");
    let handle = relay.spawn();

    let mut tx = backend.begin().await;
    let rolled_back = outbox
        .enqueue_all(&mut tx, &[event("a", 0)])
        .await
        .expect("enqueue");
    B::rollback(tx).await;
    let mut sent = HashSet::new();
    for round in 1..=10 {
        let events: Vec<_> = ["a", "b", "c"].iter().map(|a| event(a, round)).collect();
        sent.extend(commit(&backend, &outbox, &events).await);
    }
    let published = publisher.wait_for(sent.len()).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let published = publisher.published().len().max(published.len());
    let report = handle.shutdown().await;
    let messages = publisher.published();
    assert_eq!(published, sent.len(), "no message published twice");
    let got: HashSet<_> = messages.iter().map(|m| m.id).collect();
    assert_eq!(got, sent);
    assert!(!got.contains(&rolled_back[0]));
    let mut last: HashMap<&str, i64> = HashMap::new();
    for message in &messages {
        let sequence = message.sequence.expect("ordered events are numbered");
        let previous = last.insert(message.aggregate_id.as_str(), sequence);
        assert!(
            previous.is_none_or(|p| p < sequence),
            "{} published out of order",
            message.aggregate_id
        );
    }
    assert!(report.graceful, "{report:?}");
    assert_eq!(report.totals.published, 30);
    assert_eq!(outbox.stats().await.expect("stats").pending, 0);
}

/// A message the broker keeps refusing is dead-lettered after `max-attempts`, without holding
/// up other aggregates; its own aggregate goes on once it is out of the way.
pub async fn a_poison_message_is_dead_lettered_without_holding_other_aggregates<
    B: OutboxBackend,
>(
    backend: B,
    _caps: Capabilities,
) {
    let mut config = suite_config(Ordering::Ordered);
    config.relay.max_attempts = 3;
    let outbox = backend.outbox(&config).await;
    let publisher = CollectingPublisher::default();
    let poison = event("p", 1);
    publisher.refuse(poison.id());
    commit(&backend, &outbox, &[poison.clone(), event("q", 1)]).await;
    let later = commit(&backend, &outbox, &[event("p", 2), event("q", 2)]).await;
    let handle = Relay::new(outbox.clone(), publisher.clone(), &config)
        .expect("relay")
        .spawn();
    let published = publisher.wait_for(3).await;
    let deadline = tokio::time::Instant::now() + WAIT;
    let letters = loop {
        let letters = outbox.dead_letters(10).await.expect("dead letters");
        if !letters.is_empty() || tokio::time::Instant::now() > deadline {
            break letters;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    handle.shutdown().await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].message.id, poison.id());
    assert_eq!(letters[0].message.attempts, 3);
    // The refusal's text holds a NUL: recorded with U+FFFD on every store (before: the mark
    // failed on PostgreSQL, and SQLite's `substr` cut the text at the NUL).
    let error = letters[0].last_error.clone().unwrap_or_default();
    assert!(error.contains("refused \u{fffd} by the test"), "{error:?}");
    let ids: HashSet<_> = published.iter().map(|m| m.id).collect();
    assert!(ids.contains(&later[0]), "p#2 follows once p#1 is dead");
    assert!(ids.contains(&later[1]));
    assert!(!ids.contains(&poison.id()));
}

/// A relay that claimed rows and died before marking them (the lease is the only trace) loses
/// nothing: after the lease another relay publishes them, one attempt more.
pub async fn a_relay_that_dies_before_marking_republishes_after_the_lease<B: OutboxBackend>(
    backend: B,
    _caps: Capabilities,
) {
    let config = suite_config(Ordering::Unordered);
    let outbox = backend.outbox(&config).await;
    let sent = commit(&backend, &outbox, &[event("a", 1), event("b", 1)]).await;
    let dead_relay = request(Ordering::Unordered, Duration::from_millis(400));
    assert_eq!(
        outbox
            .claim(&dead_relay)
            .await
            .expect("claim")
            .messages
            .len(),
        2
    );
    let publisher = CollectingPublisher::default();
    let handle = Relay::new(outbox.clone(), publisher.clone(), &config)
        .expect("relay")
        .spawn();
    let published = publisher.wait_for(2).await;
    handle.shutdown().await;
    let mut ids: Vec<_> = published.iter().map(|m| m.id).collect();
    ids.sort_unstable();
    let mut sent = sent;
    sent.sort_unstable();
    assert_eq!(ids, sent);
    assert!(published.iter().all(|m| m.attempts == 2));
}

/// With a backlog, every batch is full: each worker claims and publishes its next batch while
/// the previous one is still publishing or being marked. Aggregate order still holds, nothing is published twice,
/// a message failing mid-batch holds back only its own aggregate until it is dead-lettered,
/// and a shutdown leaves no row unmarked.
pub async fn full_batches_overlap_their_marks_and_keep_aggregate_order<B: OutboxBackend>(
    backend: B,
    _caps: Capabilities,
) {
    let mut config = suite_config(Ordering::Ordered);
    config.relay.workers = 2;
    config.relay.batch_size = 4;
    config.relay.max_attempts = 3;
    let outbox = backend.outbox(&config).await;
    let publisher = CollectingPublisher::default();
    let aggregates = ["a", "b", "c", "d", "e", "f", "g", "h"];
    let mut sent = HashSet::new();
    let mut poison = None;
    for round in 1..=6 {
        let events: Vec<_> = aggregates.iter().map(|a| event(a, round)).collect();
        if round == 2 {
            publisher.refuse(events[0].id());
            poison = Some(events[0].id());
        }
        sent.extend(commit(&backend, &outbox, &events).await);
    }
    let poison = poison.expect("a poison message");
    sent.remove(&poison);
    let handle = Relay::new(outbox.clone(), publisher.clone(), &config)
        .expect("relay")
        .spawn();
    publisher.wait_for(sent.len()).await;
    let report = handle.shutdown().await;
    let messages = publisher.published();
    assert_eq!(messages.len(), sent.len(), "no message published twice");
    let got: HashSet<_> = messages.iter().map(|m| m.id).collect();
    assert_eq!(got, sent);
    let mut last: HashMap<&str, i64> = HashMap::new();
    for message in &messages {
        let sequence = message.sequence.expect("ordered events are numbered");
        let previous = last.insert(message.aggregate_id.as_str(), sequence);
        assert!(
            previous.is_none_or(|p| p < sequence),
            "{} published out of order",
            message.aggregate_id
        );
    }
    assert!(report.graceful, "{report:?}");
    assert_eq!(report.totals.published, sent.len() as u64);
    assert_eq!(report.totals.dead_lettered, 1);
    let stats = outbox.stats().await.expect("stats");
    assert_eq!(stats.pending, 0, "every claimed row was marked: {stats:?}");
    assert_eq!(stats.dead_lettered, 1);
    let letters = outbox.dead_letters(10).await.expect("dead letters");
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].message.id, poison);
}
