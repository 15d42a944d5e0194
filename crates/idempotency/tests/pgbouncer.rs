//! `idempotency.persistence.pooler`: the assembled service behind PgBouncer in
//! `pool_mode = transaction` (`PGBOUNCER_URL`; `scripts/services.sh` starts one on
//! 127.0.0.1:6432 in front of `DATABASE_URL`), and the start-up refusals of what cannot work
//! there.

#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use idempotency::outbox::{Housekeeping, NewEvent};
use idempotency::{
    Builder, Call, Error, ExecutionResult, Idempotency, IdempotencyKey, Loader, Settings,
};

fn unique() -> String {
    uuid::Uuid::now_v7().simple().to_string()
}

fn settings(yaml: &str) -> Settings {
    let file = std::env::temp_dir().join(format!("idempotency-pgbouncer-{}.yaml", unique()));
    std::fs::write(&file, yaml).unwrap();
    let loaded = Loader::new()
        .file(&file)
        .environment(Vec::<(String, String)>::new())
        .load();
    std::fs::remove_file(&file).unwrap();
    loaded.unwrap()
}

fn property_of(error: Error) -> &'static str {
    match error {
        Error::Property { property, .. } => property,
        other => panic!("expected a refused property, got {other:?}"),
    }
}

/// A schema of its own (made on a direct connection), and a pool through PgBouncer.
async fn bouncer() -> (sqlx::PgPool, String) {
    let direct = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let url = std::env::var("PGBOUNCER_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:6432/test".to_owned());
    let schema = format!("bouncer_{}", unique());
    let admin = sqlx::PgPool::connect(&direct).await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
        .execute(&admin)
        .await
        .unwrap();
    admin.close().await;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(8)
        .connect(&url)
        .await
        .unwrap_or_else(|e| panic!("PgBouncer at {url} ({e}): scripts/services.sh starts one"));
    (pool, schema)
}

fn yaml(schema: &str, pooler: &str, wake_up: &str) -> String {
    format!(
        "idempotency:\n  distributed-cache:\n    enabled: false\n  persistence:\n    \
         table-name: {schema}.idempotency_records\n    pooler: {pooler}\n    schema:\n      \
         mode: create\noutbox:\n  table-name: {schema}.outbox\n  schema:\n    mode: create\n  \
         relay:\n    wake-up: {wake_up}\n    poll-interval: 20ms\n"
    )
}

async fn run(idempotency: &Idempotency<sqlx::PgPool>, key: &str, runs: &AtomicUsize) -> u32 {
    let request = serde_json::json!({ "n": 7 });
    let outbox = idempotency.outbox().unwrap().clone();
    let outcome = idempotency
        .service()
        .execute(
            Call::new("PAY", IdempotencyKey::new(key).unwrap(), &request),
            async |conn| {
                runs.fetch_add(1, Ordering::SeqCst);
                let event = NewEvent::new("payment", key, "PaymentMade", &request).unwrap();
                outbox.enqueue(conn, &event).await.unwrap();
                Ok::<_, idempotency::core::Error>(ExecutionResult::success(7_u32))
            },
        )
        .await
        .unwrap();
    match outcome.into_result() {
        ExecutionResult::Success(n) => n,
        ExecutionResult::Rejected(_) => unreachable!(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pooler_transaction_serves_replays_and_relays_through_pgbouncer() {
    let (pool, schema) = bouncer().await;
    let idempotency = Builder::new(&settings(&yaml(&schema, "transaction", "poll")))
        .publisher(idempotency::outbox::LoggingPublisher::new())
        .build(pool)
        .await
        .unwrap();
    let runs = AtomicUsize::new(0);
    for key in ["a", "b", "c"] {
        assert_eq!(run(&idempotency, key, &runs).await, 7);
        assert_eq!(run(&idempotency, key, &runs).await, 7, "the retry replays");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 3, "each key ran once");
    let outbox = idempotency.outbox().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let stats = outbox.stats().await.unwrap();
        if stats.pending == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the relay left {stats:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    idempotency.shutdown().await;
}

#[tokio::test]
async fn pooler_transaction_refuses_listen_wake_ups_and_other_databases() {
    let (pool, schema) = bouncer().await;
    let error = Builder::new(&settings(&yaml(&schema, "transaction", "listen")))
        .publisher(idempotency::outbox::LoggingPublisher::new())
        .build(pool)
        .await
        .unwrap_err();
    assert_eq!(property_of(error), "outbox.relay.wake-up");

    let sqlite = sqlx::SqlitePool::connect("sqlite::memory:").await.unwrap();
    let error = Idempotency::from_config(
        &settings(
            "idempotency:\n  distributed-cache:\n    enabled: false\n  persistence:\n    \
             pooler: transaction\n    schema:\n      mode: create\n",
        ),
        sqlite,
    )
    .await
    .unwrap_err();
    assert_eq!(property_of(error), "idempotency.persistence.pooler");
}

/// `health()` many times at once, beside requests that hold server connections in their
/// transactions, through PgBouncer: every report finds the database up. A prepared `SELECT 1`
/// failed there now and then (a named one meets a server connection that already has
/// `sqlx_s_1`, or is bound on one that has not; an unnamed one is parsed on one server
/// connection and bound on another), and `/health/ready` answered 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_finds_the_database_up_through_pgbouncer_under_traffic() {
    const CHECKERS: usize = 8;
    const CHECKS: usize = 60;
    const WRITERS: usize = 4;
    let (pool, schema) = bouncer().await;
    let idempotency = Builder::new(&settings(&yaml(&schema, "transaction", "poll")))
        .publisher(idempotency::outbox::LoggingPublisher::new())
        .build(pool)
        .await
        .unwrap();
    // A bound far above any wait for a pooled connection here: a failure is the database's.
    let check = idempotency
        .health_check()
        .with_timeout(Duration::from_secs(30));
    let runs = AtomicUsize::new(0);
    let checks = AtomicUsize::new(0);
    let checking = async {
        let checkers = (0..CHECKERS).map(|_| async {
            let mut failures = Vec::new();
            for _ in 0..CHECKS {
                let health = check.check().await;
                checks.fetch_add(1, Ordering::SeqCst);
                if health.database.status != idempotency::health::Status::Up {
                    failures.push(health.database.error.unwrap_or_default());
                }
            }
            failures
        });
        futures_util::future::join_all(checkers).await
    };
    let writing = async {
        let writers = (0..WRITERS).map(|_| async {
            while checks.load(Ordering::SeqCst) < CHECKERS * CHECKS {
                assert_eq!(run(&idempotency, &unique(), &runs).await, 7);
            }
        });
        futures_util::future::join_all(writers).await
    };
    let (failures, _) = tokio::join!(checking, writing);
    let failures: Vec<String> = failures.into_iter().flatten().collect();
    assert!(
        runs.load(Ordering::SeqCst) > 0,
        "no request ran beside the checks"
    );
    assert!(
        failures.is_empty(),
        "{} of {} health checks found the database down; the first: {:?}",
        failures.len(),
        CHECKERS * CHECKS,
        failures.iter().take(3).collect::<Vec<_>>()
    );
    idempotency.shutdown().await;
}
