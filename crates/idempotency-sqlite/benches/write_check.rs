//! What the check before each store write costs on SQLite (`BEGIN`, refused inside the
//! caller's transaction), in one run next to what it is compared with:
//!
//! - `statement/begin refused` against `statement/select 1`: the check itself against the
//!   cheapest statement, both inside an open transaction;
//! - `transaction/execute` against `transaction/business only`: a first execution of
//!   `execute` (`BEGIN IMMEDIATE`, the check and the claim, the business insert, the check
//!   and the completion, `COMMIT`) against the business insert alone in its transaction.
//!
//! Needs nothing but a temporary directory: `cargo bench -p idempotency-sqlite --bench write_check`

use std::sync::atomic::{AtomicU64, Ordering};

use criterion::{Criterion, criterion_group, criterion_main};
use idempotency_core::{Call, Error, ExecutionResult, IdempotencyKey, IdempotencyService, Outcome};
use idempotency_sqlite::SqliteStore;
use sqlx::sqlite::SqlitePoolOptions;

async fn insert(conn: &mut sqlx::SqliteConnection, n: u64) {
    sqlx::query("INSERT INTO charges (reference) VALUES (?)")
        .bind(format!("c-{n}"))
        .execute(conn)
        .await
        .expect("insert");
}

fn write_check(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let path = std::env::temp_dir().join(format!("write-check-{}.db", std::process::id()));
    let path_text = path.to_str().expect("a UTF-8 temporary path").to_owned();
    let (pool, service) = runtime.block_on(async {
        let options = idempotency_sqlite::connect_options(&path_text).expect("options");
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(options)
            .await
            .expect("pool");
        let store = SqliteStore::new(pool.clone());
        store.create_schema().await.expect("schema");
        sqlx::raw_sql(
            "CREATE TABLE charges (id INTEGER PRIMARY KEY, reference TEXT NOT NULL UNIQUE)",
        )
        .execute(&pool)
        .await
        .expect("charges");
        (pool, IdempotencyService::new(store))
    });

    let mut statement = c.benchmark_group("statement");
    let mut tx = runtime.block_on(pool.begin()).expect("begin");
    statement.bench_function("select 1", |b| {
        b.iter(|| {
            runtime
                .block_on(sqlx::raw_sql("SELECT 1").execute(&mut *tx))
                .expect("select")
        });
    });
    statement.bench_function("begin refused", |b| {
        b.iter(|| {
            let refused = runtime.block_on(sqlx::raw_sql("BEGIN").execute(&mut *tx));
            assert!(refused.is_err(), "inside a transaction");
        });
    });
    runtime.block_on(tx.rollback()).expect("rollback");
    statement.finish();

    let next = AtomicU64::new(0);
    let mut transaction = c.benchmark_group("transaction");
    transaction.bench_function("business only", |b| {
        b.iter(|| {
            runtime.block_on(async {
                let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.expect("begin");
                insert(&mut tx, next.fetch_add(1, Ordering::Relaxed)).await;
                tx.commit().await.expect("commit");
            });
        });
    });
    transaction.bench_function("execute", |b| {
        b.iter(|| {
            runtime.block_on(async {
                let n = next.fetch_add(1, Ordering::Relaxed);
                let key = IdempotencyKey::new(format!("k-{n}")).expect("key");
                let outcome: Outcome<()> = service
                    .execute(Call::new("CHARGE", key, &n), async |conn| {
                        insert(conn, n).await;
                        Ok::<_, Error>(ExecutionResult::success(()))
                    })
                    .await
                    .expect("execute");
                assert!(outcome.is_executed());
            });
        });
    });
    transaction.finish();
    runtime.block_on(pool.close());
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{path_text}{suffix}"));
    }
}

criterion_group!(benches, write_check);
criterion_main!(benches);
