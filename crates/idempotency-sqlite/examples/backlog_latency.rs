//! Request latency on SQLite while a relay polls an ordered outbox whose one aggregate has a
//! long pending backlog behind its first event, which is in flight (a broker outage: every
//! poll takes the write lock and has nothing to hand out). Each request is a payment through
//! `execute` that writes a charge and enqueues its event, as the demo's `POST /charges` does.
//! Prints p50, p99 and the slowest request at concurrency 1 and 16, without a backlog and with
//! one, in the same run (the machine is shared: compare within a run).
//!
//! ```sh
//! cargo run -p idempotency-sqlite --example backlog_latency -- 100000 400
//! ```
//! (arguments: the backlog, the requests per scenario)

#![allow(clippy::print_stdout)] // a program that prints what it measured

use std::time::{Duration, Instant};

use idempotency_core::config::{PersistenceConfig, SchemaMode};
use idempotency_core::{Call, ExecutionResult, IdempotencyKey, IdempotencyService};
use idempotency_outbox::NewEvent;
use idempotency_outbox::config::{Ordering, OutboxConfig};
use idempotency_outbox::store::{ClaimRequest, RelayStore};
use idempotency_sqlite::{SqliteOutbox, SqliteStore, close_pool};
use uuid::Uuid;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How often the relay polls (the examples' setting for SQLite, which has no notifications).
const POLL: Duration = Duration::from_millis(50);

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let mut args = std::env::args().skip(1);
    let backlog: usize = args.next().map_or(Ok(100_000), |a| a.parse())?;
    let requests: usize = args.next().map_or(Ok(400), |a| a.parse())?;
    for pending in [0, backlog] {
        for clients in [1, 16] {
            let latencies = scenario(pending, clients, requests).await?;
            println!(
                "backlog {pending:>7}, {clients:>2} client(s), {requests} requests: {}",
                summary(latencies)
            );
        }
    }
    Ok(())
}

async fn scenario(
    backlog: usize,
    clients: usize,
    requests: usize,
) -> Result<Vec<Duration>, BoxError> {
    let dir = std::env::temp_dir().join(format!("idempotency-backlog-{}", Uuid::now_v7()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("bench.db");
    let mut persistence = PersistenceConfig::default();
    persistence.schema.mode = SchemaMode::Create;
    let store = SqliteStore::connect(path.to_str().ok_or("path")?, &persistence).await?;
    let pool = store.pool().clone();
    sqlx::query("CREATE TABLE charges (id TEXT PRIMARY KEY, amount_cents INTEGER NOT NULL)")
        .execute(&pool)
        .await?;
    let mut config = OutboxConfig::default();
    config.schema.mode = SchemaMode::Create;
    config.ordering = Ordering::Ordered;
    let outbox = SqliteOutbox::from_config(pool.clone(), &config).await?;

    // The backlog: one aggregate, enqueued in batches.
    let events: Vec<NewEvent> = (0..backlog)
        .map(|n| NewEvent::new("account", "acc_1", "Posted", &n))
        .collect::<Result<_, _>>()?;
    for chunk in events.chunks(10_000) {
        let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
        outbox.enqueue_all(&mut tx, chunk).await?;
        tx.commit().await?;
    }
    // The relay: its first claim takes the aggregate's first event (in flight for good: the
    // broker is down); every later poll finds rows due and nothing to hand out.
    let poller = tokio::spawn({
        let outbox = outbox.clone();
        async move {
            let request = ClaimRequest {
                limit: 100,
                lease: Duration::from_secs(3600),
                token: Uuid::now_v7(),
                ordering: Ordering::Ordered,
                max_attempts: 10,
            };
            loop {
                if let Err(error) = outbox.claim(&request).await {
                    tracing::warn!(error = %error, "claim failed");
                }
                tokio::time::sleep(POLL).await;
            }
        }
    });
    tokio::time::sleep(POLL * 2).await;

    let service = IdempotencyService::new(store.clone());
    let per_client = requests / clients;
    let tasks: Vec<_> = (0..clients)
        .map(|client| {
            let service = service.clone();
            let outbox = outbox.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(per_client);
                for n in 0..per_client {
                    let charge = format!("ch_{client}_{n}");
                    let key = IdempotencyKey::new(Uuid::now_v7().to_string())?;
                    let started = Instant::now();
                    let _: idempotency_core::Outcome<String> = service
                        .execute(Call::new("CHARGE", key, &charge), async |conn| {
                            sqlx::query("INSERT INTO charges (id, amount_cents) VALUES (?1, 4900)")
                                .bind(&charge)
                                .execute(&mut *conn)
                                .await?;
                            let event = NewEvent::new("charge", &charge, "ChargeCreated", &4900)?;
                            outbox.enqueue(conn, &event).await?;
                            Ok::<_, BoxError>(ExecutionResult::success(charge.clone()))
                        })
                        .await?;
                    latencies.push(started.elapsed());
                }
                Ok::<_, BoxError>(latencies)
            })
        })
        .collect();
    let mut latencies = Vec::with_capacity(requests);
    for task in tasks {
        latencies.extend(task.await??);
    }
    poller.abort();
    close_pool(&pool).await?;
    std::fs::remove_dir_all(&dir)?;
    Ok(latencies)
}

fn summary(mut latencies: Vec<Duration>) -> String {
    latencies.sort_unstable();
    let at = |q: f64| latencies[((latencies.len() as f64 - 1.0) * q).round() as usize];
    format!(
        "p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        at(0.50).as_secs_f64() * 1000.0,
        at(0.99).as_secs_f64() * 1000.0,
        at(1.0).as_secs_f64() * 1000.0
    )
}
