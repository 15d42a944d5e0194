//! Write-behind on real Redis and on the Redis Cluster (and the breaker of writes it shares
//! with the `put`s that write themselves): `put` answers before the write, the
//! queue is bounded (a `put` that finds it full writes its entry itself, nothing is dropped), a
//! batch closes at `max-batch`, and what is queued is written when the cache is dropped.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

mod support;

use std::num::NonZeroUsize;
use std::time::{Duration, Instant};

use idempotency_cache_redis::fred::clients::Client;
use idempotency_cache_redis::fred::prelude::{ClientLike, KeysInterface};
use idempotency_cache_redis::{
    BreakerState, CircuitBreakerConfig, DistributedCacheConfig, RedisCache, WriteBehindConfig,
};
use idempotency_core::{DistributedCache, FailurePolicy, IdempotencyRecord, RecordId};

use support::server::OwnRedis;
use support::{Target, completed as record, hanging_url, id, on_both, redis};

/// Longer than any test takes: a batch that waits for its linger is not written during a test.
const LONG_LINGER: Duration = Duration::from_secs(120);

/// How long a test waits for an entry the writer should write now.
const PATIENCE: Duration = Duration::from_secs(20);

async fn cache(target: Target, capacity: usize, max_batch: usize, linger: Duration) -> RedisCache {
    let config = DistributedCacheConfig {
        write_behind: WriteBehindConfig {
            enabled: true,
            capacity: NonZeroUsize::new(capacity).unwrap(),
            max_batch: NonZeroUsize::new(max_batch).unwrap(),
            linger,
        },
        ..Default::default()
    };
    redis(target, config).await
}

/// The entry under `id`, read straight from Redis (not through the write-behind cache).
async fn in_redis(cache: &RedisCache, id: &RecordId) -> Option<String> {
    cache.client().get(cache.key_for(id)).await.unwrap()
}

/// Waits (at most [`PATIENCE`]) until `key` is in Redis; `client` may outlive the cache.
async fn eventually_written(client: &Client, key: &str) {
    let deadline = Instant::now() + PATIENCE;
    while client
        .get::<Option<String>, _>(key)
        .await
        .unwrap()
        .is_none()
    {
        assert!(
            Instant::now() < deadline,
            "{key} not written within {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn eventually_in_redis(cache: &RedisCache, id: &RecordId) {
    eventually_written(&cache.client(), &cache.key_for(id)).await;
}

fn ids(n: usize) -> Vec<RecordId> {
    let run = idempotency_testing::unique_name("wb");
    (0..n)
        .map(|i| id("PAY", "", &format!("{run}-{i}")))
        .collect()
}

/// `put` returns with the entry queued, not written: the writer waits out the linger for more.
/// The entry is written once the batch closes, and reads back as the record.
async fn put_answers_before_the_write_which_follows(target: Target) {
    // max-batch 2: the second put closes the batch, so the test need not wait for the linger.
    let cache = cache(target, 16, 2, LONG_LINGER).await;
    let ids = ids(2);
    cache.put(&ids[0], &record(0)).await.unwrap();
    assert_eq!(
        in_redis(&cache, &ids[0]).await,
        None,
        "written before put returned"
    );
    assert_eq!(cache.stats().queued, 1);
    cache.put(&ids[1], &record(1)).await.unwrap();
    for (n, id) in ids.iter().enumerate() {
        eventually_in_redis(&cache, id).await;
        let read = cache.get(id).await.unwrap().unwrap();
        assert_eq!(read.outcome, record(n).outcome);
    }
    assert_eq!((cache.stats().queued, cache.stats().not_queued), (2, 0));
}

/// A full queue: `put` writes its entry itself, so the entry is in Redis when `put` returns;
/// nothing is dropped. (`#[tokio::test]` runs on one thread: the writer only runs while the
/// test awaits something, so the first entry is still in the queue when the second `put` comes.)
async fn a_full_queue_makes_put_write_its_entry_itself(target: Target) {
    let cache = cache(target, 1, 64, LONG_LINGER).await;
    let client = cache.client().clone();
    let ids = ids(4);
    let keys: Vec<String> = ids.iter().map(|id| cache.key_for(id)).collect();
    cache.put(&ids[0], &record(0)).await.unwrap();
    cache.put(&ids[1], &record(1)).await.unwrap();
    assert_eq!((cache.stats().queued, cache.stats().not_queued), (1, 1));
    assert!(
        in_redis(&cache, &ids[1]).await.is_some(),
        "written by its own put"
    );
    assert_eq!(
        in_redis(&cache, &ids[0]).await,
        None,
        "queued, its batch lingering"
    );
    // The writer took the first entry while the second put waited for Redis: room again.
    cache.put(&ids[2], &record(2)).await.unwrap();
    cache.put(&ids[3], &record(3)).await.unwrap();
    let stats = cache.stats();
    assert_eq!(stats.queued + stats.not_queued, 4, "{stats:?}");
    // Whatever is still queued is written when the cache goes.
    drop(cache);
    for key in &keys {
        eventually_written(&client, key).await;
    }
}

/// A batch closes at `max-batch` without waiting for the linger; an entry left in a batch that
/// is still lingering is written when the last clone of the cache is dropped.
async fn a_batch_closes_at_max_batch_and_the_rest_is_written_on_drop(target: Target) {
    let cache = cache(target, 16, 3, LONG_LINGER).await;
    let client = cache.client().clone();
    let ids = ids(4);
    let keys: Vec<String> = ids.iter().map(|id| cache.key_for(id)).collect();
    for (n, id) in ids.iter().take(3).enumerate() {
        cache.put(id, &record(n)).await.unwrap();
    }
    for id in ids.iter().take(3) {
        eventually_in_redis(&cache, id).await;
    }
    cache.put(&ids[3], &record(3)).await.unwrap();
    assert_eq!(
        in_redis(&cache, &ids[3]).await,
        None,
        "a batch of one waits for its linger"
    );
    // The lingering entry is written on drop.
    drop(cache);
    eventually_written(&client, &keys[3]).await;
}

/// A batch that does not fill up is written once `linger` has passed, while the cache lives.
async fn a_batch_that_does_not_fill_is_written_after_the_linger(target: Target) {
    let cache = cache(target, 16, 64, Duration::from_millis(50)).await;
    let ids = ids(1);
    cache.put(&ids[0], &record(0)).await.unwrap();
    eventually_in_redis(&cache, &ids[0]).await;
    assert_eq!((cache.stats().queued, cache.stats().unwritten), (1, 0));
}

/// A batch that Redis never answers: both entries were queued (`put` did not wait for Redis);
/// the batch fails within the timeout, is counted as unwritten, and counts like any failed call.
#[tokio::test]
async fn a_failed_batch_is_counted_as_unwritten() {
    let config = DistributedCacheConfig {
        key_prefix: format!("{}:", idempotency_testing::unique_name("wb-dead")),
        timeout: Duration::from_millis(100),
        write_behind: WriteBehindConfig {
            enabled: true,
            linger: Duration::ZERO,
            ..Default::default()
        },
        secret: Some(support::secret()),
        ..Default::default()
    };
    let cache = RedisCache::connect(&hanging_url().await, &config).unwrap();
    let ids = ids(2);
    cache.put(&ids[0], &record(0)).await.unwrap();
    cache.put(&ids[1], &record(1)).await.unwrap();
    let deadline = Instant::now() + PATIENCE;
    while cache.stats().unwritten < 2 {
        assert!(Instant::now() < deadline, "{:?}", cache.stats());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stats = cache.stats();
    assert_eq!((stats.queued, stats.unwritten), (2, 2), "{stats:?}");
    assert!(stats.timeouts + stats.errors >= 1, "{stats:?}");
}

/// Waits (at most [`PATIENCE`]) until `done` holds for the cache's stats.
async fn until_stats(
    cache: &RedisCache,
    done: impl Fn(idempotency_cache_redis::RedisCacheStats) -> bool,
) {
    let deadline = Instant::now() + PATIENCE;
    while !done(cache.stats()) {
        assert!(Instant::now() < deadline, "{:?}", cache.stats());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Redis never answers; the writer's breaker is open and its cool-down over. A batch whose
/// entries all expired while queued makes no call to Redis, so it cannot close the breaker
/// (before: it held the trial permit and reported a success without reaching Redis).
#[tokio::test]
async fn a_batch_whose_entries_expired_in_the_queue_does_not_close_the_breaker() {
    let cool_down = Duration::from_millis(100);
    let config = DistributedCacheConfig {
        key_prefix: format!("{}:", idempotency_testing::unique_name("wb-expired")),
        timeout: Duration::from_millis(50),
        circuit_breaker: CircuitBreakerConfig {
            failure_threshold: 1,
            cool_down,
        },
        write_behind: WriteBehindConfig {
            enabled: true,
            linger: Duration::from_millis(200),
            ..Default::default()
        },
        secret: Some(support::secret()),
        ..Default::default()
    };
    let cache = RedisCache::connect(&hanging_url().await, &config).unwrap();
    let ids = ids(2);
    cache.put(&ids[0], &record(0)).await.unwrap();
    until_stats(&cache, |s| s.unwritten == 1).await;
    assert_eq!(cache.write_breaker_state(), BreakerState::Open);
    tokio::time::sleep(cool_down + Duration::from_millis(20)).await;
    let short_lived = IdempotencyRecord {
        expires_at: Some(std::time::SystemTime::now() + Duration::from_millis(50)),
        execution_span: None,
        ..record(1)
    };
    cache.put(&ids[1], &short_lived).await.unwrap();
    // The writer takes it, lingers 200 ms for more, and finds it expired.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        cache.write_breaker_state(),
        BreakerState::HalfOpen,
        "a batch that never reached Redis changed the breaker; {:?}",
        cache.stats()
    );
    let stats = cache.stats();
    assert_eq!(
        (stats.expired_in_queue, stats.unwritten),
        (1, 1),
        "{stats:?}"
    );
}

/// Fail-fast settings whose breakers open at `threshold` failures and stay open a minute, with
/// `write_behind`, under a key prefix of their own.
fn fail_fast(
    label: &str,
    threshold: u32,
    write_behind: WriteBehindConfig,
) -> DistributedCacheConfig {
    DistributedCacheConfig {
        key_prefix: format!("{}:", idempotency_testing::unique_name(label)),
        failure_policy: FailurePolicy::FailFast,
        timeout: Duration::from_millis(500),
        circuit_breaker: CircuitBreakerConfig {
            failure_threshold: threshold,
            cool_down: Duration::from_secs(60),
        },
        write_behind,
        secret: Some(support::secret()),
        ..Default::default()
    }
}

/// A cache on `url`, connected.
async fn connected(url: &str, config: &DistributedCacheConfig) -> RedisCache {
    let cache = RedisCache::connect(url, config).unwrap();
    tokio::time::timeout(Duration::from_secs(10), cache.client().wait_for_connect())
        .await
        .unwrap()
        .unwrap();
    cache
}

/// A Redis of the test's own that refuses every write (`maxmemory 1`, `noeviction`: `OOM`).
async fn out_of_memory(name: &str) -> OwnRedis {
    OwnRedis::start(
        name,
        &["--maxmemory", "1", "--maxmemory-policy", "noeviction"],
    )
    .await
}

/// Writes fail (Redis out of memory: `OOM` replies to every `SET`) while reads work: the
/// write-behind batches open the breaker of writes, never the one that guards reads, so
/// under fail-fast requests are still served (before: one breaker for both, and failed batches
/// turned into 503s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_write_behind_batches_do_not_open_the_breaker_of_reads() {
    let server = out_of_memory("wb-oom").await;
    let write_behind = WriteBehindConfig {
        enabled: true,
        max_batch: NonZeroUsize::new(1).unwrap(),
        linger: Duration::ZERO,
        ..Default::default()
    };
    let cache = connected(&server.url(), &fail_fast("wb-oom", 2, write_behind)).await;
    let ids = ids(3);
    for (n, id) in ids.iter().enumerate() {
        cache.put(id, &record(n)).await.unwrap();
    }
    until_stats(&cache, |s| s.unwritten + s.short_circuited >= 3).await;
    assert_eq!(cache.write_breaker_state(), BreakerState::Open);
    assert!(cache.stats().errors >= 2, "{:?}", cache.stats());
    for id in &ids {
        assert_eq!(cache.get(id).await.unwrap(), None, "reads are refused");
    }
    assert_eq!(cache.breaker_state(), BreakerState::Closed { failures: 0 });
    assert!(cache.is_healthy().await);
}

/// The same with write-behind off: the `put`s that write their entry themselves fail, and
/// open the breaker of writes, never the one of reads, so under fail-fast requests are still
/// served (before: those `put`s went through the breaker of reads, which two failed `SET`s
/// opened: every read was then `CircuitOpen`, and every request a 503).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_puts_do_not_open_the_breaker_of_reads() {
    let server = out_of_memory("put-oom").await;
    let cache = connected(
        &server.url(),
        &fail_fast("put-oom", 2, WriteBehindConfig::default()),
    )
    .await;
    let ids = ids(3);
    for (n, id) in ids.iter().enumerate().take(2) {
        let error = cache.put(id, &record(n)).await.unwrap_err();
        assert!(format!("{error:?}").contains("OOM"), "{error:?}");
    }
    assert_eq!(cache.write_breaker_state(), BreakerState::Open);
    let refused = cache.put(&ids[2], &record(2)).await.unwrap_err();
    assert!(
        matches!(refused, idempotency_core::CacheError::CircuitOpen),
        "{refused:?}"
    );
    for id in &ids {
        assert_eq!(cache.get(id).await.unwrap(), None, "reads are served");
    }
    assert_eq!(cache.breaker_state(), BreakerState::Closed { failures: 0 });
    assert!(cache.is_healthy().await);
}

/// A replica answers reads and refuses writes (`READONLY`): a corrupt entry read there is a
/// miss whose deletion fails, which counts against the breaker of writes, not the breaker of
/// reads (before: the deletion went through the breaker of reads, which a threshold of 1
/// opened: every read then refused under fail-fast).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_deletion_of_a_corrupt_entry_does_not_open_the_breaker_of_reads() {
    let primary = OwnRedis::start("ro-primary", &[]).await;
    let replica = OwnRedis::start(
        "ro-replica",
        &["--replicaof", "127.0.0.1", &primary.port.to_string()],
    )
    .await;
    let config = fail_fast("ro", 1, WriteBehindConfig::default());
    let writer = connected(&primary.url(), &config).await;
    let reader = connected(&replica.url(), &config).await;
    let id = &ids(1)[0];
    let key = writer.key_for(id);
    let _: () = writer
        .client()
        .set(key.as_str(), "v3:not-a-tag:{}", None, None, false)
        .await
        .unwrap();
    let deadline = Instant::now() + PATIENCE;
    while reader
        .client()
        .get::<Option<String>, _>(key.as_str())
        .await
        .unwrap()
        .is_none()
    {
        assert!(Instant::now() < deadline, "not replicated");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let error = reader.get(id).await.unwrap_err();
    assert!(
        matches!(error, idempotency_core::CacheError::Corrupt(_)),
        "{error:?}"
    );
    assert_eq!(reader.write_breaker_state(), BreakerState::Open, "READONLY");
    assert_eq!(reader.breaker_state(), BreakerState::Closed { failures: 0 });
    assert!(
        matches!(reader.get(&ids(1)[0]).await, Ok(None)),
        "reads served"
    );
}

on_both!(
    put_answers_before_the_write_which_follows,
    a_full_queue_makes_put_write_its_entry_itself,
    a_batch_closes_at_max_batch_and_the_rest_is_written_on_drop,
    a_batch_that_does_not_fill_is_written_after_the_linger,
);
