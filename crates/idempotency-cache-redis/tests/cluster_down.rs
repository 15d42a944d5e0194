//! A Redis Cluster in `cluster_state:fail` (two of its three masters dead, so no replica can be
//! elected): fail-open serves from PostgreSQL within the timeout, fail-fast refuses before the
//! action; when the masters come back, both serve from L2 again by themselves.
//!
//! The test owns its six-node cluster (its own ports, see `support::cluster`).

#![allow(clippy::unwrap_used, clippy::print_stderr)] // tests fail loudly; the figures go to stderr

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use idempotency_cache_redis::fred::prelude::ClientLike;
use idempotency_cache_redis::{BreakerState, RedisCache};
use idempotency_cache_redis::{CircuitBreakerConfig, DistributedCacheConfig};
use idempotency_core::{
    Call, Error, ExecutionResult, FailurePolicy, IdempotencyKey, IdempotencyService, Level,
    NoCache, Origin, Outcome,
};
use idempotency_pg::PgStore;

use support::cluster::{OwnCluster, cluster_state};
use support::timed::Timed;

const TIMEOUT: Duration = Duration::from_millis(50);
/// Lateness a loaded machine may add to a timer (a tokio timer firing late, a descheduled
/// test thread): a call bounded by its timeout ends within `TIMEOUT + SLACK`; a call that hangs
/// on Redis never ends.
const SLACK: Duration = Duration::from_millis(450);
const COOL_DOWN: Duration = Duration::from_secs(1);
const RECOVERY: Duration = Duration::from_secs(15);

type Service = IdempotencyService<PgStore, NoCache, Timed<RedisCache>>;

async fn cache(url: &str, prefix: &str, policy: FailurePolicy) -> RedisCache {
    let config = DistributedCacheConfig {
        key_prefix: prefix.to_owned(),
        failure_policy: policy,
        timeout: TIMEOUT,
        circuit_breaker: CircuitBreakerConfig {
            failure_threshold: 5,
            cool_down: COOL_DOWN,
        },
        secret: Some(support::secret()),
        ..Default::default()
    };
    let cache = RedisCache::connect(url, &config).unwrap();
    tokio::time::timeout(Duration::from_secs(10), cache.client().wait_for_connect())
        .await
        .expect("no connection to the cluster")
        .unwrap();
    cache
}

async fn pay(service: &Service, key: &str, runs: &AtomicUsize) -> Result<Outcome<u32>, Error> {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_without_a_majority_of_masters_fails_open_or_fast_and_both_recover() {
    let mut cluster = OwnCluster::start("down").await;
    let prefix = format!("{}:", idempotency_testing::unique_name("down"));
    let open = cache(&cluster.url(), &prefix, FailurePolicy::FailOpen).await;
    let fast = cache(&cluster.url(), &prefix, FailurePolicy::FailFast).await;
    let store = PgStore::new(idempotency_testing::pg_pool().await);
    store.create_schema().await.unwrap();
    let timed = Timed::new(open.clone());
    let open_service: Service = IdempotencyService::builder(store.clone())
        .distributed_cache(timed.clone())
        .build();
    let fast_service: Service = IdempotencyService::builder(store)
        .distributed_cache(Timed::new(fast.clone()))
        .build();
    let runs = AtomicUsize::new(0);
    for i in 0..10 {
        assert!(
            pay(&open_service, &format!("before-{i}"), &runs)
                .await
                .unwrap()
                .is_executed()
        );
    }
    let from_l2 = pay(&fast_service, "before-0", &runs).await.unwrap();
    assert_eq!(
        from_l2.origin(),
        Origin::Replayed {
            from: Level::Distributed
        }
    );

    let masters = cluster.masters();
    assert_eq!(masters.len(), 3);
    let (dead, alive) = (&masters[..2], masters[2]);
    for &port in dead {
        cluster.kill(port);
    }
    let took = cluster
        .wait("cluster_state:fail", |_| {
            cluster_state(alive).as_deref() == Some("fail")
        })
        .await;
    eprintln!("masters {dead:?} killed; cluster_state:fail after {took:?}");

    // fail-open: every request is answered from PostgreSQL, each cache call within the
    // timeout. The whole request also waits for PostgreSQL, which a checkpoint on a shared
    // machine can stall for half a second: its bound only tells a request that hangs on Redis
    // from one that does not.
    let bound = TIMEOUT * 2 + SLACK;
    let call_bound = TIMEOUT + SLACK;
    let request_bound = TIMEOUT * 2 + Duration::from_secs(2);
    let mut slowest = Duration::ZERO;
    let mut slowest_call = Duration::ZERO;
    timed.take_slowest();
    for i in 0..10 {
        let started = Instant::now();
        let replay = pay(&open_service, &format!("before-{i}"), &runs)
            .await
            .unwrap();
        let fresh = pay(&open_service, &format!("down-{i}"), &runs)
            .await
            .unwrap();
        slowest = slowest.max(started.elapsed() / 2);
        slowest_call = slowest_call.max(timed.take_slowest());
        assert_eq!(
            replay.origin(),
            Origin::Replayed {
                from: Level::Persistence
            }
        );
        assert!(fresh.is_executed());
    }
    assert!(
        slowest_call < call_bound,
        "a fail-open cache call took {slowest_call:?}; bound {call_bound:?}"
    );
    assert!(
        slowest < request_bound,
        "a fail-open request took {slowest:?}; bound {request_bound:?}"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        20,
        "ten before, ten while down"
    );
    // fail-fast: refused before the action runs.
    for i in 0..5 {
        let started = Instant::now();
        let error = pay(&fast_service, &format!("fast-down-{i}"), &runs)
            .await
            .unwrap_err();
        assert!(started.elapsed() < bound, "{:?}", started.elapsed());
        assert!(
            matches!(error, Error::Cache(_)) && error.is_retryable(),
            "{error:?}"
        );
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        20,
        "the action ran under fail-fast"
    );

    for &port in dead {
        cluster.restart(port);
    }
    let back = cluster.wait("cluster_state:ok again", OwnCluster::ok).await;
    eprintln!("masters restarted; cluster_state:ok after {back:?}");

    // Both recover by themselves: L2 answers again and the breakers close.
    let started = Instant::now();
    loop {
        let open_ok = matches!(
            pay(&open_service, "before-1", &runs)
                .await
                .map(|o| o.origin()),
            Ok(Origin::Replayed {
                from: Level::Distributed
            })
        ) && open.breaker_state() == BreakerState::Closed { failures: 0 };
        let fast_ok = pay(&fast_service, "before-2", &runs).await.is_ok_and(|o| {
            o.origin()
                == Origin::Replayed {
                    from: Level::Distributed,
                }
        }) && fast.breaker_state() == BreakerState::Closed { failures: 0 };
        if open_ok && fast_ok {
            break;
        }
        assert!(
            started.elapsed() < RECOVERY,
            "not recovered {RECOVERY:?} after cluster_state:ok: fail-open {open_ok} ({:?}, {:?}), fail-fast {fast_ok} ({:?}, {:?})",
            open.breaker_state(),
            open.stats(),
            fast.breaker_state(),
            fast.stats(),
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "both policies served from L2 again {:?} after cluster_state:ok",
        started.elapsed()
    );
    let fresh = pay(&fast_service, "fast-after", &runs).await.unwrap();
    assert!(fresh.is_executed());
}
