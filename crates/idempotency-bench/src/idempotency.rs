//! Idempotency scenarios: the business transaction alone, the same SQL the library issues
//! (taken from the store itself, not copied), the library (first executions in both modes,
//! replays from each tier), and concurrent duplicates.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use idempotency_cache_moka::LocalCacheConfig;
use idempotency_cache_moka::MokaCache;
use idempotency_cache_redis::DistributedCacheConfig;
use idempotency_cache_redis::RedisCache;
use idempotency_cache_redis::fred::prelude::{ClientLike, KeysInterface};
use idempotency_core::{
    Call, Error, ExecutionResult, IdempotencyKey, IdempotencyService, Level, Operation, Origin,
    Outcome, RecordId, Scope, ServiceOptions,
};
use idempotency_pg::PgStore;
use sqlx::{self, AssertSqlSafe, PgConnection, PgPool};

use crate::harness::{Measurement, Op, Scenario, op, run_interleaved};
use crate::pgbench::{Param, Pgbench, bind};

/// A timestamp column.
type Ts = sqlx::types::chrono::DateTime<sqlx::types::chrono::Utc>;
/// The columns `complete` returns.
type CompleteRow = (String, Ts, Option<Ts>, Option<Ts>);
/// The columns `insert_completed_bounded` returns.
type InsertedRow = (Option<Ts>, Option<Ts>, Option<Ts>, String);
/// The columns `find` returns.
type FindRow = (
    String,
    String,
    Option<String>,
    Option<String>,
    Ts,
    Option<Ts>,
    Option<Ts>,
);

const HASH: &str = "5f2b1c0e0a7d4e8b9c3a6f1d2e4b7a8c9d0e1f2a3b4c5d6e7f8091a2b3c4d5e6";
/// The service's default in-flight budget, as the bounded statements receive it.
const LOCK_BUDGET: &str = "10000ms";

fn ttl() -> sqlx::postgres::types::PgInterval {
    sqlx::postgres::types::PgInterval {
        months: 0,
        days: 365,
        microseconds: 0,
    }
}

pub(crate) async fn insert_payment(
    conn: &mut PgConnection,
    order: &str,
) -> Result<i64, sqlx::Error> {
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

fn request(order: &str) -> serde_json::Value {
    serde_json::json!({"orderId": order, "recipient": "alice", "amount": "100.00"})
}

#[derive(Debug, thiserror::Error)]
enum BenchError {
    #[error(transparent)]
    Idempotency(#[from] Error),
    #[error(transparent)]
    Sql(#[from] sqlx::Error),
}

/// Everything the scenarios need, set up once: an isolated schema, the business table, Redis.
pub(crate) struct Setup {
    pub(crate) pool: PgPool,
    pub(crate) store: PgStore,
    redis: RedisCache,
    pub(crate) run: u64,
    /// The schema that holds the store's and the business table.
    pub(crate) schema: String,
    /// pgbench on the same schema, when it is installed.
    pub(crate) pgbench: Option<Pgbench>,
}

impl Setup {
    pub(crate) async fn new(clients: u64) -> Self {
        let pool = crate::pool::postgres(u32::try_from(clients).unwrap_or(64) + 8).await;
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
                secret: Some(
                    idempotency_cache_redis::CacheSecret::new("bench-only-secret-0123456789abcdef")
                        .expect("secret"),
                ),
                ..Default::default()
            },
        )
        .expect("redis");
        redis.client().wait_for_connect().await.expect("redis");
        let schema: String = sqlx::query_scalar("SELECT current_schema()::text")
            .fetch_one(&pool)
            .await
            .expect("schema name");
        let pgbench = Pgbench::find(&idempotency_testing::database_url(), &schema);
        Self {
            pool,
            store,
            redis,
            run: u64::from(std::process::id()),
            schema,
            pgbench,
        }
    }

    fn statement(&self, name: &str) -> AssertSqlSafe<String> {
        AssertSqlSafe(
            self.store
                .statement(name)
                .expect("known statement")
                .to_owned(),
        )
    }
}

/// First executions: the business transaction alone, the same SQL as each mode issued directly,
/// and each mode through the library.
pub(crate) fn first_executions(setup: &Setup, clients: u64) -> Vec<Scenario> {
    let run = setup.run;
    let pool = setup.pool.clone();
    let baseline = op(move |c, i| {
        let pool = pool.clone();
        async move {
            let mut tx = pool.begin().await.expect("begin");
            insert_payment(&mut tx, &format!("o-{c}-{i}"))
                .await
                .expect("insert");
            tx.commit().await.expect("commit");
        }
    });

    let (pool, acquire, complete) = (
        setup.pool.clone(),
        setup.statement("acquire_bounded"),
        setup.statement("complete"),
    );
    let direct_claim = op(move |c, i| {
        let (pool, acquire, complete) = (pool.clone(), acquire.0.clone(), complete.0.clone());
        async move {
            let key = format!("direct-{run}-{c}-{i}");
            let mut tx = pool.begin().await.expect("begin");
            let _: (i64, String) = sqlx::query_as(AssertSqlSafe(acquire))
                .bind("PAY")
                .bind("")
                .bind(&key)
                .bind(HASH)
                .bind(ttl())
                .bind(LOCK_BUDGET)
                .fetch_one(&mut *tx)
                .await
                .expect("acquire");
            let id = insert_payment(&mut tx, &key).await.expect("insert");
            let _: Option<CompleteRow> = sqlx::query_as(AssertSqlSafe(complete))
                .bind("PAY")
                .bind("")
                .bind(&key)
                .bind("COMPLETED")
                .bind(payment_body(id, &key).to_string())
                .bind(None::<&str>) // error code
                .bind(None::<&str>) // trace id
                .bind(None::<&str>) // span id
                .fetch_optional(&mut *tx)
                .await
                .expect("complete");
            tx.commit().await.expect("commit");
        }
    });

    let (pool, insert) = (
        setup.pool.clone(),
        setup.statement("insert_completed_bounded"),
    );
    let direct_optimistic = op(move |c, i| {
        let (pool, insert) = (pool.clone(), insert.0.clone());
        async move {
            let key = format!("direct-opt-{run}-{c}-{i}");
            let mut tx = pool.begin().await.expect("begin");
            let id = insert_payment(&mut tx, &key).await.expect("insert");
            let _: Option<InsertedRow> = sqlx::query_as(AssertSqlSafe(insert))
                .bind("PAY")
                .bind("")
                .bind(&key)
                .bind(HASH)
                .bind("COMPLETED")
                .bind(payment_body(id, &key).to_string())
                .bind(None::<&str>) // error code
                .bind(ttl())
                .bind(None::<&str>) // trace id
                .bind(None::<&str>) // span id
                .bind(LOCK_BUDGET)
                .fetch_optional(&mut *tx)
                .await
                .expect("insert completed");
            tx.commit().await.expect("commit");
        }
    });

    let service = IdempotencyService::new(setup.store.clone());
    let mut scenarios = vec![
        Scenario::new("baseline: business transaction", clients, baseline),
        Scenario::new(
            "direct SQL: claim, business, complete",
            clients,
            direct_claim,
        ),
        Scenario::new(
            "execute: first execution",
            clients,
            first_execution(service.clone(), run, false),
        ),
        Scenario::new(
            "direct SQL: business, insert completed",
            clients,
            direct_optimistic,
        ),
        Scenario::new(
            "execute_optimistic: first execution",
            clients,
            first_execution(service, run, true),
        ),
    ];
    if let Some(pgbench) = &setup.pgbench {
        scenarios.extend(pgbench_first_executions(setup, pgbench, clients));
    }
    scenarios
}

/// pgbench's fresh `key` per transaction (it binds the integer as text).
pub(crate) const PGBENCH_KEY: &str = "\\set key random(1, 1000000000000000)";

/// pgbench's business insert, the statement of [`insert_payment`] with the variable `key`.
pub(crate) const PGBENCH_BUSINESS: &str =
    "INSERT INTO bench_payments (order_id, amount) VALUES (:key, 100.00) RETURNING id;";

/// The pgbench scenario of the claim-first transaction in 3 round trips (pipelined), named
/// without its `pgbench: ` prefix.
pub(crate) const PIPELINED: &str = "claim, business, complete, pipelined in 3 round trips";

/// The same three transactions as the baseline and the two direct-SQL scenarios, run by
/// pgbench: the business insert alone, then the store's own statements around it.
fn pgbench_first_executions(setup: &Setup, pgbench: &Pgbench, clients: u64) -> Vec<Scenario> {
    use Param::{Sql, Var};
    const NULL: Param = Sql("NULL");
    const EMPTY: Param = Sql("''");
    let (key, business) = (PGBENCH_KEY, PGBENCH_BUSINESS);
    let acquire = bind(
        &setup.statement("acquire_bounded").0,
        &[
            Var("op"),
            EMPTY,
            Var("key"),
            Var("hash"),
            Var("ttl"),
            Var("budget"),
        ],
    );
    let complete = bind(
        &setup.statement("complete").0,
        &[
            Var("op"),
            EMPTY,
            Var("key"),
            Var("status"),
            Var("payload"),
            NULL,
            NULL,
            NULL,
        ],
    );
    let insert_completed = bind(
        &setup.statement("insert_completed_bounded").0,
        &[
            Var("op"),
            EMPTY,
            Var("key"),
            Var("hash"),
            Var("status"),
            Var("payload"),
            NULL,
            Var("ttl"),
            NULL,
            NULL,
            Var("budget"),
        ],
    );
    let defines = || {
        vec![
            ("op", "PAY".to_owned()),
            ("hash", HASH.to_owned()),
            ("ttl", "365 days".to_owned()),
            ("budget", LOCK_BUDGET.to_owned()),
            ("status", "COMPLETED".to_owned()),
            ("payload", payment_body(1, "pgbench").to_string()),
        ]
    };
    vec![
        pgbench.scenario(
            "business transaction",
            clients,
            format!("{key}\nBEGIN;\n{business}\nCOMMIT;\n"),
            defines(),
        ),
        pgbench.scenario(
            "claim, business, complete",
            clients,
            format!("{key}\nBEGIN;\n{acquire};\n{business}\n{complete};\nCOMMIT;\n"),
            defines(),
        ),
        pgbench.scenario(
            "business, insert completed",
            clients,
            format!("{key}\nBEGIN;\n{business}\n{insert_completed};\nCOMMIT;\n"),
            defines(),
        ),
        // What a client that pipelines would get (sqlx cannot): `BEGIN` sent with the claim,
        // `COMMIT` with the completion, 3 round trips instead of 5. Both pairs are the
        // library's own statements; the completion always finds the row its claim locked.
        pgbench.scenario(
            PIPELINED,
            clients,
            format!(
                "{key}\n\\startpipeline\nBEGIN;\n{acquire};\n\\endpipeline\n{business}\n\\startpipeline\n{complete};\nCOMMIT;\n\\endpipeline\n"
            ),
            defines(),
        ),
    ]
}

fn first_execution(service: IdempotencyService<PgStore>, run: u64, optimistic: bool) -> Op {
    op(move |c, i| {
        let service = service.clone();
        let key = IdempotencyKey::new(format!(
            "{}-{run}-{c}-{i}",
            if optimistic { "opt" } else { "exec" }
        ))
        .expect("key");
        async move {
            let body = request(key.as_str());
            let call = Call::new("PAY", key.clone(), &body);
            let action = async |conn: &mut PgConnection| {
                let id = insert_payment(conn, key.as_str()).await?;
                Ok::<_, BenchError>(ExecutionResult::success(payment_body(id, key.as_str())))
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

/// Replays of one stored record from each tier, next to the bare round trip each is compared
/// with. Latency pairs run with one client, throughput with `clients`.
pub(crate) async fn replays(setup: &Setup, clients: u64) -> Vec<Scenario> {
    let key = IdempotencyKey::new(format!("replay-{}", setup.run)).expect("key");
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

    let lookup_first = ServiceOptions {
        lookup_before_acquire: true,
        ..Default::default()
    };
    let from_pg = IdempotencyService::builder(setup.store.clone())
        .config(lookup_first)
        .build();
    let from_pg_insert_first = IdempotencyService::new(setup.store.clone());
    let from_redis = IdempotencyService::builder(setup.store.clone())
        .distributed_cache(setup.redis.clone())
        .build();
    replay(from_redis.clone(), key.clone(), Level::Persistence)(0, 0).await; // fills Redis
    let from_moka = IdempotencyService::builder(setup.store.clone())
        .local_cache(MokaCache::new(&LocalCacheConfig::default()))
        .build();
    replay(from_moka.clone(), key.clone(), Level::Persistence)(0, 0).await; // fills moka

    let (pool, find, k) = (
        setup.pool.clone(),
        setup.statement("find"),
        key.as_str().to_owned(),
    );
    let bare_select = op(move |_, _| {
        let (pool, find, k) = (pool.clone(), find.0.clone(), k.clone());
        async move {
            let row: Option<FindRow> = sqlx::query_as(AssertSqlSafe(find))
                .bind("PAY")
                .bind("")
                .bind(&k)
                .fetch_optional(&pool)
                .await
                .expect("select");
            assert!(row.is_some());
        }
    });
    let redis = setup.redis.clone();
    let redis_key = redis.key_for(&RecordId::new(
        Operation::new("PAY").expect("op"),
        Scope::default(),
        key.clone(),
    ));
    let bare_get = op(move |_, _| {
        let (redis, k) = (redis.clone(), redis_key.clone());
        async move {
            let value: Option<String> = redis.client().get(k.as_str()).await.expect("get");
            assert!(value.is_some());
        }
    });

    vec![
        Scenario::new(
            "replay: postgres (lookup-before-acquire)",
            1,
            replay(from_pg.clone(), key.clone(), Level::Persistence),
        ),
        Scenario::new("bare: primary-key SELECT", 1, Arc::clone(&bare_select)),
        Scenario::new(
            "replay: redis",
            1,
            replay(from_redis.clone(), key.clone(), Level::Distributed),
        ),
        Scenario::new("bare: redis GET", 1, Arc::clone(&bare_get)),
        Scenario::new(
            "replay: moka",
            1,
            replay(from_moka.clone(), key.clone(), Level::Local),
        ),
        Scenario::new(
            format!("replay: postgres (lookup-before-acquire), {clients} clients"),
            clients,
            replay(from_pg, key.clone(), Level::Persistence),
        ),
        Scenario::new(
            format!("replay: postgres (insert-first), {clients} clients"),
            clients,
            replay(from_pg_insert_first, key.clone(), Level::Persistence),
        ),
        Scenario::new(
            format!("bare: primary-key SELECT, {clients} clients"),
            clients,
            bare_select,
        ),
        Scenario::new(
            format!("replay: redis, {clients} clients"),
            clients,
            replay(from_redis, key.clone(), Level::Distributed),
        ),
        Scenario::new(
            format!("bare: redis GET, {clients} clients"),
            clients,
            bare_get,
        ),
        Scenario::new(
            format!("replay: moka, {clients} clients"),
            clients,
            replay(from_moka, key, Level::Local),
        ),
    ]
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

/// Many clients on few keys: every 100 ms window, all clients share 4 fresh keys. Each key must
/// run exactly once; everything else replays (or waited and replayed).
pub(crate) async fn duplicates(setup: &Setup, clients: u64, duration: Duration) -> Measurement {
    let service = IdempotencyService::new(setup.store.clone());
    let executions = Arc::new(AtomicU64::new(0));
    let counted = Arc::clone(&executions);
    let run = setup.run;
    let scenario = Scenario::new(
        "concurrent duplicates (all clients on 4 keys per 100 ms)",
        clients,
        op(move |_, i| {
            let (service, counted) = (service.clone(), Arc::clone(&counted));
            let window = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() / 100)
                .unwrap_or_default();
            let key = IdempotencyKey::new(format!("dup-{run}-{window}-{}", i % 4)).expect("key");
            async move {
                let body = request(key.as_str());
                let _: Outcome<serde_json::Value> = service
                    .execute(Call::new("PAY", key.clone(), &body), async |conn| {
                        counted.fetch_add(1, Ordering::Relaxed);
                        let id = insert_payment(conn, key.as_str()).await?;
                        Ok::<_, BenchError>(ExecutionResult::success(payment_body(
                            id,
                            key.as_str(),
                        )))
                    })
                    .await
                    .expect("duplicate");
            }
        }),
    );
    let mut measured = run_interleaved(std::slice::from_ref(&scenario), duration, 1).await;
    let mut measurement = measured.remove(0);
    let distinct: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM idempotency_records WHERE idempotency_key LIKE $1",
    )
    .bind(format!("dup-{run}-%"))
    .fetch_one(&setup.pool)
    .await
    .expect("count");
    let ran = executions.load(Ordering::Relaxed);
    assert_eq!(
        i64::try_from(ran).unwrap_or(-1),
        distinct,
        "a key ran twice"
    );
    measurement.name = format!("{} [{distinct} keys, {ran} executions]", measurement.name);
    measurement
}
