//! Redis stopped and Redis hanging: fail-open stays fast and correct, fail-fast refuses before
//! the action runs, and the circuit breaker opens.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use idempotency_cache_redis::{BreakerState, RedisCache};
use idempotency_cache_redis::{CircuitBreakerConfig, DistributedCacheConfig};
use idempotency_core::{
    CacheError, Call, DistributedCache, Error, ExecutionResult, FailurePolicy, IdempotencyKey,
    IdempotencyService, Level, Operation, Origin, Outcome, RecordId, Scope,
};
use idempotency_pg::PgStore;
use support::hanging_url;
use support::timed::Timed;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

const TIMEOUT: Duration = Duration::from_millis(50);
/// Lateness a loaded machine may add to a timer (a tokio timer firing late, a descheduled
/// test thread): a call bounded by its timeout ends within `TIMEOUT + SLACK`; a call that hangs
/// on Redis never ends.
const SLACK: Duration = Duration::from_millis(450);

fn config(policy: FailurePolicy) -> DistributedCacheConfig {
    DistributedCacheConfig {
        failure_policy: policy,
        timeout: TIMEOUT,
        circuit_breaker: CircuitBreakerConfig {
            failure_threshold: 5,
            cool_down: Duration::from_secs(30),
        },
        secret: Some(support::secret()),
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

/// A proxy to the real Redis that holds every byte, as a hanging Redis does, until `true` is sent
/// on the returned channel: then Redis answers again, on the same connections.
async fn hanging_then_redis_url() -> (String, watch::Sender<bool>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (back, is_back) = watch::channel(false);
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let mut is_back = is_back.clone();
            tokio::spawn(async move {
                if is_back.wait_for(|back| *back).await.is_ok() {
                    forward_to_redis(socket).await;
                }
            });
        }
    });
    (format!("redis://127.0.0.1:{port}"), back)
}

async fn forward_to_redis(mut socket: TcpStream) {
    let url = idempotency_testing::redis_url();
    let rest = url.split_once("://").map_or(url.as_str(), |(_, rest)| rest);
    let authority = rest.split('/').next().unwrap();
    let address = authority.rsplit('@').next().unwrap();
    let mut redis = TcpStream::connect(address).await.unwrap();
    let _ = tokio::io::copy_bidirectional(&mut socket, &mut redis).await;
}

async fn store() -> PgStore {
    let store = PgStore::new(idempotency_testing::pg_pool().await);
    store.create_schema().await.unwrap();
    store
}

async fn pay<D: DistributedCache>(
    service: &IdempotencyService<PgStore, idempotency_core::NoCache, D>,
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
    let timed = Timed::new(cache.clone());
    let service = IdempotencyService::builder(store().await)
        .distributed_cache(timed.clone())
        .build();
    let runs = AtomicUsize::new(0);
    // The cache's share of a request: each call ends at its timeout. The whole request also
    // waits for PostgreSQL, which a checkpoint on a shared machine can stall for half a second:
    // its bound only tells a request that hangs on Redis from one that does not.
    let call_bound = TIMEOUT + SLACK;
    let request_bound = TIMEOUT * 2 + Duration::from_secs(2);
    let mut slowest = Duration::ZERO;
    for i in 0..100 {
        let started = Instant::now();
        let outcome = pay(&service, &format!("h{i}"), &runs).await.unwrap();
        let took = started.elapsed();
        let call = timed.take_slowest();
        assert!(outcome.is_executed());
        slowest = slowest.max(took);
        assert!(
            call < call_bound,
            "request {i}: a cache call took {call:?}; bound {call_bound:?}"
        );
        assert!(
            took < request_bound,
            "request {i} took {took:?}; bound {request_bound:?}"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 100);
    assert_eq!(cache.breaker_state(), BreakerState::Open);
    assert_eq!(cache.write_breaker_state(), BreakerState::Open);
    let stats = cache.stats();
    assert_eq!(
        stats.timeouts, 10,
        "each breaker (reads, the writes after commit) opened after five timeouts: {stats:?}"
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
        assert!(started.elapsed() < TIMEOUT + SLACK);
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

/// A trial call dropped by its caller (client gone, an outer timeout, a `select!`) never reports
/// its outcome; the breaker must not wait for it forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_trial_call_does_not_keep_the_breaker_half_open() {
    let cool_down = Duration::from_millis(200);
    let config = DistributedCacheConfig {
        key_prefix: format!("{}:", idempotency_testing::unique_name("trial")),
        failure_policy: FailurePolicy::FailFast,
        timeout: TIMEOUT,
        circuit_breaker: CircuitBreakerConfig {
            failure_threshold: 1,
            cool_down,
        },
        secret: Some(support::secret()),
        ..Default::default()
    };
    let (url, redis_back) = hanging_then_redis_url().await;
    let cache = RedisCache::connect(&url, &config).unwrap();
    let id = RecordId::new(
        Operation::new("PAY").unwrap(),
        Scope::default(),
        IdempotencyKey::new("trial").unwrap(),
    );
    let error = cache.get(&id).await.unwrap_err();
    assert!(matches!(error, CacheError::Timeout(_)), "{error:?}");
    assert_eq!(cache.breaker_state(), BreakerState::Open);

    tokio::time::sleep(cool_down + Duration::from_millis(20)).await;
    assert!(
        cache.get(&id).now_or_never().is_none(),
        "the trial call hangs"
    ); // ... and is dropped by its caller before it reports

    redis_back.send(true).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut last = cache.get(&id).await;
    while last.is_err() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        last = cache.get(&id).await;
    }
    assert!(
        matches!(last, Ok(None)),
        "the breaker never let a call through again: {last:?}, {:?}",
        cache.breaker_state()
    );
    assert_eq!(cache.breaker_state(), BreakerState::Closed { failures: 0 });

    let service = IdempotencyService::builder(store().await)
        .distributed_cache(cache)
        .build();
    let runs = AtomicUsize::new(0);
    assert!(
        pay(&service, "after-trial", &runs)
            .await
            .unwrap()
            .is_executed()
    );
}

/// A cluster URL whose nodes all refuse connections is a start-up error naming the URL, at once,
/// not a client that waits for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_url_that_names_no_reachable_node_is_a_startup_error() {
    let first = dead_url().await.replace("redis://", "");
    let second = dead_url().await.replace("redis://", "");
    let url = format!("redis-cluster://user:secret@{first},{second}");
    let started = Instant::now();
    let error = RedisCache::connect(&url, &config(FailurePolicy::FailOpen)).unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let message = error.to_string();
    assert!(
        matches!(error, idempotency_cache_redis::Error::Unreachable { .. }),
        "{error:?}"
    );
    assert!(
        message.contains(&first) && message.contains(&second),
        "{message}"
    );
    assert!(
        !message.contains("secret"),
        "the password leaked: {message}"
    );
}
