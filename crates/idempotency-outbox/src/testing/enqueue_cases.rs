//! Enqueue: the caller's transaction, sequences, validation.

use std::sync::Arc;
use std::time::Duration;

use super::support::{commit, event, request, suite_config};
use super::{Capabilities, OutboxBackend};
use crate::config::Ordering;
use crate::error::Error;
use crate::message::NewEvent;
use crate::store::{Enqueue, Housekeeping, Inbox, RelayStore};

const LEASE: Duration = Duration::from_secs(30);

/// Events enqueued in a transaction that rolls back are gone with it; committed ones are
/// claimable with the ids `enqueue_all` returned.
pub async fn enqueue_commits_and_rolls_back_with_the_callers_transaction<B: OutboxBackend>(
    backend: B,
    _caps: Capabilities,
) {
    let outbox = backend.outbox(&suite_config(Ordering::Unordered)).await;
    let mut tx = backend.begin().await;
    let rolled_back = outbox
        .enqueue_all(&mut tx, &[event("a", 1)])
        .await
        .expect("enqueue");
    B::rollback(tx).await;
    let mut kept = commit(&backend, &outbox, &[event("b", 1), event("b", 2)]).await;
    let claimed = outbox
        .claim(&request(Ordering::Unordered, LEASE))
        .await
        .expect("claim")
        .messages;
    let mut ids: Vec<_> = claimed.iter().map(|m| m.id).collect();
    ids.sort_unstable();
    kept.sort_unstable();
    assert_eq!(ids, kept, "exactly the committed events, with their ids");
    assert!(!ids.contains(&rolled_back[0]));
    assert!(
        claimed.iter().all(|m| m.attempts == 1),
        "a claim is an attempt"
    );
}

/// The payload and headers reach the publisher exactly as enqueued: key order, number spelling
/// and `\u0000` escapes of the JSON text, header names and values.
pub async fn payloads_and_headers_round_trip_byte_for_byte<B: OutboxBackend>(
    backend: B,
    _caps: Capabilities,
) {
    let outbox = backend.outbox(&suite_config(Ordering::Unordered)).await;
    let payload = r#"{"b":1,"a":"x\u0000y","n":1e2,"z":[1.50,-0.0],"q":"\"é\""}"#;
    let sent = NewEvent::from_json_text("order", "o-1", "OrderPlaced", payload)
        .header(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        )
        .header("x-quote", "\"quoted\" é ü");
    commit(&backend, &outbox, std::slice::from_ref(&sent)).await;
    let claimed = outbox
        .claim(&request(Ordering::Unordered, LEASE))
        .await
        .expect("claim")
        .messages;
    assert_eq!(claimed.len(), 1);
    let got = &claimed[0];
    assert_eq!(got.id, sent.id());
    assert_eq!(got.payload, payload, "payload bytes");
    assert_eq!(&got.headers, sent.headers());
    assert_eq!(
        (
            got.aggregate_type.as_str(),
            got.aggregate_id.as_str(),
            got.event_type.as_str()
        ),
        ("order", "o-1", "OrderPlaced")
    );
}

/// In `ordered` mode each aggregate's events are numbered 1, 2, 3... in commit order, across
/// transactions; other aggregates count on their own.
pub async fn ordered_events_are_numbered_per_aggregate_in_commit_order<B: OutboxBackend>(
    backend: B,
    _caps: Capabilities,
) {
    let outbox = backend.outbox(&suite_config(Ordering::Ordered)).await;
    let first = commit(
        &backend,
        &outbox,
        &[event("a", 1), event("a", 2), event("b", 1)],
    )
    .await;
    let second = commit(&backend, &outbox, &[event("a", 3), event("b", 2)]).await;
    let mut claimed = outbox
        .claim(&request(Ordering::Unordered, LEASE))
        .await
        .expect("claim")
        .messages;
    claimed.sort_by_key(|m| (m.aggregate_id.clone(), m.sequence));
    let numbered: Vec<_> = claimed
        .iter()
        .map(|m| (m.aggregate_id.as_str(), m.sequence, m.id))
        .collect();
    assert_eq!(
        numbered,
        [
            ("a", Some(1), first[0]),
            ("a", Some(2), first[1]),
            ("a", Some(3), second[0]),
            ("b", Some(1), first[2]),
            ("b", Some(2), second[1]),
        ]
    );
}

/// In `unordered` mode events carry no sequence.
pub async fn unordered_events_have_no_sequence<B: OutboxBackend>(backend: B, _caps: Capabilities) {
    let outbox = backend.outbox(&suite_config(Ordering::Unordered)).await;
    commit(&backend, &outbox, &[event("a", 1), event("a", 2)]).await;
    let claimed = outbox
        .claim(&request(Ordering::Unordered, LEASE))
        .await
        .expect("claim")
        .messages;
    assert_eq!(claimed.len(), 2);
    assert!(claimed.iter().all(|m| m.sequence.is_none()));
}

/// An invalid event (payload that is not JSON, a bad header name, an empty name) is refused
/// before anything is written, with `Error::InvalidEvent`; the transaction goes on, and the
/// sequence has no gap.
pub async fn invalid_events_are_refused_before_writing<B: OutboxBackend>(
    backend: B,
    _caps: Capabilities,
) {
    let outbox = backend.outbox(&suite_config(Ordering::Ordered)).await;
    let mut tx = backend.begin().await;
    for bad in [
        NewEvent::from_json_text("order", "a", "Bad", "{not json"),
        event("a", 2).header("bad:name", "x"),
        event("a", 3).header("x-break", "line\nbreak"),
        NewEvent::from_json_text("order", "", "Bad", "1"),
        NewEvent::from_json_text("order", "a", "x".repeat(1000), "1"),
    ] {
        let error = outbox
            .enqueue_all(&mut tx, &[event("a", 1), bad])
            .await
            .expect_err("an invalid event is refused");
        assert!(matches!(error, Error::InvalidEvent { .. }), "{error:?}");
    }
    let ids = outbox
        .enqueue_all(&mut tx, &[event("a", 4), event("a", 5)])
        .await
        .expect("valid events after refused ones");
    B::commit(tx).await;
    let mut claimed = outbox
        .claim(&request(Ordering::Unordered, LEASE))
        .await
        .expect("claim")
        .messages;
    claimed.sort_by_key(|m| m.sequence);
    let got: Vec<_> = claimed.iter().map(|m| (m.id, m.sequence)).collect();
    assert_eq!(got, [(ids[0], Some(1)), (ids[1], Some(2))]);
}

/// A payload nested deeper than [`MAX_JSON_DEPTH`](idempotency_core::MAX_JSON_DEPTH) is
/// `Error::InvalidEvent` on every backend, before anything is written (not a database error:
/// MariaDB's `json_valid` refuses 32 levels, the others would store it); the transaction goes
/// on and the deepest allowed payload is stored and claimed byte for byte.
pub async fn payloads_nested_deeper_than_the_limit_are_invalid_events<B: OutboxBackend>(
    backend: B,
    _caps: Capabilities,
) {
    let depth = idempotency_core::MAX_JSON_DEPTH;
    let nested = |depth: usize| {
        format!(
            r#"{}{{"k":"[["}}{}"#,
            "[".repeat(depth - 1),
            "]".repeat(depth - 1)
        )
    };
    let outbox = backend.outbox(&suite_config(Ordering::Ordered)).await;
    let mut tx = backend.begin().await;
    for too_deep in [
        NewEvent::from_json_text("order", "a", "Deep", nested(depth + 1)),
        NewEvent::new(
            "order",
            "a",
            "Deep",
            &(0..depth + 1).fold(serde_json::json!(1), |inner, _| serde_json::json!([inner])),
        )
        .expect("serializable"),
        NewEvent::from_json_text("order", "a", "Deep", nested(500)),
    ] {
        let error = outbox
            .enqueue_all(&mut tx, &[event("a", 1), too_deep])
            .await
            .expect_err("a payload nested too deep is refused");
        assert!(
            matches!(&error, Error::InvalidEvent { reason } if reason.contains("levels deep")),
            "{error:?}"
        );
    }
    let deepest = NewEvent::from_json_text("order", "a", "Deepest", nested(depth));
    let ids = outbox
        .enqueue_all(&mut tx, std::slice::from_ref(&deepest))
        .await
        .expect("the deepest payload allowed");
    B::commit(tx).await;
    let claimed = outbox
        .claim(&request(Ordering::Unordered, LEASE))
        .await
        .expect("claim")
        .messages;
    let got: Vec<_> = claimed
        .iter()
        .map(|m| (m.id, m.sequence, m.payload.as_str()))
        .collect();
    assert_eq!(
        got,
        [(ids[0], Some(1), deepest.payload())],
        "nothing else enqueued"
    );
}

/// Enqueueing no events writes nothing and returns no ids.
pub async fn enqueue_of_nothing_is_a_no_op<B: OutboxBackend>(backend: B, _caps: Capabilities) {
    let outbox = backend.outbox(&suite_config(Ordering::Ordered)).await;
    let ids = commit(&backend, &outbox, &[]).await;
    assert!(ids.is_empty());
    let claimed = outbox
        .claim(&request(Ordering::Unordered, LEASE))
        .await
        .expect("claim")
        .messages;
    assert!(claimed.is_empty());
}

/// Two transactions writing one aggregate are serialized, so sequence order is commit order:
/// with concurrent writers the second waits inside `enqueue` until the first commits, then
/// numbers after it.
pub async fn a_second_writer_of_an_aggregate_numbers_after_the_first<B: OutboxBackend>(
    backend: B,
    caps: Capabilities,
) {
    let backend = Arc::new(backend);
    let outbox = backend.outbox(&suite_config(Ordering::Ordered)).await;
    let first = event("a", 1);
    let second = event("a", 2);
    if caps.concurrent_writers {
        let mut tx = backend.begin().await;
        outbox
            .enqueue_all(&mut tx, std::slice::from_ref(&first))
            .await
            .expect("first writer");
        let writer = tokio::spawn({
            let (backend, outbox, second) = (Arc::clone(&backend), outbox.clone(), second.clone());
            async move {
                let mut tx = backend.begin().await;
                outbox
                    .enqueue_all(&mut tx, &[second])
                    .await
                    .expect("second writer");
                B::commit(tx).await;
            }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !writer.is_finished(),
            "the second writer waits for the first"
        );
        B::commit(tx).await;
        writer.await.expect("second writer task");
    } else {
        commit(&*backend, &outbox, std::slice::from_ref(&first)).await;
        commit(&*backend, &outbox, std::slice::from_ref(&second)).await;
    }
    let mut claimed = outbox
        .claim(&request(Ordering::Unordered, LEASE))
        .await
        .expect("claim")
        .messages;
    claimed.sort_by_key(|m| m.sequence);
    let got: Vec<_> = claimed.iter().map(|m| (m.id, m.sequence)).collect();
    assert_eq!(got, [(first.id(), Some(1)), (second.id(), Some(2))]);
}

/// Enqueue and the inbox's `record` refuse a connection outside a transaction
/// (`Error::NotInTransaction`, not retryable) before writing: such a write would commit on its
/// own, whatever the caller's business change does.
pub async fn writes_outside_a_transaction_are_refused<B: OutboxBackend>(
    backend: B,
    _caps: Capabilities,
) {
    let outbox = backend.outbox(&suite_config(Ordering::Ordered)).await;
    let inbox = backend.inbox().await;
    let mut conn = backend.acquire().await;
    for error in [
        outbox
            .enqueue_all(&mut conn, &[event("auto", 1)])
            .await
            .expect_err("enqueue outside a transaction"),
        inbox
            .record(&mut conn, "projector", "m-1")
            .await
            .map(|_| ())
            .expect_err("record outside a transaction"),
    ] {
        assert!(matches!(error, Error::NotInTransaction { .. }), "{error:?}");
        assert!(!error.is_retryable());
    }
    drop(conn);
    assert_eq!(outbox.stats().await.expect("stats").pending, 0);
    let mut tx = backend.begin().await;
    assert!(
        inbox
            .record(&mut tx, "projector", "m-1")
            .await
            .expect("record in a transaction"),
        "nothing was recorded outside the transaction"
    );
    B::commit(tx).await;
}
