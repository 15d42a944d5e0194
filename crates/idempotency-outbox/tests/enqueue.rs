//! Enqueue in the caller's transaction: rollback, commit, NOTIFY at commit only, the
//! per-aggregate counter serializing writers (sequence order = commit order), the
//! idempotency service's transaction, connections outside a transaction, payloads kept byte
//! for byte, and bad input.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use idempotency_core::config::{SchemaConfig, SchemaMode};
use idempotency_outbox::config::{InboxConfig, Ordering};
use idempotency_outbox::{
    Ack, Enqueue, Error, NewEvent, OutboxMessage, PgInbox, PublishError, Publisher, Relay,
};
use idempotency_pg::{Call, ExecutionResult, IdempotencyKey, PgIdempotencyService, PgStore, PgTx};
use sqlx::Connection;
use sqlx::postgres::PgListener;

/// A broker that confirms everything and keeps what the relay handed it.
#[derive(Default)]
struct Recorder(Mutex<Vec<OutboxMessage>>);

impl Publisher for Recorder {
    fn destination(&self) -> &str {
        "recorder"
    }

    async fn publish(&self, message: &OutboxMessage) -> Result<Ack, PublishError> {
        self.0.lock().unwrap().push(message.clone());
        Ok(Ack::default())
    }
}

/// An application error, as a service would define it.
#[derive(Debug, thiserror::Error)]
enum AppError {
    #[error(transparent)]
    Idempotency(#[from] idempotency_core::Error),
    #[error(transparent)]
    Outbox(#[from] Error),
}

async fn sequences(pool: &sqlx::PgPool, aggregate: &str) -> Vec<(uuid::Uuid, i64)> {
    sqlx::query_as("SELECT id, sequence FROM outbox WHERE aggregate_id = $1 ORDER BY sequence")
        .bind(aggregate)
        .fetch_all(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn rollback_removes_events_and_commit_keeps_them_with_notify_at_commit() {
    let config = config(Ordering::Ordered);
    let (pool, outbox) = outbox(&config).await;
    let mut listener = PgListener::connect_with(&pool).await.unwrap();
    listener
        .listen(config.notify_channel.as_deref().unwrap())
        .await
        .unwrap();

    let mut tx = pool.begin().await.unwrap();
    outbox.enqueue(&mut tx, &event("a", 1)).await.unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(scalar_i64(&pool, "SELECT count(*) FROM outbox").await, 0);
    let nothing = tokio::time::timeout(Duration::from_millis(300), listener.recv()).await;
    assert!(
        nothing.is_err(),
        "a rolled-back enqueue notified: {nothing:?}"
    );

    let mut tx = pool.begin().await.unwrap();
    let ids = outbox
        .enqueue_all(&mut tx, &[event("a", 1), event("a", 2), event("b", 1)])
        .await
        .unwrap();
    let early = tokio::time::timeout(Duration::from_millis(300), listener.recv()).await;
    assert!(early.is_err(), "notified before commit");
    tx.commit().await.unwrap();
    let notification = tokio::time::timeout(WAIT, listener.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        notification.channel(),
        config.notify_channel.as_deref().unwrap()
    );
    let seq_a: Vec<i64> = sequences(&pool, "a").await.iter().map(|r| r.1).collect();
    assert_eq!(seq_a, [1, 2]);
    assert_eq!(sequences(&pool, "b").await, [(ids[2], 1)]);
    let pending: (i32, bool) = sqlx::query_as(
        "SELECT attempts, published_at IS NULL AND dead_lettered_at IS NULL FROM outbox LIMIT 1",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(pending, (0, true));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_writer_of_an_aggregate_waits_and_numbers_after_the_first_commit() {
    let config = config(Ordering::Ordered);
    let (pool, outbox) = outbox(&config).await;
    commit(&pool, &outbox, &[event("acc", 0)]).await;

    // T1 enqueues and stays open; T2 (started later) must wait for T1 at its enqueue.
    let mut t1 = pool.begin().await.unwrap();
    let first = event("acc", 1);
    outbox.enqueue(&mut t1, &first).await.unwrap();
    let (pool2, outbox2) = (pool.clone(), outbox.clone());
    let second = event("acc", 2);
    let second_id = second.id();
    let t2 = tokio::spawn(async move {
        let mut t2 = pool2.begin().await.unwrap();
        outbox2.enqueue(&mut t2, &second).await.unwrap();
        t2.commit().await.unwrap();
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(!t2.is_finished(), "T2 did not wait for T1's counter lock");
    // Another aggregate is not held up.
    commit(&pool, &outbox, &[event("other", 1)]).await;
    t1.commit().await.unwrap();
    t2.await.unwrap();
    let got = sequences(&pool, "acc").await;
    assert_eq!(got[1], (first.id(), 2));
    assert_eq!(got[2], (second_id, 3));

    // A rolled-back writer leaves no gap.
    let mut t3 = pool.begin().await.unwrap();
    outbox.enqueue(&mut t3, &event("acc", 3)).await.unwrap();
    t3.rollback().await.unwrap();
    commit(&pool, &outbox, &[event("acc", 4)]).await;
    let seq: Vec<i64> = sequences(&pool, "acc").await.iter().map(|r| r.1).collect();
    assert_eq!(seq, [1, 2, 3, 4]);
}

#[tokio::test]
async fn unordered_events_have_no_sequence() {
    let config = config(Ordering::Unordered);
    let (pool, outbox) = outbox(&config).await;
    commit(&pool, &outbox, &[event("u", 1), event("u", 2)]).await;
    let nulls = scalar_i64(&pool, "SELECT count(*) FROM outbox WHERE sequence IS NULL").await;
    assert_eq!(nulls, 2);
    assert_eq!(
        scalar_i64(&pool, "SELECT count(*) FROM outbox_sequences").await,
        0
    );
}

#[tokio::test]
async fn enqueue_joins_the_idempotency_transaction() {
    let config = config(Ordering::Ordered);
    let (pool, outbox) = outbox(&config).await;
    let store = PgStore::new(pool.clone());
    store.create_schema().await.unwrap();
    let service: PgIdempotencyService = PgIdempotencyService::new(store.clone());

    // Through execute's connection: record, business row and event commit together.
    let key = IdempotencyKey::new("k-1").unwrap();
    let (o1, event1) = (outbox.clone(), event("charge-1", 1));
    let id = event1.id();
    let outcome = service
        .execute(Call::new("CHARGE", key.clone(), &1), async move |conn| {
            o1.enqueue(conn, &event1).await?;
            Ok::<_, AppError>(ExecutionResult::success(1))
        })
        .await
        .unwrap();
    assert!(outcome.is_executed());
    let replay = service
        .execute(Call::new("CHARGE", key, &1), async |_conn| {
            Ok::<_, AppError>(ExecutionResult::success(2))
        })
        .await
        .unwrap();
    assert!(replay.is_replayed());
    assert_eq!(
        sequences(&pool, "charge-1").await,
        [(id, 1)],
        "enqueued once"
    );

    // Through a PgTx (derefs to PgConnection), also via the SPI trait; dropped = rolled back.
    let mut tx = PgTx::begin(&store).await.unwrap();
    Enqueue::enqueue_all(&outbox, &mut *tx, &[event("charge-2", 1)])
        .await
        .unwrap();
    outbox
        .enqueue(&mut tx, &event("charge-2", 2))
        .await
        .unwrap();
    drop(tx);
    assert!(sequences(&pool, "charge-2").await.is_empty());
    let mut tx = PgTx::begin(&store).await.unwrap();
    outbox
        .enqueue(&mut tx, &event("charge-2", 3))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(sequences(&pool, "charge-2").await.len(), 1);
}

#[tokio::test]
async fn invalid_events_are_rejected_before_sql() {
    let config = config(Ordering::Ordered);
    let (pool, outbox) = outbox(&config).await;
    let mut tx = pool.begin().await.unwrap();
    for bad in [
        NewEvent::new("", "a", "E", &1).unwrap(),
        NewEvent::new("t", "x".repeat(256), "E", &1).unwrap(),
        NewEvent::new("t", "a", "E", &1)
            .unwrap()
            .header("bad:name", "v"),
        NewEvent::new("t", "a", "E", &1)
            .unwrap()
            .header("h", "line\nbreak"),
    ] {
        let error = outbox.enqueue(&mut tx, &bad).await.unwrap_err();
        assert!(matches!(error, Error::InvalidEvent { .. }), "{error:?}");
    }
    // Invalid JSON text is refused before SQL too, so the transaction stays usable.
    let error = outbox
        .enqueue(
            &mut tx,
            &NewEvent::from_json_text("t", "a", "E", "{not json"),
        )
        .await
        .unwrap_err();
    assert!(matches!(error, Error::InvalidEvent { .. }), "{error:?}");
    assert!(!error.is_retryable());
    outbox
        .enqueue(&mut tx, &NewEvent::new("t", "a", "E", &1).unwrap())
        .await
        .unwrap();
}

#[tokio::test]
async fn payload_and_headers_reach_the_publisher_byte_for_byte() {
    let config = config(Ordering::Ordered);
    let (pool, outbox) = outbox(&config).await;
    // Key order, a number's spelling and the NUL escape are what a JSONB column would change
    // or refuse.
    let payload = r#"{"b":1,"a":"x\u0000y","n":1e2}"#;
    let sent = NewEvent::from_json_text("order", "nul", "Odd", payload)
        .header("trace", "a\0b")
        .header("x-order", "z");
    commit(&pool, &outbox, std::slice::from_ref(&sent)).await;

    let recorder = Arc::new(Recorder::default());
    let relay = Relay::new(outbox.clone(), Arc::clone(&recorder), &config).unwrap();
    relay.run_batch().await.unwrap();
    let got = recorder.0.lock().unwrap().clone();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].id, sent.id());
    assert_eq!(got[0].payload.as_bytes(), payload.as_bytes());
    assert_eq!(&got[0].headers, sent.headers());
    assert_eq!(published(&pool).await, 1);
}

#[tokio::test]
async fn a_connection_outside_a_transaction_is_refused_and_nothing_is_written() {
    let config = config(Ordering::Ordered);
    let (pool, outbox) = outbox(&config).await;
    let inbox_config = InboxConfig {
        schema: SchemaConfig {
            mode: SchemaMode::Create,
        },
        ..InboxConfig::default()
    };
    let inbox = PgInbox::from_config(pool.clone(), &inbox_config)
        .await
        .unwrap();
    let mut conn = pool.acquire().await.unwrap();

    for error in [
        outbox
            .enqueue(&mut conn, &event("auto", 1))
            .await
            .unwrap_err(),
        Enqueue::enqueue_all(&outbox, &mut conn, &[event("auto", 2)])
            .await
            .unwrap_err(),
        inbox
            .record(&mut conn, "projector", "m-1")
            .await
            .unwrap_err(),
    ] {
        assert!(matches!(error, Error::NotInTransaction { .. }), "{error:?}");
        assert!(!error.is_retryable());
    }
    assert_eq!(scalar_i64(&pool, "SELECT count(*) FROM outbox").await, 0);
    assert_eq!(
        scalar_i64(&pool, "SELECT count(*) FROM outbox_sequences").await,
        0
    );
    assert_eq!(scalar_i64(&pool, "SELECT count(*) FROM inbox").await, 0);

    // The same connection in a transaction works as before.
    let mut tx = conn.begin().await.unwrap();
    outbox.enqueue(&mut tx, &event("auto", 3)).await.unwrap();
    assert!(inbox.record(&mut tx, "projector", "m-1").await.unwrap());
    tx.commit().await.unwrap();
    assert_eq!(scalar_i64(&pool, "SELECT count(*) FROM outbox").await, 1);
    assert_eq!(scalar_i64(&pool, "SELECT count(*) FROM inbox").await, 1);
}
