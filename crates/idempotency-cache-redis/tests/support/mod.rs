//! Helpers of the integration tests on real Redis, moka and PostgreSQL.

#![allow(dead_code, clippy::unwrap_used)] // each test file uses some; tests fail loudly

use std::time::Duration;

use idempotency_cache_moka::LocalCacheConfig;
use idempotency_cache_moka::MokaCache;
use idempotency_cache_redis::DistributedCacheConfig;
use idempotency_cache_redis::RedisCache;
use idempotency_cache_redis::fred::prelude::{ClientLike, KeysInterface};
use idempotency_core::{
    Call, DistributedCache, Error, ExecutionResult, IdempotencyKey, IdempotencyService, LocalCache,
    Operation, Outcome, RecordId, Scope,
};
use idempotency_pg::PgStore;
use sqlx::PgPool;

pub(crate) async fn redis(config: DistributedCacheConfig) -> RedisCache {
    let config = DistributedCacheConfig {
        key_prefix: format!("{}:", idempotency_testing::unique_name("it")),
        timeout: Duration::from_secs(2),
        ..config
    };
    let cache = RedisCache::connect(&idempotency_testing::redis_url(), &config).unwrap();
    tokio::time::timeout(Duration::from_secs(10), cache.client().wait_for_connect())
        .await
        .unwrap_or_else(|_| {
            panic!(
                "Redis at {} did not answer; start it or set REDIS_URL",
                idempotency_testing::redis_url()
            )
        })
        .unwrap();
    cache
}

pub(crate) fn moka() -> MokaCache {
    MokaCache::new(&LocalCacheConfig {
        statistics: true,
        ..Default::default()
    })
}

pub(crate) async fn store() -> (PgPool, PgStore) {
    let pool = idempotency_testing::pg_pool().await;
    let store = PgStore::new(pool.clone());
    store.create_schema().await.unwrap();
    (pool, store)
}

pub(crate) fn id(op: &str, scope: &str, key: &str) -> RecordId {
    RecordId::new(
        Operation::new(op).unwrap(),
        Scope::new(scope).unwrap(),
        IdempotencyKey::new(key).unwrap(),
    )
}

pub(crate) async fn pay<L: LocalCache, D: DistributedCache>(
    service: &IdempotencyService<PgStore, L, D>,
    key: &str,
    amount: i64,
) -> Outcome<serde_json::Value> {
    service
        .execute(
            Call::new("PAY", IdempotencyKey::new(key).unwrap(), &amount),
            async |_c| {
                if amount > 1000 {
                    return Ok(ExecutionResult::rejected_with(
                        "INSUFFICIENT_FUNDS",
                        &serde_json::json!({"requested": amount}),
                    )
                    .unwrap());
                }
                Ok::<_, Error>(ExecutionResult::success(
                    serde_json::json!({"paid": amount}),
                ))
            },
        )
        .await
        .unwrap()
}

pub(crate) async fn in_redis(cache: &RedisCache, id: &RecordId) -> Option<String> {
    cache
        .client()
        .get(cache.key_for(id).as_str())
        .await
        .unwrap()
}

pub(crate) async fn wipe_store(pool: &PgPool) {
    sqlx::query("DELETE FROM idempotency_records")
        .execute(pool)
        .await
        .unwrap();
}

pub(crate) mod cluster;
