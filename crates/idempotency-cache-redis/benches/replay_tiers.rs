//! Replay latency and throughput of the same record from L1 (moka), L2 (Redis) and PostgreSQL,
//! in one run, next to the bare round trips they are compared with: a Redis GET and a
//! primary-key SELECT.
//!
//! Needs PostgreSQL and Redis (DATABASE_URL, REDIS_URL; see scripts/test.sh):
//! `cargo bench -p idempotency-cache-redis --bench replay_tiers`

use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use idempotency_cache_moka::LocalCacheConfig;
use idempotency_cache_moka::MokaCache;
use idempotency_cache_redis::DistributedCacheConfig;
use idempotency_cache_redis::RedisCache;
use idempotency_cache_redis::fred::prelude::{ClientLike, KeysInterface};
use idempotency_core::{
    Call, Error, ExecutionResult, IdempotencyKey, IdempotencyService, Level, Origin, Outcome,
};
use idempotency_pg::PgStore;
use idempotency_pg::sqlx;

fn request() -> serde_json::Value {
    serde_json::json!({"orderId": "o-bench", "recipient": "alice", "amount": "100.00"})
}

async fn replay<L, D>(
    service: &IdempotencyService<PgStore, L, D>,
    key: &IdempotencyKey,
    expected: Level,
) where
    L: idempotency_core::LocalCache,
    D: idempotency_core::DistributedCache,
{
    let body = request();
    let outcome: Outcome<serde_json::Value> = service
        .execute(
            Call::new("CREATE_PAYMENT", key.clone(), &body),
            async |_c| {
                Ok::<_, Error>(ExecutionResult::success(
                    serde_json::json!({"paymentId": "p-1"}),
                ))
            },
        )
        .await
        .expect("replay");
    assert_eq!(outcome.origin(), Origin::Replayed { from: expected });
}

fn tiers(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let (pool, store, key, l1, l2, redis) = runtime.block_on(async {
        let pool = idempotency_testing::pg_pool().await;
        let store = PgStore::new(pool.clone());
        store.create_schema().await.expect("schema");
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
        redis.client().wait_for_connect().await.expect("redis up");
        let l1 = MokaCache::new(&LocalCacheConfig::default());
        let key = IdempotencyKey::new("bench-key").expect("key");
        let all = IdempotencyService::builder(store.clone())
            .local_cache(l1.clone())
            .distributed_cache(redis.clone())
            .build();
        let body = request();
        let _: Outcome<serde_json::Value> = all
            .execute(
                Call::new("CREATE_PAYMENT", key.clone(), &body),
                async |_c| {
                    Ok::<_, Error>(ExecutionResult::success(
                        serde_json::json!({"paymentId": "p-1"}),
                    ))
                },
            )
            .await
            .expect("first execution");
        (pool, store, key, l1, redis.clone(), redis)
    });
    let from_l1 = IdempotencyService::builder(store.clone())
        .local_cache(l1)
        .build();
    let from_l2 = IdempotencyService::builder(store.clone())
        .distributed_cache(l2)
        .build();
    let lookup_first = idempotency_core::ServiceOptions {
        lookup_before_acquire: true,
        ..Default::default()
    };
    let from_pg = IdempotencyService::builder(store.clone())
        .config(lookup_first)
        .build();
    let from_pg_insert_first = IdempotencyService::new(store.clone());
    let redis_key = redis.key_for(&idempotency_core::RecordId::new(
        idempotency_core::Operation::new("CREATE_PAYMENT").expect("op"),
        idempotency_core::Scope::default(),
        key.clone(),
    ));

    let mut group = c.benchmark_group("replay");
    group.bench_function("moka (L1)", |b| {
        b.to_async(&runtime)
            .iter(|| replay(&from_l1, &key, Level::Local));
    });
    group.bench_function("redis (L2)", |b| {
        b.to_async(&runtime)
            .iter(|| replay(&from_l2, &key, Level::Distributed));
    });
    group.bench_function("postgres, lookup-before-acquire", |b| {
        b.to_async(&runtime)
            .iter(|| replay(&from_pg, &key, Level::Persistence));
    });
    group.bench_function("postgres, insert-first", |b| {
        b.to_async(&runtime)
            .iter(|| replay(&from_pg_insert_first, &key, Level::Persistence));
    });
    group.bench_function("baseline: bare redis GET", |b| {
        b.to_async(&runtime).iter(|| async {
            let value: Option<String> = redis.client().get(redis_key.as_str()).await.expect("get");
            assert!(value.is_some());
        });
    });
    group.bench_function("baseline: bare primary-key SELECT", |b| {
        b.to_async(&runtime).iter(|| async {
            let row: Option<(String,)> = sqlx::query_as(
                "SELECT result_payload::text FROM idempotency_records \
                 WHERE operation = $1 AND scope = $2 AND idempotency_key = $3",
            )
            .bind("CREATE_PAYMENT")
            .bind("")
            .bind("bench-key")
            .fetch_optional(&pool)
            .await
            .expect("select");
            assert!(row.is_some());
        });
    });
    group.finish();
}

criterion_group!(benches, tiers);
criterion_main!(benches);
