//! The outbox SPI on SQLite, call by call: enqueue (validation, atomicity, sequences), claims
//! (ordered and unordered, leases, fencing tokens), stats, and how rows are stored.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

mod outbox_common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idempotency_outbox::config::Ordering;
use idempotency_outbox::store::{
    ClaimRequest, Enqueue, Failure, Housekeeping, RelayStore,
};
use idempotency_outbox::{Error, NewEvent, Relay};
use outbox_common::*;
use uuid::Uuid;

fn request(ordering: Ordering, lease: Duration) -> ClaimRequest {
    ClaimRequest {
        limit: 100,
        lease,
        token: Uuid::now_v7(),
        ordering,
        max_attempts: 10,
    }
}

#[tokio::test]
async fn ordered_claims_take_the_first_pending_row_of_each_aggregate() {
    let (_, outbox) = fresh(&config(Ordering::Ordered)).await;
    commit(&outbox, &[event("a", 1), event("a", 2), event("b", 1)]).await;
    commit(&outbox, &[event("a", 3)]).await;
    let ordered = request(Ordering::Ordered, Duration::from_secs(30));
    let batch = outbox.claim(&ordered).await.unwrap().messages;
    let got: Vec<_> = batch
        .iter()
        .map(|m| (m.aggregate_id.as_str(), m.sequence))
        .collect();
    assert_eq!(got, [("a", Some(1)), ("b", Some(1))]);
    // While a's first row is leased, a's later rows wait.
    assert!(outbox.claim(&ordered).await.unwrap().messages.is_empty());
    let ids: Vec<_> = batch.iter().map(|m| m.id).collect();
    assert_eq!(outbox.mark_published(ordered.token, &ids).await.unwrap(), 2);
    let next = outbox.claim(&ordered).await.unwrap().messages;
    assert_eq!(next.len(), 1);
    assert_eq!(
        (next[0].aggregate_id.as_str(), next[0].sequence),
        ("a", Some(2))
    );
    // An unordered claim ignores the order rule.
    let unordered = outbox
        .claim(&request(Ordering::Unordered, Duration::from_secs(30)))
        .await
        .unwrap()
        .messages;
    assert_eq!(
        unordered.len(),
        1,
        "only a#3 is neither leased nor published"
    );
    assert_eq!(unordered[0].sequence, Some(3));
}

#[tokio::test]
async fn unordered_enqueue_has_no_sequence_and_claims_every_due_row() {
    let (_, outbox) = fresh(&config(Ordering::Unordered)).await;
    assert_eq!(outbox.ordering(), Ordering::Unordered);
    commit(&outbox, &[event("a", 1), event("a", 2), event("a", 3)]).await;
    let batch = outbox
        .claim(&request(Ordering::Unordered, Duration::from_secs(30)))
        .await
        .unwrap()
        .messages;
    assert_eq!(batch.len(), 3);
    assert!(
        batch
            .iter()
            .all(|m| m.sequence.is_none() && m.attempts == 1)
    );
    let payloads: Vec<_> = batch.iter().map(|m| m.payload.clone()).collect();
    assert_eq!(payloads[0], r#"{"aggregate":"a","n":1}"#, "oldest first");
    assert_eq!(outbox.ordering(), Ordering::Unordered);
    assert_eq!(
        scalar(outbox.pool(), "SELECT count(*) FROM outbox_sequences").await,
        0
    );
}

#[tokio::test]
async fn a_stale_token_cannot_mark_rows_another_claim_took_over() {
    let (_, outbox) = fresh(&config(Ordering::Ordered)).await;
    let ids = commit(&outbox, &[event("a", 1)]).await;
    let first = request(Ordering::Ordered, Duration::from_millis(50));
    assert_eq!(outbox.claim(&first).await.unwrap().messages.len(), 1);
    // The first worker stalls past its lease; a second claim takes the row over.
    tokio::time::sleep(Duration::from_millis(80)).await;
    let second = request(Ordering::Ordered, Duration::from_secs(30));
    let taken = outbox.claim(&second).await.unwrap().messages;
    assert_eq!(taken.len(), 1);
    assert_eq!(taken[0].attempts, 2, "each claim counts an attempt");
    let failure = Failure {
        id: ids[0],
        error: "late".into(),
        retry_in: Duration::ZERO,
        dead_letter: true,
    };
    assert_eq!(
        outbox.mark_failed(first.token, &[failure]).await.unwrap(),
        0
    );
    assert_eq!(outbox.mark_published(first.token, &ids).await.unwrap(), 0);
    assert_eq!(outbox.mark_published(second.token, &ids).await.unwrap(), 1);
    assert_eq!(
        outbox.mark_published(second.token, &ids).await.unwrap(),
        0,
        "token cleared"
    );
    assert_eq!(published(outbox.pool()).await, 1);
    assert_eq!(outbox.stats().await.unwrap().dead_lettered, 0);
}

#[tokio::test]
async fn stats_count_pending_and_dead_rows_and_age_the_oldest() {
    let (_, outbox) = fresh(&config(Ordering::Unordered)).await;
    let empty = outbox.stats().await.unwrap();
    assert_eq!(
        (empty.pending, empty.oldest_pending_age, empty.dead_lettered),
        (0, 0.0, 0)
    );
    let ids = commit(&outbox, &[event("a", 1), event("b", 1), event("c", 1)]).await;
    let claim = request(Ordering::Unordered, Duration::from_secs(30));
    outbox.claim(&claim).await.unwrap();
    let dead = Failure {
        id: ids[0],
        error: "x".repeat(5000),
        retry_in: Duration::from_secs(1),
        dead_letter: true,
    };
    assert_eq!(outbox.mark_failed(claim.token, &[dead]).await.unwrap(), 1);
    tokio::time::sleep(Duration::from_millis(30)).await;
    let stats = outbox.stats().await.unwrap();
    assert_eq!((stats.pending, stats.dead_lettered), (2, 1));
    assert!(
        stats.oldest_pending_age >= 0.03 && stats.oldest_pending_age < 30.0,
        "{stats:?}"
    );
    let stored = scalar(
        outbox.pool(),
        "SELECT length(last_error) FROM outbox WHERE last_error IS NOT NULL",
    )
    .await;
    assert_eq!(stored, 1000, "last_error is bounded");
}

#[tokio::test]
async fn an_invalid_event_writes_nothing_and_the_transaction_goes_on() {
    let (_, outbox) = fresh(&config(Ordering::Ordered)).await;
    let mut tx = outbox.pool().begin_with("BEGIN IMMEDIATE").await.unwrap();
    let good = event("a", 1);
    for bad in [
        NewEvent::from_json_text("order", "a", "Bad", "{not json"),
        event("a", 2).header("bad:name", "x"),
        NewEvent::new("order", "", "Bad", &1).unwrap(),
    ] {
        let error = outbox
            .enqueue_all(&mut tx, &[good.clone(), bad])
            .await
            .unwrap_err();
        assert!(matches!(error, Error::InvalidEvent { .. }), "{error:?}");
    }
    // A duplicate id passes validation and fails in SQL, after the counters moved: the
    // savepoint undoes them.
    outbox.enqueue(&mut tx, &good).await.unwrap();
    let duplicate = event("a", 3).with_id(good.id());
    let error = outbox
        .enqueue_all(&mut tx, &[event("a", 4), duplicate])
        .await
        .unwrap_err();
    assert!(matches!(error, Error::Database(_)), "{error:?}");
    let next = Enqueue::enqueue_all(&outbox, &mut tx, &[event("a", 5)])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let rows: Vec<(String, i64)> =
        sqlx::query_as("SELECT id, sequence FROM outbox ORDER BY sequence")
            .fetch_all(outbox.pool())
            .await
            .unwrap();
    assert_eq!(rows, [(good.id().to_string(), 1), (next[0].to_string(), 2)]);
}

#[tokio::test]
async fn rows_store_times_as_database_milliseconds_and_ids_as_text() {
    let (_, outbox) = fresh(&config(Ordering::Ordered)).await;
    let before = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let ids = commit(&outbox, &[event("a", 1)]).await;
    let after = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let (id, kinds, created, due): (String, String, i64, i64) = sqlx::query_as(
        "SELECT id, typeof(created_at) || ',' || typeof(next_attempt_at) || ',' || typeof(sequence), \
                created_at, next_attempt_at FROM outbox",
    )
    .fetch_one(outbox.pool())
    .await
    .unwrap();
    assert_eq!(id, ids[0].to_string());
    assert_eq!(kinds, "integer,integer,integer");
    assert!(
        created >= before - 5 && created <= after + 5,
        "{before} <= {created} <= {after}"
    );
    assert_eq!(due, created, "due at once");
    let claimed = outbox
        .claim(&request(Ordering::Ordered, Duration::from_secs(30)))
        .await
        .unwrap()
        .messages;
    assert_eq!(claimed[0].created_at.timestamp_millis(), created);
    let lease_end = scalar(outbox.pool(), "SELECT next_attempt_at FROM outbox").await;
    assert!(
        lease_end >= created + 30_000,
        "the lease is on the database clock"
    );
}

#[tokio::test]
async fn sqlite_has_no_notifications_and_enqueue_of_nothing_is_a_no_op() {
    let (_, outbox) = fresh(&config(Ordering::Ordered)).await;
    assert!(outbox.listen().await.unwrap().is_none());
    let mut tx = outbox.pool().begin_with("BEGIN IMMEDIATE").await.unwrap();
    assert!(outbox.enqueue_all(&mut tx, &[]).await.unwrap().is_empty());
    tx.commit().await.unwrap();
    assert_eq!(pending(outbox.pool()).await, 0);
}

#[tokio::test]
async fn a_connection_outside_a_transaction_is_refused_and_nothing_is_written() {
    for ordering in [Ordering::Ordered, Ordering::Unordered] {
        let (_, outbox) = fresh(&config(ordering)).await;
        let mut conn = outbox.pool().acquire().await.unwrap();
        for error in [
            outbox
                .enqueue(&mut conn, &event("solo", 1))
                .await
                .unwrap_err(),
            Enqueue::enqueue_all(&outbox, &mut conn, &[event("solo", 2)])
                .await
                .unwrap_err(),
        ] {
            assert!(matches!(error, Error::NotInTransaction { .. }), "{error:?}");
            assert!(!error.is_retryable());
        }
        assert_eq!(
            scalar(outbox.pool(), "SELECT count(*) FROM outbox").await,
            0
        );
        assert_eq!(
            scalar(outbox.pool(), "SELECT count(*) FROM outbox_sequences").await,
            0
        );
        // The same connection in a transaction works as before.
        let mut tx = sqlx::Connection::begin(&mut *conn).await.unwrap();
        outbox.enqueue(&mut tx, &event("solo", 3)).await.unwrap();
        tx.commit().await.unwrap();
        assert_eq!(pending(outbox.pool()).await, 1);
    }
}

#[tokio::test]
async fn payload_and_headers_reach_the_publisher_byte_for_byte() {
    let config = config(Ordering::Ordered);
    let (_, outbox) = fresh(&config).await;
    let payload = r#"{"b":1,"a":"x\u0000y","n":1e2}"#;
    let sent = NewEvent::from_json_text("order", "nul", "Odd", payload)
        .header("trace", "a\0b")
        .header("x-order", "z");
    commit(&outbox, std::slice::from_ref(&sent)).await;
    let recorder = Recorder::default();
    let relay = Relay::new(outbox.clone(), recorder.clone(), &config).unwrap();
    relay.run_batch().await.unwrap();
    let got = recorder.published();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].id, sent.id());
    assert_eq!(got[0].payload.as_bytes(), payload.as_bytes());
    assert_eq!(&got[0].headers, sent.headers());
    assert_eq!(published(outbox.pool()).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_poll_does_not_wait_for_the_write_lock_but_a_claim_does() {
    let (_, outbox) = fresh(&config(Ordering::Ordered)).await;
    let claim = request(Ordering::Ordered, Duration::from_secs(30));
    // A request transaction holds the write lock; its event is not committed yet. Were the
    // poll to take the lock, it would wait the whole busy timeout (10 s).
    let mut writer = outbox.pool().begin_with("BEGIN IMMEDIATE").await.unwrap();
    let id = outbox.enqueue(&mut writer, &event("a", 1)).await.unwrap();
    let idle = tokio::time::timeout(Duration::from_secs(2), outbox.claim(&claim)).await;
    assert!(
        idle.expect("an idle poll returns at once")
            .unwrap()
            .messages
            .is_empty()
    );
    writer.commit().await.unwrap();

    // Now a row is due: the claim waits for the write lock another request holds.
    let holder = outbox.pool().begin_with("BEGIN IMMEDIATE").await.unwrap();
    let waiting = tokio::spawn({
        let outbox = outbox.clone();
        async move { outbox.claim(&claim).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !waiting.is_finished(),
        "a due row is claimed under the write lock"
    );
    holder.commit().await.unwrap();
    let claimed = waiting.await.unwrap().unwrap().messages;
    assert_eq!(claimed.iter().map(|m| m.id).collect::<Vec<_>>(), [id]);
}
