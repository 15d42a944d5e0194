//! Write-behind reaches the application's metrics: entries queued, written by `put` itself
//! (full queue) and unwritten (failed batches) are counted in
//! `idempotency_cache_write_behind_entries_total{outcome}`, not only in `RedisCacheStats`.
//!
//! Its own test binary: it installs a global recorder.

#![allow(clippy::unwrap_used)] // tests fail loudly

mod support;

use std::time::{Duration, Instant};

use idempotency_cache_redis::{
    DistributedCacheConfig, RedisCache, WRITE_BEHIND_METRIC, WriteBehindConfig,
};
use idempotency_core::DistributedCache;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

use support::{completed as record, hanging_url, id};

/// The counts of [`WRITE_BEHIND_METRIC`] by outcome, in one snapshot.
fn counted(snapshotter: &Snapshotter) -> Vec<(String, u64)> {
    let mut counts: Vec<(String, u64)> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, _, _, _)| key.key().name() == WRITE_BEHIND_METRIC)
        .filter_map(|(key, _, _, value)| {
            let outcome = key
                .key()
                .labels()
                .find(|l| l.key() == "outcome")?
                .value()
                .to_owned();
            match value {
                DebugValue::Counter(n) => Some((outcome, n)),
                _ => None,
            }
        })
        .collect();
    counts.sort();
    counts
}

#[tokio::test]
async fn failed_write_behind_batches_are_counted_in_the_metrics() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().unwrap();
    let config = DistributedCacheConfig {
        key_prefix: format!("{}:", idempotency_testing::unique_name("wb-metrics")),
        timeout: Duration::from_millis(50),
        write_behind: WriteBehindConfig {
            enabled: true,
            linger: Duration::ZERO,
            ..Default::default()
        },
        secret: Some(support::secret()),
        ..Default::default()
    };
    let cache = RedisCache::connect(&hanging_url().await, &config).unwrap();
    for n in 0..3 {
        cache
            .put(&id("PAY", "", &format!("m{n}")), &record(n))
            .await
            .unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while cache.stats().unwritten < 3 {
        assert!(Instant::now() < deadline, "{:?}", cache.stats());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        counted(&snapshotter),
        [("queued".to_owned(), 3), ("unwritten".to_owned(), 3)]
    );
}
