//! The outbox and the idempotency record in one SQLite transaction: the record, the business
//! row and the event commit together and roll back together; per-aggregate order holds with
//! concurrent writers while the relay runs.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

mod outbox_common;

use std::collections::BTreeMap;
use std::time::Duration;

use idempotency_core::{Call, ExecutionResult, IdempotencyService, Outcome};
use idempotency_outbox::config::Ordering;
use idempotency_outbox::{NewEvent, Relay};
use idempotency_sqlite::{SqliteOutbox, SqliteStore, SqliteTx};
use outbox_common::*;
use sqlx::SqliteConnection;

#[derive(Debug, thiserror::Error)]
enum AppError {
    #[error(transparent)]
    Idempotency(#[from] idempotency_core::Error),
    #[error(transparent)]
    Outbox(#[from] idempotency_outbox::Error),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

async fn with_charges(store: &SqliteStore) {
    sqlx::query("CREATE TABLE charges (id INTEGER PRIMARY KEY, reference TEXT NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
}

/// The business action: a charge row and its event, on the caller's connection.
async fn charge(
    outbox: &SqliteOutbox,
    conn: &mut SqliteConnection,
    reference: &str,
) -> Result<ExecutionResult<i64>, AppError> {
    let id: i64 = sqlx::query_scalar("INSERT INTO charges (reference) VALUES (?) RETURNING id")
        .bind(reference)
        .fetch_one(&mut *conn)
        .await?;
    let event = NewEvent::new(
        "charge",
        id.to_string(),
        "ChargeCreated",
        &serde_json::json!({"id": id, "reference": reference}),
    )?;
    outbox.enqueue(conn, &event).await?;
    Ok(ExecutionResult::success(id))
}

async fn counts(store: &SqliteStore) -> (i64, i64, i64) {
    (
        scalar(store.pool(), "SELECT count(*) FROM idempotency_records").await,
        scalar(store.pool(), "SELECT count(*) FROM charges").await,
        scalar(store.pool(), "SELECT count(*) FROM outbox").await,
    )
}

#[tokio::test]
async fn record_business_row_and_event_commit_and_roll_back_together_in_a_sqlite_tx() {
    let config = config(Ordering::Ordered);
    let (store, outbox) = fresh(&config).await;
    with_charges(&store).await;
    let service = IdempotencyService::new(store.clone());
    for commit in [false, true] {
        let mut tx = SqliteTx::new(store.pool().begin_with("BEGIN IMMEDIATE").await.unwrap());
        let call = Call::new("CHARGE", idempotency_core::testing::key("tx"), &1);
        let outcome: Outcome<i64> = service
            .execute_in(&mut tx, call, async |conn| {
                charge(&outbox, conn, "in-tx").await
            })
            .await
            .unwrap();
        assert!(outcome.is_executed());
        // The application's own statement in the same transaction, outside the action.
        let extra = NewEvent::new("audit", "tx", "Audited", &commit).unwrap();
        outbox.enqueue(&mut tx, &extra).await.unwrap();
        if commit {
            tx.commit().await.unwrap();
        } else {
            tx.rollback().await.unwrap();
            assert_eq!(
                counts(&store).await,
                (0, 0, 0),
                "nothing survives a rollback"
            );
        }
    }
    assert_eq!(counts(&store).await, (1, 1, 2));

    let recorder = Recorder::default();
    let relay = Relay::new(outbox.clone(), recorder.clone(), &config).unwrap();
    relay.run_batch().await.unwrap();
    let types: Vec<_> = recorder
        .published()
        .iter()
        .map(|m| m.event_type.clone())
        .collect();
    assert_eq!(types, ["ChargeCreated", "Audited"]);
}

#[tokio::test]
async fn a_replay_enqueues_nothing_and_a_failed_action_leaves_no_event() {
    let (store, outbox) = fresh(&config(Ordering::Ordered)).await;
    with_charges(&store).await;
    let service = IdempotencyService::new(store.clone());
    let key = idempotency_core::testing::key("replay");
    let failed: Result<Outcome<i64>, AppError> = service
        .execute(Call::new("CHARGE", key.clone(), &1), async |conn| {
            charge(&outbox, conn, "failed").await?;
            Err(AppError::Database(sqlx::Error::RowNotFound))
        })
        .await;
    assert!(failed.is_err());
    assert_eq!(counts(&store).await, (0, 0, 0));
    for executed in [true, false] {
        let outcome: Outcome<i64> = service
            .execute(Call::new("CHARGE", key.clone(), &1), async |conn| {
                charge(&outbox, conn, "kept").await
            })
            .await
            .unwrap();
        assert_eq!(outcome.is_executed(), executed);
    }
    assert_eq!(
        counts(&store).await,
        (1, 1, 1),
        "the replay wrote no second event"
    );
}

const AGGREGATES: usize = 5;
const WRITERS: usize = 6;
const PER_WRITER: usize = 25;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_aggregate_is_published_in_commit_order_with_concurrent_writers() {
    let mut config = config(Ordering::Ordered);
    config.relay.workers = 2; // more workers are correct, if not faster, on SQLite
    config.relay.batch_size = 10;
    let (store, outbox) = fresh(&config).await;
    sqlx::query("CREATE TABLE account (id TEXT PRIMARY KEY, version INTEGER NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
    for a in 0..AGGREGATES {
        sqlx::query("INSERT INTO account VALUES (?, 0)")
            .bind(format!("acc-{a}"))
            .execute(store.pool())
            .await
            .unwrap();
    }
    let recorder = Recorder::default();
    // One message in five fails its first attempt: it holds back its own aggregate only.
    recorder.fail_when(|m| m.attempts == 1 && m.id.as_u128() % 5 == 0);
    let handle = Relay::new(outbox.clone(), recorder.clone(), &config)
        .unwrap()
        .spawn();

    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let outbox = outbox.clone();
            tokio::spawn(async move {
                for i in 0..PER_WRITER {
                    let account = format!("acc-{}", (w * 7 + i * 3) % AGGREGATES);
                    let mut tx = outbox.pool().begin_with("BEGIN IMMEDIATE").await.unwrap();
                    let version: i64 = sqlx::query_scalar(
                        "UPDATE account SET version = version + 1 WHERE id = ? RETURNING version",
                    )
                    .bind(&account)
                    .fetch_one(&mut *tx)
                    .await
                    .unwrap();
                    let event = NewEvent::new(
                        "account",
                        &account,
                        "AccountChanged",
                        &serde_json::json!({"version": version}),
                    )
                    .unwrap();
                    outbox.enqueue(&mut tx, &event).await.unwrap();
                    if i % 4 == 0 {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    tx.commit().await.unwrap();
                }
            })
        })
        .collect();
    for writer in writers {
        writer.await.unwrap();
    }
    let total = WRITERS * PER_WRITER;
    eventually("all published", || async { recorder.count() == total }).await;
    handle.shutdown().await;
    assert!(recorder.failures() > 5, "{} failures", recorder.failures());

    let mut seen: BTreeMap<String, Vec<(i64, i64)>> = BTreeMap::new();
    for message in recorder.published() {
        let payload: serde_json::Value = serde_json::from_str(&message.payload).unwrap();
        let version = payload["version"].as_i64().unwrap();
        seen.entry(message.aggregate_id.clone())
            .or_default()
            .push((version, message.sequence.unwrap()));
    }
    assert_eq!(seen.len(), AGGREGATES);
    for (account, events) in &seen {
        let versions: Vec<i64> = events.iter().map(|(v, _)| *v).collect();
        let want: Vec<i64> = (1..=versions.len() as i64).collect();
        assert_eq!(
            versions, want,
            "{account}: publish order differs from commit order"
        );
        assert!(events.iter().all(|(v, s)| v == s), "{account}: {events:?}");
    }
}
