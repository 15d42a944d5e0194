//! A master of a Redis Cluster hangs (SIGSTOP: its connections stay open and are never
//! answered, no IO error, no redirection) while requests read the cache: once its replica has
//! been promoted, the client leaves it (the timeouts make it reload the slot map) and L2 serves
//! every key again.
//!
//! The test owns its six-node cluster (its own ports, see `support::cluster`).

#![allow(clippy::unwrap_used, clippy::print_stderr)] // tests fail loudly; the figures go to stderr

mod support;

use std::time::{Duration, Instant};

use idempotency_cache_redis::fred::prelude::ClientLike;
use idempotency_cache_redis::{CircuitBreakerConfig, DistributedCacheConfig, RedisCache};
use idempotency_core::{DistributedCache, FailurePolicy, RecordId};

use support::cluster::OwnCluster;
use support::{completed as record, id};

/// After the promotion, every key must be served again within this.
const RECOVERY: Duration = Duration::from_secs(20);

/// How many of `ids` read back from L2 (each call bounded by the cache's timeout).
async fn served(cache: &RedisCache, ids: &[RecordId]) -> usize {
    let mut served = 0;
    for (n, id) in ids.iter().enumerate() {
        if let Ok(Some(found)) = cache.get(id).await
            && found.outcome == record(n).outcome
        {
            served += 1;
        }
    }
    served
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn after_a_hung_master_is_replaced_l2_serves_its_keys_again() {
    let mut cluster = OwnCluster::start("hung").await;
    let config = DistributedCacheConfig {
        key_prefix: format!("{}:", idempotency_testing::unique_name("hung")),
        failure_policy: FailurePolicy::FailOpen,
        timeout: Duration::from_millis(50),
        circuit_breaker: CircuitBreakerConfig {
            failure_threshold: 5,
            cool_down: Duration::from_secs(1),
        },
        secret: Some(support::secret()),
        ..Default::default()
    };
    let cache = RedisCache::connect(&cluster.url(), &config).unwrap();
    tokio::time::timeout(Duration::from_secs(10), cache.client().wait_for_connect())
        .await
        .expect("no connection to the cluster")
        .unwrap();
    let ids: Vec<RecordId> = (0..30).map(|n| id("PAY", "", &format!("k{n}"))).collect();
    for (n, id) in ids.iter().enumerate() {
        cache.put(id, &record(n)).await.unwrap();
    }
    assert_eq!(served(&cache, &ids).await, ids.len());
    let count = ids.len() as u64;
    cluster
        .wait("every record replicated", |c| c.replicated_keys() >= count)
        .await;
    let mut masters = cluster.masters();
    masters.sort_unstable();
    let victim = masters[0];
    let on_victim = ids
        .iter()
        .filter(|id| cluster.master_of(&cache.key_for(id)) == victim)
        .count();
    assert!(on_victim > 0, "no key on the master that will hang");

    cluster.pause(victim);
    // Steady traffic while the master hangs and its replica takes over.
    let promoted = cluster
        .wait("the replica is promoted", |c| {
            c.ok() && !c.masters().contains(&victim)
        })
        .await;
    eprintln!(
        "master {victim} (SIGSTOP, {on_victim} of the keys): replica promoted after {promoted:?}"
    );
    let started = Instant::now();
    let mut last = 0;
    while started.elapsed() < RECOVERY {
        last = served(&cache, &ids).await;
        if last == ids.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        last,
        ids.len(),
        "{RECOVERY:?} after the promotion, L2 serves {last} of {} keys; breaker {:?}, stats {:?}",
        ids.len(),
        cache.breaker_state(),
        cache.stats()
    );
    eprintln!(
        "every key served again {:?} after the promotion; stats {:?}",
        started.elapsed(),
        cache.stats()
    );
}
