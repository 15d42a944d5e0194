//! Redis stopped and Redis hanging: fail-open stays fast and correct, fail-fast refuses before
//! the action runs, and the circuit breaker opens.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use idempotency_cache_redis::{BreakerState, RedisCache};
use idempotency_core::config::{CircuitBreakerConfig, DistributedCacheConfig};
use idempotency_core::{
    CacheError, Call, Error, ExecutionResult, FailurePolicy, IdempotencyKey, IdempotencyService,
    Level, Origin, Outcome,
};
use idempotency_pg::PgStore;
use tokio::net::TcpListener;

const TIMEOUT: Duration = Duration::from_millis(50);

fn config(policy: FailurePolicy) -> DistributedCacheConfig {
    DistributedCacheConfig {
        failure_policy: policy,
        timeout: TIMEOUT,
        circuit_breaker: CircuitBreakerConfig {
            failure_threshold: 5,
            cool_down: Duration::from_secs(30),
        },
        ..Default::default()
    }
}

/// A port where nothing listens.
async fn dead_url() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    format!("redis://127.0.0.1:{port}")
}

/// A server that accepts connections and never answers.
async fn hanging_url() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    format!("redis://127.0.0.1:{port}")
}

async fn store() -> PgStore {
    let store = PgStore::new(idempotency_testing::pg_pool().await);
    store.create_schema().await.unwrap();
    store
}

async fn pay(
    service: &IdempotencyService<PgStore, idempotency_core::NoCache, RedisCache>,
    key: &str,
    runs: &AtomicUsize,
) -> Result<Outcome<u32>, Error> {
    service
        .execute(
            Call::new("PAY", IdempotencyKey::new(key).unwrap(), &1),
            async |_c| {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok(ExecutionResult::success(1))
            },
        )
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stopped_fail_open_requests_succeed() {
    let cache = RedisCache::connect(&dead_url().await, &config(FailurePolicy::FailOpen)).unwrap();
    let service = IdempotencyService::builder(store().await)
        .distributed_cache(cache.clone())
        .build();
    let runs = AtomicUsize::new(0);
    assert!(pay(&service, "a", &runs).await.unwrap().is_executed());
    let replay = pay(&service, "a", &runs).await.unwrap();
    assert_eq!(
        replay.origin(),
        Origin::Replayed {
            from: Level::Persistence
        }
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let stats = cache.stats();
    assert!(stats.errors + stats.timeouts >= 3, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stopped_fail_fast_refuses_before_the_action() {
    let cache = RedisCache::connect(&dead_url().await, &config(FailurePolicy::FailFast)).unwrap();
    let service = IdempotencyService::builder(store().await)
        .distributed_cache(cache)
        .build();
    let runs = AtomicUsize::new(0);
    let error = pay(&service, "b", &runs).await.unwrap_err();
    assert!(matches!(error, Error::Cache(_)), "{error:?}");
    assert!(error.is_retryable());
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "the action ran although the cache failed fast"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_hanging_fail_open_is_bounded_and_the_breaker_opens() {
    let cache =
        RedisCache::connect(&hanging_url().await, &config(FailurePolicy::FailOpen)).unwrap();
    let service = IdempotencyService::builder(store().await)
        .distributed_cache(cache.clone())
        .build();
    let runs = AtomicUsize::new(0);
    let bound = TIMEOUT * 2 + Duration::from_millis(100);
    let mut slowest = Duration::ZERO;
    for i in 0..100 {
        let started = Instant::now();
        let outcome = pay(&service, &format!("h{i}"), &runs).await.unwrap();
        let took = started.elapsed();
        assert!(outcome.is_executed());
        slowest = slowest.max(took);
        assert!(took < bound, "request {i} took {took:?}; bound {bound:?}");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 100);
    assert_eq!(cache.breaker_state(), BreakerState::Open);
    let stats = cache.stats();
    assert_eq!(
        stats.timeouts, 5,
        "the breaker opened after five timeouts: {stats:?}"
    );
    assert!(
        stats.short_circuited >= 190,
        "later calls never reached Redis: {stats:?}"
    );
    eprintln!("slowest request with a hanging Redis: {slowest:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_hanging_fail_fast_answers_within_the_timeout() {
    let cache =
        RedisCache::connect(&hanging_url().await, &config(FailurePolicy::FailFast)).unwrap();
    let service = IdempotencyService::builder(store().await)
        .distributed_cache(cache)
        .build();
    let runs = AtomicUsize::new(0);
    for i in 0..10 {
        let started = Instant::now();
        let error = pay(&service, &format!("f{i}"), &runs).await.unwrap_err();
        assert!(started.elapsed() < TIMEOUT + Duration::from_millis(100));
        let Error::Cache(cause) = &error else {
            panic!("{error:?}")
        };
        assert!(
            matches!(cause, CacheError::Timeout(_) | CacheError::CircuitOpen),
            "{cause:?}"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}
