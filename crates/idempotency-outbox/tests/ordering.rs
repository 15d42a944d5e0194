//! Per-aggregate order: concurrent writers on the same aggregates, 4 relay workers, transient
//! failures; the JetStream consumer sees each aggregate's events in commit order.

#![cfg(feature = "nats")]
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use common::nats::{TestStream, header};
use common::*;
use idempotency_outbox::config::Ordering;
use idempotency_outbox::publisher::headers;
use idempotency_outbox::{NewEvent, Relay};

const AGGREGATES: usize = 6;
const WRITERS: usize = 8;
const PER_WRITER: usize = 40;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_aggregate_is_published_in_commit_order_by_four_workers() {
    let mut config = config(Ordering::Ordered);
    config.relay.workers = 4;
    config.relay.batch_size = 10;
    let (pool, outbox) = outbox(&config).await;
    sqlx::query("CREATE TABLE account (id text PRIMARY KEY, version int NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    for a in 0..AGGREGATES {
        sqlx::query("INSERT INTO account VALUES ($1, 0)")
            .bind(format!("acc-{a}"))
            .execute(&pool)
            .await
            .unwrap();
    }
    let stream = TestStream::new().await;
    // One message in seven fails its first attempt: it must hold back its aggregate only.
    let failures = Arc::new(AtomicU64::new(0));
    let publisher = FlakyFirstAttempt {
        inner: stream.publisher().await,
        fail: Box::new(|m| m.id.as_u128() % 7 == 0),
        failures: Arc::clone(&failures),
        failed: Default::default(),
    };
    let handle = Relay::new(outbox.clone(), publisher, &config)
        .unwrap()
        .spawn();

    // Writers run while the relay runs. Each transaction bumps the account's version under
    // its row lock (held until commit, so version order is commit order), sleeps a little
    // to interleave commits, and enqueues an event carrying the version.
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (pool, outbox) = (pool.clone(), outbox.clone());
            tokio::spawn(async move {
                for i in 0..PER_WRITER {
                    let account = format!("acc-{}", (w * 7 + i * 3) % AGGREGATES);
                    let mut tx = pool.begin().await.unwrap();
                    let version: i32 = sqlx::query_scalar(
                        "UPDATE account SET version = version + 1 WHERE id = $1 RETURNING version",
                    )
                    .bind(&account)
                    .fetch_one(&mut *tx)
                    .await
                    .unwrap();
                    let event = NewEvent::new(
                        "account",
                        &account,
                        "AccountChanged",
                        &serde_json::json!({"version": version, "writer": w}),
                    )
                    .unwrap();
                    outbox.enqueue(&mut tx, &event).await.unwrap();
                    if i % 4 == 0 {
                        tokio::time::sleep(Duration::from_millis(2)).await;
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
    eventually("all published", || async {
        published(&pool).await == total as i64
    })
    .await;
    let report = handle.shutdown().await;
    assert!(
        failures.load(std::sync::atomic::Ordering::SeqCst) > 10,
        "{report:?}"
    );

    let messages = stream.read(total).await;
    let mut seen: BTreeMap<String, Vec<(i64, i64)>> = BTreeMap::new();
    for message in &messages {
        let account = header(message, headers::AGGREGATE_ID).unwrap().to_owned();
        let sequence: i64 = header(message, headers::SEQUENCE).unwrap().parse().unwrap();
        let version = payload_of(&message.payload)["version"].as_i64().unwrap();
        seen.entry(account).or_default().push((version, sequence));
    }
    assert_eq!(seen.len(), AGGREGATES);
    for (account, events) in &seen {
        let versions: Vec<i64> = events.iter().map(|(v, _)| *v).collect();
        let want: Vec<i64> = (1..=versions.len() as i64).collect();
        assert_eq!(
            versions, want,
            "{account}: consumer order differs from commit order"
        );
        assert!(
            events.iter().all(|(v, s)| v == s),
            "{account}: sequence differs from commit order: {events:?}"
        );
    }
    stream.delete().await;
}
