//! The futures of `execute` and `execute_optimistic` stay small with the full stack (PostgreSQL,
//! moka, Redis, metrics). A future that awaits a pooled connection or a Redis command inline
//! carries that callee's whole state: sqlx's pool acquire is about 8.5 KiB and a fred command
//! about 5 KiB, and a handler's future, which axum moves into a box per request, grew to 11.5
//! KiB that way, copied and allocated for every replay too. The service and the Redis cache keep
//! those callees on the heap, awaited only when they run.
//!
//! Nothing here connects: the pool is lazy, the futures are built and dropped, never polled.

#![allow(clippy::unwrap_used)]

use std::mem::size_of_val;

use idempotency::moka::{LocalCacheConfig, MokaCache};
use idempotency::postgres::PgStore;
use idempotency::redis::fred::prelude::Builder as RedisBuilder;
use idempotency::redis::{CacheSecret, DistributedCacheConfig, RedisCache};
use idempotency::{Call, ExecutionResult, IdempotencyKey, IdempotencyService, Meters, Service};
use sqlx::postgres::PgPoolOptions;

/// Above this, a future is copying kilobytes per call that its path never uses.
const BOUND: usize = 4096;

fn service() -> Service<PgStore> {
    let pool = PgPoolOptions::new()
        .connect_lazy("postgres://postgres@127.0.0.1:5432/never")
        .unwrap();
    let client = RedisBuilder::default_centralized().build().unwrap();
    IdempotencyService::builder(PgStore::new(pool))
        .local_cache(Some(MokaCache::new(&LocalCacheConfig::default())))
        .distributed_cache(Some(
            RedisCache::new(
                client,
                &DistributedCacheConfig {
                    secret: Some(CacheSecret::new("tests-only-secret-0123456789abcdef").unwrap()),
                    ..DistributedCacheConfig::default()
                },
            )
            .unwrap(),
        ))
        .metrics(Meters::default())
        .build()
}

#[tokio::test]
async fn execute_futures_stay_small() {
    let service = service();
    let request = serde_json::json!({"amount": 10});
    let call = || Call::new("OP", IdempotencyKey::new("k").unwrap(), &request);
    let action = async |_conn: &mut sqlx::PgConnection| {
        Ok::<_, idempotency::core::Error>(ExecutionResult::success(1_u32))
    };

    let execute = service.execute(call(), action);
    let size = size_of_val(&execute);
    assert!(size <= BOUND, "execute's future is {size} bytes");
    drop(execute);

    let optimistic = service.execute_optimistic(call(), action);
    let size = size_of_val(&optimistic);
    assert!(size <= BOUND, "execute_optimistic's future is {size} bytes");
    drop(optimistic);

    let begin = service.begin();
    let size = size_of_val(&begin);
    assert!(size <= BOUND, "begin's future is {size} bytes");
}
