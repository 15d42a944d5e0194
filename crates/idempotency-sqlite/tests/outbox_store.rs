//! The outbox SPI on SQLite, call by call: enqueue (validation, atomicity, sequences), claims
//! (ordered and unordered, leases, fencing tokens), stats, and how rows are stored.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

mod outbox_common;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use idempotency_outbox::config::Ordering;
use idempotency_outbox::store::{ClaimRequest, Enqueue, RelayStore};
use idempotency_outbox::{Error, NewEvent};
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

/// One aggregate with `backlog` pending events, its first already claimed (in flight): the
/// shortest of five claims that find nothing to hand out.
async fn claim_behind(backlog: usize) -> Duration {
    let (_, outbox) = fresh(&config(Ordering::Ordered)).await;
    let events: Vec<NewEvent> = (0..backlog).map(|n| event("a", n)).collect();
    for chunk in events.chunks(10_000) {
        commit(&outbox, chunk).await;
    }
    let claim = request(Ordering::Ordered, Duration::from_secs(60));
    let first = outbox.claim(&claim).await.unwrap().messages;
    assert_eq!(first.len(), 1, "only the aggregate's first row");
    let mut shortest = Duration::MAX;
    for _ in 0..5 {
        let started = Instant::now();
        let claimed = outbox.claim(&claim).await.unwrap();
        shortest = shortest.min(started.elapsed());
        assert!(claimed.messages.is_empty(), "the first row is still leased");
    }
    outbox.pool().close().await;
    shortest
}

/// The ordered claim runs under SQLite's single write lock: its cost must not grow with an
/// aggregate's backlog (every due row waiting behind its aggregate's first one), or every poll
/// during a broker outage makes the request transactions wait. A ratio within one run: the
/// machine is shared.
#[tokio::test]
async fn an_ordered_claim_does_not_read_an_aggregates_backlog() {
    let small = claim_behind(1_000).await;
    let large = claim_behind(60_000).await;
    eprintln!("claim behind 1,000 rows: {small:?}; behind 60,000: {large:?}");
    assert!(
        large < small * 4 + Duration::from_millis(5),
        "60,000 rows behind the first: {large:?}; 1,000: {small:?}"
    );
}

/// A row that is first of its aggregate is claimed however many rows of other aggregates,
/// waiting behind theirs, are due before it.
#[tokio::test]
async fn a_first_row_behind_a_long_blocked_backlog_is_claimed() {
    let (_, outbox) = fresh(&config(Ordering::Ordered)).await;
    let events: Vec<NewEvent> = (0..2_000).map(|n| event("a", n)).collect();
    let blocked = commit(&outbox, &events).await;
    let claim = request(Ordering::Ordered, Duration::from_secs(60));
    let first = outbox.claim(&claim).await.unwrap().messages;
    assert_eq!(first.iter().map(|m| m.id).collect::<Vec<_>>(), [blocked[0]]);
    let later = commit(&outbox, &[event("b", 0), event("c", 0), event("c", 1)]).await;
    let claimed = outbox.claim(&claim).await.unwrap().messages;
    assert_eq!(
        claimed.iter().map(|m| m.id).collect::<Vec<_>>(),
        [later[0], later[1]],
        "the first rows of b and c, not a's nor c's second"
    );
}

/// A statement that rolled the caller's transaction back (`INSERT OR ROLLBACK` on a taken key)
/// left the connection in autocommit: an event enqueued then must not commit on its own,
/// without the business change it announces (before: it did, in both orderings), and the
/// connection must go back to the pool in a state sqlx knows.
#[tokio::test]
async fn an_event_after_a_statement_rolled_the_transaction_back_is_not_written() {
    for ordering in [Ordering::Ordered, Ordering::Unordered] {
        let (_, outbox) = fresh(&config(ordering)).await;
        sqlx::raw_sql(
            "CREATE TABLE orders (id INTEGER PRIMARY KEY); INSERT INTO orders VALUES (1)",
        )
        .execute(outbox.pool())
        .await
        .unwrap();
        let mut tx = outbox.pool().begin_with("BEGIN IMMEDIATE").await.unwrap();
        sqlx::query("INSERT INTO orders VALUES (2)")
            .execute(&mut *tx)
            .await
            .unwrap();
        sqlx::query("INSERT OR ROLLBACK INTO orders VALUES (1)")
            .execute(&mut *tx)
            .await
            .unwrap_err();
        let error = outbox.enqueue(&mut tx, &event("a", 1)).await.unwrap_err();
        assert!(
            matches!(error, Error::Database(_)),
            "{ordering:?}: {error:?}"
        );
        tx.rollback().await.unwrap();
        let events: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox")
            .fetch_one(outbox.pool())
            .await
            .unwrap();
        assert_eq!(events, 0, "{ordering:?}: the event committed on its own");
        let mut tx = outbox.pool().begin_with("BEGIN IMMEDIATE").await.unwrap();
        outbox.enqueue(&mut tx, &event("a", 2)).await.unwrap();
        tx.commit().await.unwrap();
    }
}
