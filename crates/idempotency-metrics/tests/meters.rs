//! Every meter, with its labels, through the real service on PostgreSQL, read back with
//! `metrics_util::debugging::DebuggingRecorder`: once with `FacadeMetrics`, once with
//! `CachedMetrics`.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idempotency_core::cleanup::CleanupJob;
use idempotency_core::config::CleanupConfig;
use idempotency_core::testing::RecordingCache;
use idempotency_core::{
    CacheError, Call, DistributedCache, Error, ExecutionResult, FailurePolicy, IdempotencyKey,
    IdempotencyMetrics, IdempotencyRecord, IdempotencyService, InFlightPolicy, Outcome, RecordId,
    ServiceOptions,
};
use idempotency_metrics::{CachedMetrics, FacadeMetrics, names};
use idempotency_pg::PgStore;
use idempotency_testing::recorded::Recorded;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

/// An L2 double: serves what was put, or fails every call when `broken`.
#[derive(Debug, Clone, Default)]
struct MemoryL2 {
    entries: Arc<Mutex<HashMap<RecordId, IdempotencyRecord>>>,
    broken: bool,
}

impl DistributedCache for MemoryL2 {
    async fn get(&self, id: &RecordId) -> Result<Option<IdempotencyRecord>, CacheError> {
        if self.broken {
            return Err(CacheError::Timeout(Duration::from_millis(50)));
        }
        Ok(self.entries.lock().unwrap().get(id).cloned())
    }
    async fn put(&self, id: &RecordId, record: &IdempotencyRecord) -> Result<(), CacheError> {
        if self.broken {
            return Err(CacheError::Backend("refused".into()));
        }
        self.entries
            .lock()
            .unwrap()
            .insert(id.clone(), record.clone());
        Ok(())
    }
    fn failure_policy(&self) -> FailurePolicy {
        FailurePolicy::FailOpen
    }
}

async fn run<L, D, M>(
    service: &IdempotencyService<PgStore, L, D, M>,
    key: &str,
    body: i32,
) -> Result<Outcome<i32>, Error>
where
    L: idempotency_core::LocalCache,
    D: DistributedCache,
    M: IdempotencyMetrics,
{
    service
        .execute(
            Call::new("PAY", IdempotencyKey::new(key).unwrap(), &body),
            async |_c| {
                if body < 0 {
                    return Ok(ExecutionResult::rejected("NEGATIVE"));
                }
                Ok(ExecutionResult::success(body))
            },
        )
        .await
}

#[tokio::test]
async fn every_meter_with_its_labels() {
    every_meter(FacadeMetrics).await;
}

#[tokio::test]
async fn every_meter_with_its_labels_from_kept_handles() {
    every_meter(CachedMetrics::default()).await;
}

/// Drives every meter through services sharing `meters` and checks each one's value.
async fn every_meter<M: IdempotencyMetrics + Clone>(meters: M) {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(&recorder);

    let pool = idempotency_testing::pg_pool().await;
    let store = PgStore::new(pool.clone());
    store.create_schema().await.unwrap();
    let config = ServiceOptions {
        default_ttl: Some(Duration::from_millis(1)),
        ..Default::default()
    };
    let plain = IdempotencyService::builder(store.clone())
        .config(config.clone())
        .metrics(meters.clone())
        .build();

    run(&plain, "k1", 1).await.unwrap(); // acquired, persisted COMPLETED
    run(&plain, "k1", 1).await.unwrap(); // acquire conflict, lookup persistence, replay COMPLETED
    assert!(matches!(
        run(&plain, "k1", 2).await,
        Err(Error::PayloadConflict)
    ));
    run(&plain, "k2", -1).await.unwrap(); // persisted REJECTED
    run(&plain, "k2", -1).await.unwrap(); // replay REJECTED

    let cached = IdempotencyService::builder(store.clone())
        .metrics(meters.clone())
        .local_cache(RecordingCache::default())
        .distributed_cache(MemoryL2::default())
        .build();
    run(&cached, "k3", 3).await.unwrap();
    run(&cached, "k3", 3).await.unwrap(); // lookup local
    let l2 = MemoryL2::default();
    let second_instance = IdempotencyService::builder(store.clone())
        .metrics(meters.clone())
        .distributed_cache(l2.clone())
        .build();
    run(&second_instance, "k4", 4).await.unwrap();
    run(&second_instance, "k4", 4).await.unwrap(); // lookup distributed

    let broken = IdempotencyService::builder(store.clone())
        .metrics(meters.clone())
        .distributed_cache(MemoryL2 {
            broken: true,
            ..Default::default()
        })
        .build();
    run(&broken, "k5", 5).await.unwrap(); // cache errors: timeout on read, backend on write

    let reject = IdempotencyService::builder(store.clone())
        .config(ServiceOptions {
            in_flight: InFlightPolicy::Reject,
            ..Default::default()
        })
        .metrics(meters.clone())
        .build();
    let mut holder = reject.begin().await.unwrap();
    let _: Outcome<i32> = reject
        .execute_in(
            &mut holder,
            Call::new("PAY", IdempotencyKey::new("k6").unwrap(), &6),
            async |_c| Ok::<_, Error>(ExecutionResult::success(6)),
        )
        .await
        .unwrap();
    let other = reject.clone();
    let refused = tokio::spawn(async move { run(&other, "k6", 6).await })
        .await
        .unwrap();
    assert!(matches!(refused, Err(Error::InFlight)), "{refused:?}");
    holder.rollback().await.unwrap();

    tokio::time::sleep(Duration::from_millis(20)).await;
    let job = CleanupJob::from_config(store.clone(), &CleanupConfig::default(), meters).unwrap();
    let deleted = job.run_once().await.unwrap().deleted;
    assert_eq!(deleted, 2, "k1 and k2 expired");

    let values = Recorded::take(&snapshotter);
    let op = ("operation", "PAY");
    // k1..k5, and k6 by the holder that later rolled back
    assert_eq!(values.counter(names::ACQUIRED, &[op]), 6);
    // the k1 replay, the k1 payload conflict, the k2 replay (k6's refusal is a lock timeout)
    assert_eq!(values.counter(names::ACQUIRE_CONFLICTS, &[op]), 3);
    assert_eq!(
        values.counter(names::LOOKUP_HITS, &[op, ("level", "persistence")]),
        3
    );
    assert_eq!(
        values.counter(names::LOOKUP_HITS, &[op, ("level", "local")]),
        1
    );
    assert_eq!(
        values.counter(names::LOOKUP_HITS, &[op, ("level", "distributed")]),
        1
    );
    assert_eq!(
        values.counter(names::REPLAYS, &[op, ("status", "COMPLETED")]),
        3
    );
    assert_eq!(
        values.counter(names::REPLAYS, &[op, ("status", "REJECTED")]),
        1
    );
    assert_eq!(values.counter(names::CONFLICTS, &[op]), 1);
    // k1 k3 k4 k5: the rolled-back k6 never counts, because `persisted` runs after the commit
    assert_eq!(
        values.counter(names::PERSISTED, &[op, ("status", "COMPLETED")]),
        4
    );
    assert_eq!(
        values.counter(names::PERSISTED, &[op, ("status", "REJECTED")]),
        1
    );
    assert_eq!(values.counter(names::IN_FLIGHT, &[op]), 1);
    assert_eq!(
        values.counter(
            names::CACHE_ERRORS,
            &[op, ("level", "distributed"), ("kind", "timeout")]
        ),
        1
    );
    assert_eq!(
        values.counter(
            names::CACHE_ERRORS,
            &[op, ("level", "distributed"), ("kind", "backend")]
        ),
        1
    );
    assert_eq!(values.counter(names::CLEANUP_DELETED, &[]), 2);
    match values.get(names::ACQUIRE_WAIT, &[op]) {
        Some(DebugValue::Histogram(samples)) => {
            assert_eq!(
                samples.len(),
                10,
                "one sample per acquire (cache hits never acquire)"
            );
            assert!(
                samples
                    .iter()
                    .all(|s| s.into_inner() >= 0.0 && s.into_inner() < 10.0)
            );
        }
        other => panic!("acquire wait: {other:?}"),
    }

    // No label value is ever a key, a scope or a fingerprint.
    let allowed = [
        "PAY",
        "local",
        "distributed",
        "persistence",
        "COMPLETED",
        "REJECTED",
        "timeout",
        "backend",
    ];
    for (_, label_set) in values.series().keys() {
        for (_, value) in label_set {
            assert!(
                allowed.contains(&value.as_str()),
                "unexpected label value {value:?}"
            );
        }
    }
}
