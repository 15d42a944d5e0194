//! Idempotency scenarios: the business transaction alone, the same SQL the library issues, the
//! library itself (first executions and replays from each tier), concurrent duplicates.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use idempotency_cache_moka::MokaCache;
use idempotency_cache_redis::RedisCache;
use idempotency_cache_redis::fred::prelude::{ClientLike, KeysInterface};
use idempotency_core::config::{DistributedCacheConfig, LocalCacheConfig};
use idempotency_core::{
    Call, Error, ExecutionResult, IdempotencyKey, IdempotencyService, Level, Origin, Outcome,
    ServiceConfig,
};
use idempotency_pg::PgStore;
use idempotency_pg::sqlx::{self, PgConnection, PgPool};

use crate::harness::{Measurement, Op, measure, op};

/// The statements `PgStore` issues (see crates/idempotency-pg/src/store.rs), issued directly.
const ACQUIRE_BOUNDED: &str = "WITH cfg AS MATERIALIZED ( \
     SELECT current_setting('lock_timeout') AS previous, set_config('lock_timeout', $6, true) AS applied), \
 ins AS ( \
     INSERT INTO idempotency_records (operation, scope, idempotency_key, request_hash, status, created_at, expires_at) \
     SELECT $1, $2, $3, $4, 'PROCESSING', now(), now() + $5 FROM cfg \
     ON CONFLICT (operation, scope, idempotency_key) DO NOTHING RETURNING 1) \
 SELECT i.n, set_config('lock_timeout', cfg.previous, true) FROM cfg, (SELECT count(*) AS n FROM ins) AS i";
const COMPLETE: &str = "UPDATE idempotency_records SET status = $4, result_payload = $5::jsonb, error_code = $6, \
     completed_at = clock_timestamp() \
 WHERE operation = $1 AND scope = $2 AND idempotency_key = $3 AND status = 'PROCESSING' \
 RETURNING request_hash, created_at, completed_at, expires_at";
const INSERT_COMPLETED_BOUNDED: &str = "WITH cfg AS MATERIALIZED ( \
     SELECT current_setting('lock_timeout') AS previous, set_config('lock_timeout', $9, true) AS applied), \
 ins AS ( \
     INSERT INTO idempotency_records (operation, scope, idempotency_key, request_hash, status, \
         result_payload, error_code, created_at, completed_at, expires_at) \
     SELECT $1, $2, $3, $4, $5, $6::jsonb, $7, now(), clock_timestamp(), now() + $8 FROM cfg \
     ON CONFLICT (operation, scope, idempotency_key) DO NOTHING \
     RETURNING created_at, completed_at, expires_at) \
 SELECT ins.created_at, ins.completed_at, ins.expires_at, set_config('lock_timeout', cfg.previous, true) \
 FROM cfg LEFT JOIN ins ON true";
const FIND: &str = "SELECT request_hash, status, result_payload::text, error_code, created_at, completed_at, \
     expires_at FROM idempotency_records WHERE operation = $1 AND scope = $2 AND idempotency_key = $3";
/// A timestamp column.
type Ts = sqlx::types::chrono::DateTime<sqlx::types::chrono::Utc>;
/// The columns `complete` returns.
type CompleteRow = (String, Ts, Option<Ts>, Option<Ts>);

const HASH: &str = "5f2b1c0e0a7d4e8b9c3a6f1d2e4b7a8c9d0e1f2a3b4c5d6e7f8091a2b3c4d5e6";

fn ttl() -> sqlx::postgres::types::PgInterval {
    sqlx::postgres::types::PgInterval {
        months: 0,
        days: 365,
        microseconds: 0,
    }
}

async fn insert_payment(conn: &mut PgConnection, order: &str) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "INSERT INTO bench_payments (order_id, amount) VALUES ($1, 100.00) RETURNING id",
    )
    .bind(order)
    .fetch_one(conn)
    .await
}

fn payment_body(id: i64, order: &str) -> serde_json::Value {
    serde_json::json!({"paymentId": id, "orderId": order, "amount": "100.00", "status": "CONFIRMED"})
}

#[derive(Debug, thiserror::Error)]
enum BenchError {
    #[error(transparent)]
    Idempotency(#[from] Error),
    #[error(transparent)]
    Sql(#[from] sqlx::Error),
}

/// A fresh, unique key per (run, client, iteration).
fn key(prefix: &str, run: u64, client: u64, iteration: u64) -> IdempotencyKey {
    IdempotencyKey::new(format!("{prefix}-{run}-{client}-{iteration}")).expect("key")
}

static RUN: AtomicU64 = AtomicU64::new(0);

/// Everything the idempotency scenarios need, set up once.
pub(crate) struct Setup {
    pool: PgPool,
    store: PgStore,
    redis: RedisCache,
}

impl Setup {
    pub(crate) async fn new(clients: u64) -> Self {
        let pool =
            idempotency_testing::pg_pool_with(u32::try_from(clients).unwrap_or(64) + 4).await;
        let store = PgStore::new(pool.clone());
        store.create_schema().await.expect("schema");
        sqlx::raw_sql(
            "CREATE TABLE bench_payments (id bigserial PRIMARY KEY, order_id text NOT NULL, amount numeric(12,2) NOT NULL)",
        )
        .execute(&pool)
        .await
        .expect("business table");
        let redis = RedisCache::connect(
            &idempotency_testing::redis_url(),
            &DistributedCacheConfig {
                timeout: Duration::from_secs(1),
                key_prefix: format!("{}:", idempotency_testing::unique_name("bench")),
                ..Default::default()
            },
        )
        .expect("redis");
        redis.client().wait_for_connect().await.expect("redis");
        RUN.store(std::process::id().into(), Ordering::Relaxed);
        Self { pool, store, redis }
    }
}

/// Runs every idempotency scenario and returns the measurements in report order.
pub(crate) async fn run(setup: &Setup, clients: u64, duration: Duration) -> Vec<Measurement> {
    let mut out = Vec::new();
    let run_id = RUN.fetch_add(1, Ordering::Relaxed);
    let pool = setup.pool.clone();

    let p = pool.clone();
    out.push(
        measure(
            "baseline: business transaction",
            clients,
            duration,
            op(move |c, i| {
                let p = p.clone();
                async move {
                    let mut tx = p.begin().await.expect("begin");
                    insert_payment(&mut tx, &format!("o-{c}-{i}"))
                        .await
                        .expect("insert");
                    tx.commit().await.expect("commit");
                }
            }),
        )
        .await,
    );

    let p = pool.clone();
    out.push(
        measure(
            "direct SQL: claim, business, complete",
            clients,
            duration,
            op(move |c, i| {
                let p = p.clone();
                async move {
                    let k = format!("direct-{run_id}-{c}-{i}");
                    let mut tx = p.begin().await.expect("begin");
                    let _: (i64, String) = sqlx::query_as(ACQUIRE_BOUNDED)
                        .bind("PAY")
                        .bind("")
                        .bind(&k)
                        .bind(HASH)
                        .bind(ttl())
                        .bind("10000ms")
                        .fetch_one(&mut *tx)
                        .await
                        .expect("acquire");
                    let id = insert_payment(&mut tx, &k).await.expect("insert");
                    let _: Option<CompleteRow> = sqlx::query_as(COMPLETE)
                        .bind("PAY")
                        .bind("")
                        .bind(&k)
                        .bind("COMPLETED")
                        .bind(payment_body(id, &k).to_string())
                        .bind(None::<&str>)
                        .fetch_optional(&mut *tx)
                        .await
                        .expect("complete");
                    tx.commit().await.expect("commit");
                }
            }),
        )
        .await,
    );

    let service = IdempotencyService::new(setup.store.clone());
    out.push(
        measure(
            "execute: first execution",
            clients,
            duration,
            first_execution(service, run_id, false),
        )
        .await,
    );

    let p = pool.clone();
    out.push(
        measure(
            "direct SQL: business, insert completed",
            clients,
            duration,
            op(move |c, i| {
                let p = p.clone();
                async move {
                    let k = format!("direct-opt-{run_id}-{c}-{i}");
                    let mut tx = p.begin().await.expect("begin");
                    let id = insert_payment(&mut tx, &k).await.expect("insert");
                    type Row = (Option<Ts>, Option<Ts>, Option<Ts>, String);
                    let _: Option<Row> = sqlx::query_as(INSERT_COMPLETED_BOUNDED)
                        .bind("PAY")
                        .bind("")
                        .bind(&k)
                        .bind(HASH)
                        .bind("COMPLETED")
                        .bind(payment_body(id, &k).to_string())
                        .bind(None::<&str>)
                        .bind(ttl())
                        .bind("10000ms")
                        .fetch_optional(&mut *tx)
                        .await
                        .expect("insert completed");
                    tx.commit().await.expect("commit");
                }
            }),
        )
        .await,
    );

    let service = IdempotencyService::new(setup.store.clone());
    out.push(
        measure(
            "execute_optimistic: first execution",
            clients,
            duration,
            first_execution(service, run_id, true),
        )
        .await,
    );

    // Replays of one stored record, from each tier.
    let key = IdempotencyKey::new(format!("replay-{run_id}")).expect("key");
    let seeded: Outcome<serde_json::Value> = IdempotencyService::new(setup.store.clone())
        .execute(
            Call::new("PAY", key.clone(), &request("replay")),
            async |conn| {
                let id = insert_payment(conn, "replay").await?;
                Ok::<_, BenchError>(ExecutionResult::success(payment_body(id, "replay")))
            },
        )
        .await
        .expect("seed");
    assert!(seeded.is_executed());

    let lookup_first = ServiceConfig {
        lookup_before_acquire: true,
        ..Default::default()
    };
    let from_pg = IdempotencyService::builder(setup.store.clone())
        .config(lookup_first)
        .build();
    out.push(
        measure(
            "replay: postgres (lookup-before-acquire)",
            clients,
            duration,
            replay(from_pg, key.clone(), Level::Persistence),
        )
        .await,
    );
    let from_pg_insert_first = IdempotencyService::new(setup.store.clone());
    out.push(
        measure(
            "replay: postgres (insert-first)",
            clients,
            duration,
            replay(from_pg_insert_first, key.clone(), Level::Persistence),
        )
        .await,
    );

    let p = pool.clone();
    let k = key.as_str().to_owned();
    out.push(
        measure(
            "bare: primary-key SELECT",
            clients,
            duration,
            op(move |_, _| {
                let (p, k) = (p.clone(), k.clone());
                async move {
                    type Row = (
                        String,
                        String,
                        Option<String>,
                        Option<String>,
                        Ts,
                        Option<Ts>,
                        Option<Ts>,
                    );
                    let row: Option<Row> = sqlx::query_as(FIND)
                        .bind("PAY")
                        .bind("")
                        .bind(&k)
                        .fetch_optional(&p)
                        .await
                        .expect("select");
                    assert!(row.is_some());
                }
            }),
        )
        .await,
    );

    let from_redis = IdempotencyService::builder(setup.store.clone())
        .distributed_cache(setup.redis.clone())
        .build();
    // Fill Redis from the store once.
    replay(from_redis.clone(), key.clone(), Level::Persistence)(0, 0).await;
    out.push(
        measure(
            "replay: redis",
            clients,
            duration,
            replay(from_redis, key.clone(), Level::Distributed),
        )
        .await,
    );

    let redis = setup.redis.clone();
    let redis_key = redis.key_for(&idempotency_core::RecordId::new(
        idempotency_core::Operation::new("PAY").expect("op"),
        idempotency_core::Scope::default(),
        key.clone(),
    ));
    out.push(
        measure(
            "bare: redis GET",
            clients,
            duration,
            op(move |_, _| {
                let (redis, k) = (redis.clone(), redis_key.clone());
                async move {
                    let value: Option<String> = redis.client().get(k.as_str()).await.expect("get");
                    assert!(value.is_some());
                }
            }),
        )
        .await,
    );

    let from_moka = IdempotencyService::builder(setup.store.clone())
        .local_cache(MokaCache::new(&LocalCacheConfig::default()))
        .build();
    replay(from_moka.clone(), key.clone(), Level::Persistence)(0, 0).await;
    out.push(
        measure(
            "replay: moka",
            clients,
            duration,
            replay(from_moka, key, Level::Local),
        )
        .await,
    );

    // Many clients on few keys: every key runs once, everything else replays or waits.
    let service = IdempotencyService::new(setup.store.clone());
    let executions = Arc::new(AtomicU64::new(0));
    let counted = Arc::clone(&executions);
    let measurement = measure(
        "concurrent duplicates (4 keys per 100 ms)",
        clients,
        duration,
        op(move |_, i| {
            let (service, counted) = (service.clone(), Arc::clone(&counted));
            // all clients share the same few keys during each 100 ms window
            let window = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() / 100)
                .unwrap_or_default();
            let k = IdempotencyKey::new(format!("dup-{run_id}-{window}-{}", i % 4)).expect("key");
            async move {
                let body = request(k.as_str());
                let _: Outcome<serde_json::Value> = service
                    .execute(Call::new("PAY", k.clone(), &body), async |conn| {
                        counted.fetch_add(1, Ordering::Relaxed);
                        let id = insert_payment(conn, k.as_str()).await?;
                        Ok::<_, BenchError>(ExecutionResult::success(payment_body(id, k.as_str())))
                    })
                    .await
                    .expect("duplicate");
            }
        }),
    )
    .await;
    let distinct: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM idempotency_records WHERE idempotency_key LIKE $1",
    )
    .bind(format!("dup-{run_id}-%"))
    .fetch_one(&pool)
    .await
    .expect("count");
    let ran = executions.load(Ordering::Relaxed);
    let name = format!(
        "{} [{} keys, {} executions]",
        measurement.name, distinct, ran
    );
    assert_eq!(
        i64::try_from(ran).unwrap_or(-1),
        distinct,
        "a key ran twice"
    );
    out.push(Measurement {
        name,
        ..measurement
    });
    out
}

fn request(order: &str) -> serde_json::Value {
    serde_json::json!({"orderId": order, "recipient": "alice", "amount": "100.00"})
}

fn first_execution(service: IdempotencyService<PgStore>, run_id: u64, optimistic: bool) -> Op {
    op(move |c, i| {
        let service = service.clone();
        let prefix = if optimistic { "opt" } else { "exec" };
        let k = key(prefix, run_id, c, i);
        async move {
            let body = request(k.as_str());
            let call = Call::new("PAY", k.clone(), &body);
            let action = async |conn: &mut PgConnection| {
                let id = insert_payment(conn, k.as_str()).await?;
                Ok::<_, BenchError>(ExecutionResult::success(payment_body(id, k.as_str())))
            };
            let outcome: Outcome<serde_json::Value> = if optimistic {
                service.execute_optimistic(call, action).await
            } else {
                service.execute(call, action).await
            }
            .expect("execute");
            assert!(outcome.is_executed());
        }
    })
}

fn replay<L, D>(service: IdempotencyService<PgStore, L, D>, key: IdempotencyKey, from: Level) -> Op
where
    L: idempotency_core::LocalCache,
    D: idempotency_core::DistributedCache,
{
    op(move |_, _| {
        let (service, key) = (service.clone(), key.clone());
        async move {
            let body = request("replay");
            let outcome: Outcome<serde_json::Value> = service
                .execute(Call::new("PAY", key, &body), async |_conn| {
                    Ok::<_, Error>(ExecutionResult::success(serde_json::Value::Null))
                })
                .await
                .expect("replay");
            assert_eq!(outcome.origin(), Origin::Replayed { from });
        }
    })
}
