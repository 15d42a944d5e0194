//! Writes N events into the outbox, in transactions of a fixed size.

use std::time::{Duration, Instant};

use idempotency_outbox::NewEvent;
use idempotency_pg::PgOutbox;
use serde::Serialize;
use sqlx::PgPool;

use crate::Error;

/// What [`run`] wrote.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Enqueued {
    /// Events committed.
    pub events: u64,
    /// Over how many aggregates (`chaos/agg-<i>`).
    pub aggregates: u64,
    /// Seconds taken.
    pub seconds: f64,
}

/// Commits `count` events over `aggregates` aggregates, `per_tx` per transaction, waiting
/// `pause` after each commit (to spread the events over a run). Event `i` belongs to aggregate
/// `i mod aggregates` and carries `{"n": i}`.
pub async fn run(
    pool: &PgPool,
    outbox: &PgOutbox,
    count: u64,
    aggregates: u64,
    per_tx: u64,
    pause: Duration,
) -> Result<Enqueued, Error> {
    let started = Instant::now();
    let aggregates = aggregates.max(1);
    let mut n = 0;
    while n < count {
        let end = (n + per_tx.max(1)).min(count);
        let events = (n..end)
            .map(|i| {
                NewEvent::new(
                    "chaos",
                    format!("agg-{}", i % aggregates),
                    "ChaosEvent",
                    &serde_json::json!({ "n": i }),
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut tx = pool.begin().await?;
        outbox.enqueue_all(&mut tx, &events).await?;
        tx.commit().await?;
        n = end;
        if !pause.is_zero() && n < count {
            tokio::time::sleep(pause).await;
        }
    }
    Ok(Enqueued {
        events: count,
        aggregates,
        seconds: started.elapsed().as_secs_f64(),
    })
}
