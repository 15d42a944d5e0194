//! Outbox retention at scale on PostgreSQL: the same published events in a plain table and in
//! a table partitioned by day; retention by the batched `DELETE` against retention by
//! partition `DETACH` + `DROP`. Wall time, WAL written, the table's size afterwards, and the
//! latency of a relay's claims of a small pending set while retention runs.
//!
//! `cargo run --release -p idempotency-bench -- --only-retention --events 5000000`

use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use idempotency_core::config::SchemaMode;
use idempotency_outbox::config::{Ordering, OutboxConfig, PartitioningConfig};
use idempotency_outbox::store::{ClaimRequest, Failure, RelayStore};
use idempotency_outbox::{LoggingPublisher, Relay};
use idempotency_pg::PgOutbox;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{AssertSqlSafe, PgPool};
use uuid::Uuid;

const DAY: i64 = 86_400;
/// Days the events' `created_at` is spread over, ending at the start of the current UTC day.
const DAYS: i64 = 10;
/// `retention.published`: the events of the 7 oldest days, and part of the 8th, go.
const KEEP: Duration = Duration::from_secs(3 * 86_400);
/// Pending rows the claiming relay works on.
const PENDING: i64 = 200;

/// What one retention run cost.
struct Run {
    label: &'static str,
    wall: Duration,
    wal_bytes: i64,
    size_before: i64,
    size_after: i64,
    rows_after: i64,
    deleted: u64,
    partitions_dropped: u32,
    claims: Histogram<u64>,
    idle_claims: Histogram<u64>,
}

async fn exec(pool: &PgPool, sql: &str) {
    sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
        .execute(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

async fn scalar(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(AssertSqlSafe(sql.to_owned()))
        .fetch_one(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// Heap, indexes and TOAST of `table`, over all its partitions.
async fn size(pool: &PgPool, table: &str) -> i64 {
    scalar(
        pool,
        &format!(
            "SELECT CASE WHEN c.relkind = 'p' \
                    THEN (SELECT COALESCE(sum(pg_total_relation_size(relid)), 0) \
                          FROM pg_partition_tree(c.oid)) \
                    ELSE pg_total_relation_size(c.oid) END::int8 \
             FROM pg_class c WHERE c.oid = '{table}'::regclass"
        ),
    )
    .await
}

async fn wal_lsn(pool: &PgPool) -> String {
    sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
        .fetch_one(pool)
        .await
        .expect("wal lsn")
}

async fn wal_since(pool: &PgPool, start: &str) -> i64 {
    sqlx::query_scalar("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::int8")
        .bind(start)
        .fetch_one(pool)
        .await
        .expect("wal diff")
}

fn config(table: &str, partitioned: bool) -> OutboxConfig {
    let mut config = OutboxConfig {
        table_name: table.to_owned(),
        notify_channel: None,
        ordering: Ordering::Unordered,
        ..OutboxConfig::default()
    };
    config.schema.mode = SchemaMode::Create;
    config.partitioning = PartitioningConfig {
        enabled: partitioned,
        interval: Duration::from_secs(86_400),
        ahead: 3,
    };
    config.retention.published = KEEP;
    config.retention.batch_size = 1000;
    config
}

/// Claims of `limit` 10 in a loop, each put back due at once, until `stop`: the latency of
/// each claim statement.
async fn claim_loop(outbox: PgOutbox, stop: Arc<AtomicBool>) -> Histogram<u64> {
    let mut histogram = Histogram::<u64>::new(3).expect("histogram");
    while !stop.load(AtomicOrdering::Relaxed) {
        let request = ClaimRequest {
            limit: 10,
            lease: Duration::from_secs(30),
            token: Uuid::new_v4(),
            ordering: Ordering::Unordered,
            max_attempts: 1_000_000_000,
        };
        let started = Instant::now();
        let claimed = outbox.claim(&request).await.expect("claim");
        let micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        histogram.record(micros.max(1)).expect("record");
        let failures: Vec<_> = claimed
            .messages
            .iter()
            .map(|m| Failure {
                id: m.id,
                error: "bench".to_owned(),
                retry_in: Duration::ZERO,
                dead_letter: false,
                transient: false,
            })
            .collect();
        outbox
            .mark_failed(request.token, &failures)
            .await
            .expect("mark");
    }
    histogram
}

async fn claims_for(outbox: &PgOutbox, how_long: Duration) -> Histogram<u64> {
    let stop = Arc::new(AtomicBool::new(false));
    let task = tokio::spawn(claim_loop(outbox.clone(), stop.clone()));
    tokio::time::sleep(how_long).await;
    stop.store(true, AtomicOrdering::Relaxed);
    task.await.expect("claims")
}

async fn retention(pool: &PgPool, outbox: &PgOutbox, label: &'static str, table: &str) -> Run {
    let idle_claims = claims_for(outbox, Duration::from_secs(3)).await;
    let size_before = size(pool, table).await;
    let relay = Relay::new(
        outbox.clone(),
        LoggingPublisher::new(),
        &config(table, outbox.partitioning().is_some()),
    )
    .expect("relay");
    let stop = Arc::new(AtomicBool::new(false));
    let claims = tokio::spawn(claim_loop(outbox.clone(), stop.clone()));
    let wal = wal_lsn(pool).await;
    let started = Instant::now();
    let report = relay.purge().await.expect("purge");
    let wall = started.elapsed();
    let wal_bytes = wal_since(pool, &wal).await;
    stop.store(true, AtomicOrdering::Relaxed);
    let claims = claims.await.expect("claims");
    Run {
        label,
        wall,
        wal_bytes,
        size_before,
        size_after: size(pool, table).await,
        rows_after: scalar(pool, &format!("SELECT count(*) FROM {table}")).await,
        deleted: report.published,
        partitions_dropped: report.partitions_dropped,
        claims,
        idle_claims,
    }
}

fn mib(bytes: i64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn ms(histogram: &Histogram<u64>, quantile: f64) -> f64 {
    histogram.value_at_quantile(quantile) as f64 / 1e3
}

/// Loads `events` published events into a plain and a day-partitioned outbox, then runs
/// retention on each and prints the figures and their ratios.
pub(crate) async fn run(events: i64) {
    let url = idempotency_testing::database_url();
    let schema = format!("bench_retention_{}", std::process::id());
    let admin = PgPool::connect(&url).await.expect("connect");
    exec(&admin, &format!("DROP SCHEMA IF EXISTS {schema} CASCADE")).await;
    exec(&admin, &format!("CREATE SCHEMA {schema}")).await;
    let options = PgConnectOptions::from_str(&url)
        .expect("DATABASE_URL")
        .options([("search_path", schema.as_str())]);
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await
        .expect("pool");

    let plain = PgOutbox::from_config(pool.clone(), &config("outbox_plain", false))
        .await
        .expect("plain outbox");
    let partitioned = PgOutbox::from_config(pool.clone(), &config("outbox_part", true))
        .await
        .expect("partitioned outbox");
    // The days before today, as a table that has been partitioned for a while has them.
    for day in 1..=DAYS {
        exec(
            &pool,
            &format!(
                "CREATE TABLE outbox_part_back{day} PARTITION OF outbox_part FOR VALUES \
                 FROM (to_timestamp((floor(extract(epoch FROM now()) / {DAY}) - {day}) * {DAY})) \
                 TO (to_timestamp((floor(extract(epoch FROM now()) / {DAY}) - {day} + 1) * {DAY}))"
            ),
        )
        .await;
    }

    let loading = Instant::now();
    exec(
        &pool,
        &format!(
            "INSERT INTO outbox_plain (id, aggregate_type, aggregate_id, event_type, payload, \
                                       created_at, next_attempt_at, attempts, published_at) \
             SELECT gen_random_uuid(), 'order', 'o-' || (g % 10000), 'OrderUpdated', \
                    ('{{\"order\":' || g || ',\"total\":4200}}')::json, c, c, 1, \
                    c + interval '1 second' \
             FROM generate_series(1, {events}) AS g, \
                  LATERAL (SELECT date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' \
                                  - interval '{DAYS} days' \
                                  + ((g - 0.5) / {events}) * interval '{DAYS} days' AS c) AS t"
        ),
    )
    .await;
    exec(&pool, "INSERT INTO outbox_part SELECT * FROM outbox_plain").await;
    for table in ["outbox_plain", "outbox_part"] {
        exec(
            &pool,
            &format!(
                "INSERT INTO {table} (id, aggregate_type, aggregate_id, event_type, payload) \
                 SELECT gen_random_uuid(), 'order', 'p-' || g, 'OrderUpdated', '{{}}' \
                 FROM generate_series(1, {PENDING}) AS g"
            ),
        )
        .await;
        exec(&pool, &format!("ANALYZE {table}")).await;
    }
    println!(
        "loaded {events} published events (+{PENDING} pending) into each table in {:.1} s; \
         retention.published = 3d, created_at over the {DAYS} days before today (UTC)",
        loading.elapsed().as_secs_f64()
    );

    let delete = retention(
        &pool,
        &plain,
        "batched DELETE (plain table)",
        "outbox_plain",
    )
    .await;
    let drop = retention(
        &pool,
        &partitioned,
        "DETACH + DROP (partitioned by day)",
        "outbox_part",
    )
    .await;
    // What the plain table still owes: the dead rows stay until a VACUUM (autovacuum is off
    // here; with it on, this work runs in the background anyway).
    let wal = wal_lsn(&pool).await;
    let started = Instant::now();
    exec(&pool, "VACUUM outbox_plain").await;
    let vacuum_wall = started.elapsed();
    let vacuum_wal = wal_since(&pool, &wal).await;
    let vacuum_size = size(&pool, "outbox_plain").await;

    println!();
    println!(
        "| retention | wall | WAL written | size before | size after | rows left | rows deleted | \
         partitions dropped | claims | claim p50 / p99 idle | claim p50 / p99 during |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for run in [&delete, &drop] {
        println!(
            "| {} | {:.2} s | {:.1} MiB | {:.0} MiB | {:.0} MiB | {} | {} | {} | {} | \
             {:.2} / {:.2} ms | {:.2} / {:.2} ms |",
            run.label,
            run.wall.as_secs_f64(),
            mib(run.wal_bytes),
            mib(run.size_before),
            mib(run.size_after),
            run.rows_after,
            run.deleted,
            run.partitions_dropped,
            run.claims.len(),
            ms(&run.idle_claims, 0.5),
            ms(&run.idle_claims, 0.99),
            ms(&run.claims, 0.5),
            ms(&run.claims, 0.99),
        );
    }
    println!(
        "| VACUUM of the plain table after the DELETE | {:.2} s | {:.1} MiB | | {:.0} MiB | | | | | | |",
        vacuum_wall.as_secs_f64(),
        mib(vacuum_wal),
        mib(vacuum_size),
    );
    println!();
    println!("| ratio (DELETE / DROP) | measured |");
    println!("|---|---:|");
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::INFINITY };
    println!(
        "| wall time | {:.1} |",
        ratio(delete.wall.as_secs_f64(), drop.wall.as_secs_f64())
    );
    println!(
        "| WAL written | {:.1} |",
        ratio(delete.wal_bytes as f64, drop.wal_bytes as f64)
    );
    println!(
        "| size afterwards | {:.2} |",
        ratio(delete.size_after as f64, drop.size_after as f64)
    );
    println!(
        "| claim p50 during retention | {:.2} |",
        ratio(ms(&delete.claims, 0.5), ms(&drop.claims, 0.5))
    );
    println!(
        "| claim p99 during retention | {:.2} |",
        ratio(ms(&delete.claims, 0.99), ms(&drop.claims, 0.99))
    );
    pool.close().await;
    exec(&admin, &format!("DROP SCHEMA IF EXISTS {schema} CASCADE")).await;
}
