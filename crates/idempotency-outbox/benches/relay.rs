//! Relay benchmark against real PostgreSQL and NATS JetStream (publish acks awaited).
//!
//! ```sh
//! cargo bench -p idempotency-outbox --all-features --bench relay
//! ```
//!
//! 1. Throughput: `BENCH_EVENTS` (default 20000) pending events, relayed by 1 and 2 workers at
//!    batch sizes 10, 100 and 500, `unordered` and `ordered` (1000 aggregates).
//! 2. Commit-to-ack latency at `BENCH_RATE` events/s (default 200) for `BENCH_SECONDS`
//!    (default 10), with LISTEN/NOTIFY wake-up and with polling (poll-interval 100ms), measured
//!    from the producer's commit returning to the publisher seeing the JetStream ack.

#![allow(
    missing_docs,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    clippy::print_stderr
)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream;
use idempotency_core::config::SchemaMode;
use idempotency_outbox::config::{Ordering, OutboxConfig, WakeUp};
use idempotency_outbox::publisher::nats::NatsPublisher;
use idempotency_outbox::{Ack, NewEvent, OutboxMessage, PublishError, Publisher, Relay};
use idempotency_pg::PgOutbox;
use sqlx::PgPool;
use uuid::Uuid;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Bench {
    pool: PgPool,
    js: jetstream::Context,
    stream: String,
    prefix: String,
}

impl Bench {
    async fn new() -> Self {
        let pool = idempotency_testing::pg_pool_with(16).await;
        let client = async_nats::connect(idempotency_testing::nats_url())
            .await
            .expect("NATS");
        let js = jetstream::new(client);
        let stream = idempotency_testing::unique_name("BENCH");
        let prefix = stream.to_lowercase();
        js.create_stream(jetstream::stream::Config {
            name: stream.clone(),
            subjects: vec![format!("{prefix}.>")],
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        })
        .await
        .expect("create stream");
        Self {
            pool,
            js,
            stream,
            prefix,
        }
    }

    fn publisher(&self) -> NatsPublisher {
        NatsPublisher::from_context(self.js.clone())
            .with_subject(&format!(
                "{}.{{aggregate_type}}.{{event_type}}",
                self.prefix
            ))
            .unwrap()
    }

    async fn outbox(&self, config: &OutboxConfig) -> PgOutbox {
        sqlx::raw_sql("DROP TABLE IF EXISTS outbox, outbox_sequences")
            .execute(&self.pool)
            .await
            .unwrap();
        self.js
            .get_stream(&self.stream)
            .await
            .unwrap()
            .purge()
            .await
            .unwrap();
        PgOutbox::from_config(self.pool.clone(), config)
            .await
            .unwrap()
    }
}

fn config(ordering: Ordering, workers: usize, batch: u32) -> OutboxConfig {
    let mut config = OutboxConfig::default();
    config.schema.mode = SchemaMode::Create;
    config.ordering = ordering;
    config.notify_channel = Some(idempotency_testing::unique_name("bench"));
    config.relay.workers = workers;
    config.relay.batch_size = batch;
    config.relay.stats_interval = Duration::from_secs(3600);
    config.retention.enabled = false;
    config
}

async fn throughput(bench: &Bench, ordering: Ordering, workers: usize, batch: u32) -> f64 {
    let events = env("BENCH_EVENTS", 20_000) as usize;
    let config = config(ordering, workers, batch);
    let outbox = bench.outbox(&config).await;
    for chunk in 0..events.div_ceil(1000) {
        let batch: Vec<NewEvent> = (chunk * 1000..((chunk + 1) * 1000).min(events))
            .map(|n| {
                NewEvent::new(
                    "order",
                    format!("o-{}", n % 1000),
                    "OrderPlaced",
                    &serde_json::json!({"n": n, "amountCents": 4900, "currency": "EUR"}),
                )
                .unwrap()
            })
            .collect();
        let mut tx = bench.pool.begin().await.unwrap();
        outbox.enqueue_all(&mut tx, &batch).await.unwrap();
        tx.commit().await.unwrap();
    }
    sqlx::raw_sql("VACUUM ANALYZE outbox")
        .execute(&bench.pool)
        .await
        .unwrap();
    let relay = Relay::new(outbox, bench.publisher(), &config).unwrap();
    let started = Instant::now();
    let handle = relay.spawn();
    while handle.totals().published < events as u64 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let elapsed = started.elapsed();
    handle.shutdown().await;
    events as f64 / elapsed.as_secs_f64()
}

/// Records when each message's ack arrived.
struct Timed<P> {
    inner: P,
    acks: Arc<Mutex<HashMap<Uuid, Instant>>>,
}

impl<P: Publisher> Publisher for Timed<P> {
    fn destination(&self) -> &str {
        self.inner.destination()
    }

    async fn publish(&self, message: &OutboxMessage) -> Result<Ack, PublishError> {
        let ack = self.inner.publish(message).await?;
        self.acks.lock().unwrap().insert(message.id, Instant::now());
        Ok(ack)
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

async fn latency(bench: &Bench, wake_up: WakeUp) -> (Duration, Duration, Duration, usize) {
    let rate = env("BENCH_RATE", 200);
    let seconds = env("BENCH_SECONDS", 10);
    let mut config = config(Ordering::Ordered, 2, 100);
    config.relay.wake_up = wake_up;
    config.relay.poll_interval = Duration::from_millis(100);
    let outbox = bench.outbox(&config).await;
    let acks = Arc::new(Mutex::new(HashMap::new()));
    let publisher = Timed {
        inner: bench.publisher(),
        acks: Arc::clone(&acks),
    };
    let handle = Relay::new(outbox.clone(), publisher, &config)
        .unwrap()
        .spawn();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let total = (rate * seconds) as usize;
    let mut commits = HashMap::with_capacity(total);
    let mut ticker = tokio::time::interval(Duration::from_secs_f64(1.0 / rate as f64));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    for n in 0..total {
        ticker.tick().await;
        let event = NewEvent::new("order", format!("o-{}", n % 50), "OrderPlaced", &n).unwrap();
        let mut tx = bench.pool.begin().await.unwrap();
        outbox.enqueue(&mut tx, &event).await.unwrap();
        tx.commit().await.unwrap();
        commits.insert(event.id(), Instant::now());
    }
    while handle.totals().published < total as u64 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    handle.shutdown().await;
    let acks = acks.lock().unwrap();
    let mut samples: Vec<Duration> = commits
        .iter()
        .map(|(id, committed)| acks[id].saturating_duration_since(*committed))
        .collect();
    samples.sort();
    (
        percentile(&samples, 0.5),
        percentile(&samples, 0.99),
        *samples.last().unwrap(),
        samples.len(),
    )
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let bench = Bench::new().await;
        let events = env("BENCH_EVENTS", 20_000);
        let only = std::env::var("BENCH_ONLY").unwrap_or_default();
        if only.is_empty() || only == "throughput" {
            println!("\nthroughput, {events} pending events to JetStream (acks awaited), events/s");
            println!("| ordering | workers | batch 10 | batch 100 | batch 500 |");
            println!("|---|---|---|---|---|");
            for ordering in [Ordering::Unordered, Ordering::Ordered] {
                for workers in [1, 2] {
                    let mut row = format!("| {ordering:?} | {workers} |");
                    for batch in [10, 100, 500] {
                        let rate = throughput(&bench, ordering, workers, batch).await;
                        row.push_str(&format!(" {rate:.0} |"));
                    }
                    println!("{row}");
                }
            }
        }
        if only.is_empty() || only == "latency" {
            let rate = env("BENCH_RATE", 200);
            println!("\ncommit-to-ack latency at {rate} events/s (2 workers, ordered)");
            println!("| wake-up | p50 | p99 | max | samples |");
            println!("|---|---|---|---|---|");
            for (name, wake_up) in [
                ("LISTEN/NOTIFY", WakeUp::Listen),
                ("poll 100ms", WakeUp::Poll),
            ] {
                let (p50, p99, max, n) = latency(&bench, wake_up).await;
                println!("| {name} | {p50:.1?} | {p99:.1?} | {max:.1?} | {n} |");
            }
        }
        let _ = bench.js.delete_stream(&bench.stream).await;
    });
}
