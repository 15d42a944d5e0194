//! A master of a Redis Cluster dies (SIGKILL) while requests read the cache (and, with
//! write-behind on, write it): once its replica has taken over, L2 serves again, the circuit
//! breakers close and the cache reports itself healthy, by itself.
//!
//! The test owns its six-node cluster (its own ports, see `support::cluster`): it kills a node,
//! which no test sharing the cluster of `scripts/services.sh` could stand.

#![allow(clippy::unwrap_used, clippy::print_stderr)] // tests fail loudly; the figures go to stderr

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use idempotency_cache_redis::fred::prelude::ClientLike;
use idempotency_cache_redis::{BreakerState, RedisCache, is_connected};
use idempotency_cache_redis::{CircuitBreakerConfig, DistributedCacheConfig, WriteBehindConfig};
use idempotency_core::{DistributedCache, FailurePolicy, RecordId};

use support::cluster::OwnCluster;
use support::{completed as record, id};

const COOL_DOWN: Duration = Duration::from_secs(1);
/// After `cluster_state:ok` is back, L2 must serve again within this (a few cool-downs).
const RECOVERY: Duration = Duration::from_secs(10);

/// Whether every record reads back from L2.
async fn all_served(cache: &RedisCache, ids: &[RecordId]) -> Result<(), String> {
    for (n, id) in ids.iter().enumerate() {
        match cache.get(id).await {
            Ok(Some(found)) if found == record(n) || found.outcome == record(n).outcome => {}
            other => return Err(format!("record {n}: {other:?}")),
        }
    }
    Ok(())
}

/// The seeds the client is given.
#[derive(Debug, Clone, Copy)]
enum Seeds {
    /// Every node of the cluster.
    All,
    /// Only the master that will die, as in `REDIS_URL=redis-cluster://127.0.0.1:7000`.
    TheVictim,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn after_a_master_fails_over_l2_serves_again_and_the_breaker_closes() {
    failover(Seeds::All, false).await;
}

/// The seed named in the URL is the master that dies: the client must find the cluster through
/// the nodes it learned, not only through the URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn after_the_seed_master_fails_over_l2_serves_again_and_the_breaker_closes() {
    failover(Seeds::TheVictim, false).await;
}

/// As the demo runs it: write-behind on, the URL naming only the master that dies, and writes
/// as well as reads under load. L2 serves again, both breakers close and
/// [`RedisCache::is_healthy`] says so; what is put after the failover reaches Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_write_behind_after_the_seed_master_fails_over_l2_serves_again_and_is_healthy() {
    failover(Seeds::TheVictim, true).await;
}

async fn failover(seeds: Seeds, write_behind: bool) {
    let mut cluster = OwnCluster::start("failover").await;
    let config = DistributedCacheConfig {
        key_prefix: format!("{}:", idempotency_testing::unique_name("failover")),
        failure_policy: FailurePolicy::FailOpen,
        timeout: Duration::from_millis(50),
        circuit_breaker: CircuitBreakerConfig {
            failure_threshold: 5,
            cool_down: COOL_DOWN,
        },
        write_behind: WriteBehindConfig {
            enabled: write_behind,
            ..Default::default()
        },
        secret: Some(support::secret()),
        ..Default::default()
    };
    let mut masters = cluster.masters();
    masters.sort_unstable();
    let victim = masters[0];
    let url = match seeds {
        Seeds::All => cluster.url(),
        Seeds::TheVictim => format!("redis-cluster://127.0.0.1:{victim}"),
    };
    let cache = RedisCache::connect(&url, &config).unwrap();
    tokio::time::timeout(Duration::from_secs(10), cache.client().wait_for_connect())
        .await
        .expect("no connection to the cluster")
        .unwrap();
    let ids: Vec<RecordId> = (0..30).map(|n| id("PAY", "", &format!("k{n}"))).collect();
    for (n, id) in ids.iter().enumerate() {
        cache.put(id, &record(n)).await.unwrap();
    }
    let started = Instant::now();
    while let Err(missing) = all_served(&cache, &ids).await {
        assert!(started.elapsed() < RECOVERY, "not written: {missing}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Replication is asynchronous: a write the dying master had not yet sent to its replica
    // is lost with it (a cache miss, served from the database). Kill only once every record
    // has reached a replica, so that what is checked is the client finding the new master.
    let count = ids.len() as u64;
    cluster
        .wait("every record replicated", |c| c.replicated_keys() >= count)
        .await;
    let mut owners: Vec<u16> = ids
        .iter()
        .map(|id| cluster.master_of(&cache.key_for(id)))
        .collect();
    owners.sort_unstable();
    owners.dedup();
    assert_eq!(owners.len(), 3, "the records spread over the three masters");

    // Requests keep reading L2 while the master dies and its replica takes over; with
    // write-behind, eight clients that also put fresh records, as a service under load does.
    let stop = Arc::new(AtomicBool::new(false));
    let clients = if write_behind { 8 } else { 1 };
    let loads: Vec<_> = (0..clients)
        .map(|client| {
            let (cache, ids, stop) = (cache.clone(), ids.clone(), stop.clone());
            tokio::spawn(async move {
                let mut slowest = Duration::ZERO;
                let mut round = 0;
                while !stop.load(Ordering::Relaxed) {
                    round += 1;
                    for (n, read) in ids.iter().enumerate() {
                        let started = Instant::now();
                        let _ = cache.get(read).await;
                        if write_behind {
                            let fresh = id("PAY", "", &format!("load-{client}-{round}-{n}"));
                            let _ = cache.put(&fresh, &record(n)).await;
                        }
                        slowest = slowest.max(started.elapsed());
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                slowest
            })
        })
        .collect();
    cluster.kill(victim);
    cluster.wait("a node sees the failure", |c| !c.ok()).await;
    let failover = cluster
        .wait("the replica is promoted (cluster_state:ok)", OwnCluster::ok)
        .await;
    eprintln!("{seeds:?}: master {victim} killed; cluster_state:ok again after {failover:?}");

    let back = Instant::now();
    let mut last = all_served(&cache, &ids).await;
    while (last.is_err() || cache.breaker_state() != (BreakerState::Closed { failures: 0 }))
        && back.elapsed() < RECOVERY
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
        last = all_served(&cache, &ids).await;
    }
    let mut healthy = cache.is_healthy().await;
    while write_behind && !healthy && back.elapsed() < RECOVERY {
        tokio::time::sleep(Duration::from_millis(100)).await;
        healthy = cache.is_healthy().await;
    }
    stop.store(true, Ordering::Relaxed);
    let mut slowest = Duration::ZERO;
    for load in loads {
        slowest = slowest.max(load.await.unwrap());
    }
    assert!(
        last.is_ok(),
        "L2 does not serve {RECOVERY:?} after the failover: {last:?}; breaker {:?}, stats {:?}, connected {}",
        cache.breaker_state(),
        cache.stats(),
        is_connected(&cache.client()),
    );
    assert_eq!(cache.breaker_state(), BreakerState::Closed { failures: 0 });
    assert!(
        healthy,
        "the cache reports itself unhealthy; stats {:?}",
        cache.stats()
    );
    if write_behind {
        // The writer writes again: its breaker, opened by the failover, closes after a trial
        // (one per cool-down, so records put while it is open are not cached), and the
        // records put from then on reach Redis.
        let started = Instant::now();
        let mut n = 0;
        loop {
            n += 1;
            let after = id("PAY", "", &format!("after-failover-{n}"));
            cache.put(&after, &record(0)).await.unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
            if matches!(cache.get(&after).await, Ok(Some(_)))
                && cache.write_breaker_state() == (BreakerState::Closed { failures: 0 })
            {
                break;
            }
            assert!(
                started.elapsed() < RECOVERY,
                "no record put after the failover reached Redis; write breaker {:?}, stats {:?}",
                cache.write_breaker_state(),
                cache.stats()
            );
        }
        eprintln!(
            "{seeds:?}: write-behind wrote again {:?} after L2 served again",
            started.elapsed()
        );
    } else {
        assert!(
            is_connected(&cache.client()),
            "the client reports no connection"
        );
    }
    eprintln!(
        "{seeds:?}: L2 served again {:?} after cluster_state:ok; slowest call under load {slowest:?}; stats {:?}",
        back.elapsed(),
        cache.stats()
    );
    assert!(
        // A late timer on a loaded machine, not a call hanging on the failed node.
        slowest < config.timeout + Duration::from_millis(450),
        "a call took {slowest:?}"
    );
}
