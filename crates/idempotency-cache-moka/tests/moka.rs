//! The L1 cache: what it stores, how long, how much, and its place in `execute`.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use idempotency_cache_moka::LocalCacheConfig;
use idempotency_cache_moka::MokaCache;
use idempotency_core::{
    Call, ExecutionResult, Fingerprint, IdempotencyKey, IdempotencyRecord, IdempotencyService,
    Level, LocalCache, Operation, Origin, Outcome, RecordId, Scope, StoredOutcome,
};
use idempotency_pg::PgStore;

fn id(key: &str) -> RecordId {
    RecordId::new(
        Operation::new("OP").unwrap(),
        Scope::default(),
        IdempotencyKey::new(key).unwrap(),
    )
}

fn record(
    outcome: Option<StoredOutcome>,
    expires_at: Option<SystemTime>,
) -> Arc<IdempotencyRecord> {
    Arc::new(IdempotencyRecord {
        fingerprint: Fingerprint::new("ab".repeat(32)),
        outcome,
        created_at: SystemTime::now(),
        completed_at: Some(SystemTime::now()),
        expires_at,
        execution_span: None,
    })
}

fn completed() -> Option<StoredOutcome> {
    Some(StoredOutcome::Completed {
        payload: "1".into(),
    })
}

fn config(ttl: Duration, max_size: u64) -> LocalCacheConfig {
    LocalCacheConfig {
        ttl,
        max_size,
        statistics: true,
        ..Default::default()
    }
}

#[test]
fn processing_records_are_never_cached() {
    let cache = MokaCache::new(&config(Duration::from_secs(60), 100));
    cache.put(&id("p"), record(None, None));
    cache.sync();
    assert!(cache.get(&id("p")).is_none());
    assert_eq!(cache.entry_count(), 0);
}

#[test]
fn terminal_records_are_cached_and_counted() {
    let cache = MokaCache::new(&config(Duration::from_secs(60), 100));
    cache.put(&id("c"), record(completed(), None));
    cache.put(
        &id("r"),
        record(
            Some(StoredOutcome::Rejected {
                code: "NO".into(),
                details: None,
            }),
            None,
        ),
    );
    assert!(cache.get(&id("c")).is_some());
    assert!(cache.get(&id("r")).is_some());
    assert!(cache.get(&id("absent")).is_none());
    let stats = cache.stats().unwrap();
    assert_eq!((stats.hits, stats.misses), (2, 1));
    assert_eq!(
        MokaCache::new(&LocalCacheConfig::default()).stats(),
        None,
        "statistics are off by default"
    );
}

#[test]
fn entries_expire_after_write() {
    let cache = MokaCache::new(&config(Duration::from_millis(50), 100));
    cache.put(&id("ttl"), record(completed(), None));
    assert!(cache.get(&id("ttl")).is_some());
    std::thread::sleep(Duration::from_millis(120));
    assert!(cache.get(&id("ttl")).is_none());
    // moka removes expired entries (and notifies) on its timer wheel, whose finest level is
    // about one second wide.
    for _ in 0..40 {
        cache.sync();
        if cache.stats().unwrap().expirations == 1 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(cache.stats().unwrap().expirations, 1);
}

#[test]
fn entries_never_outlive_the_record() {
    let cache = MokaCache::new(&config(Duration::from_secs(600), 100));
    let soon = SystemTime::now() + Duration::from_millis(50);
    cache.put(&id("soon"), record(completed(), Some(soon)));
    let past = SystemTime::now() - Duration::from_secs(1);
    cache.put(&id("past"), record(completed(), Some(past)));
    assert!(
        cache.get(&id("past")).is_none(),
        "an already expired record is not served"
    );
    assert!(cache.get(&id("soon")).is_some());
    std::thread::sleep(Duration::from_millis(120));
    assert!(cache.get(&id("soon")).is_none(), "outlived expires_at");
}

#[test]
fn size_is_bounded() {
    let cache = MokaCache::new(&config(Duration::from_secs(600), 10));
    for i in 0..200 {
        cache.put(&id(&format!("k{i}")), record(completed(), None));
        // Touch a few keys so the admission policy has something to prefer.
        let _ = cache.get(&id("k0"));
    }
    cache.sync();
    assert!(cache.entry_count() <= 10, "{} entries", cache.entry_count());
    assert!(cache.stats().unwrap().evictions > 0);
}

/// Large entries (a stored 4xx that echoes a large request body) are weighed by their bytes:
/// with the default settings, 80 records of 1 MiB never hold more than the 64 MiB budget.
#[test]
fn the_default_cache_is_bounded_in_bytes_not_only_in_entries() {
    let cache = MokaCache::new(&LocalCacheConfig::default());
    let budget = 64 * 1024 * 1024;
    for i in 0..80 {
        let payload = format!("\"{}\"", "x".repeat(1024 * 1024));
        let big = record(Some(StoredOutcome::Completed { payload }), None);
        cache.put(&id(&format!("big-{i}")), big);
        cache.sync();
    }
    let held = cache.entry_count();
    assert!(
        held * 1024 * 1024 <= budget,
        "{held} entries of 1 MiB kept, more than the 64 MiB budget"
    );
    assert!(cache.weighted_size() <= budget, "{}", cache.weighted_size());
}

/// Small entries still count against `max-size`: each weighs at least `max-bytes / max-size`.
#[test]
fn small_entries_are_bounded_by_count_and_large_ones_by_bytes() {
    let cache = MokaCache::new(&LocalCacheConfig {
        max_size: 100,
        max_bytes: 1024 * 1024,
        ..Default::default()
    });
    for i in 0..500 {
        cache.put(&id(&format!("small-{i}")), record(completed(), None));
    }
    cache.sync();
    assert!(cache.entry_count() <= 100, "{}", cache.entry_count());
    for i in 0..50 {
        let payload = format!("\"{}\"", "y".repeat(100 * 1024));
        cache.put(
            &id(&format!("large-{i}")),
            record(Some(StoredOutcome::Completed { payload }), None),
        );
        cache.sync();
    }
    assert!(
        cache.weighted_size() <= 1024 * 1024,
        "{}",
        cache.weighted_size()
    );
}

/// In `execute`: a rolled-back transaction leaves the cache empty; after a commit the replay
/// comes from L1 and never reaches the store (the row is gone from the database).
#[tokio::test]
async fn replays_from_l1_after_commit_only() {
    let pool = idempotency_testing::pg_pool().await;
    let store = PgStore::new(pool.clone());
    store.create_schema().await.unwrap();
    let cache = MokaCache::new(&config(Duration::from_secs(600), 100));
    let service = IdempotencyService::builder(store)
        .local_cache(cache.clone())
        .build();
    let key = IdempotencyKey::new("l1").unwrap();
    let request = serde_json::json!({"a": 1});

    let mut tx = service.begin().await.unwrap();
    let _: Outcome<i32> = service
        .execute_in(
            &mut tx,
            Call::new("OP", key.clone(), &request),
            async |_c| Ok::<_, idempotency_core::Error>(ExecutionResult::success(1)),
        )
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    cache.sync();
    assert_eq!(cache.entry_count(), 0);

    let first: Outcome<i32> = service
        .execute(Call::new("OP", key.clone(), &request), async |_c| {
            Ok::<_, idempotency_core::Error>(ExecutionResult::success(2))
        })
        .await
        .unwrap();
    assert!(first.is_executed());
    sqlx_delete_all(&pool).await;
    // An L1 hit needs no database at all: not even a transaction.
    pool.close().await;
    let replay: Outcome<i32> = service
        .execute(Call::new("OP", key.clone(), &request), async |_c| {
            Ok::<_, idempotency_core::Error>(ExecutionResult::success(3))
        })
        .await
        .unwrap();
    assert_eq!(replay.origin(), Origin::Replayed { from: Level::Local });
    assert_eq!(replay.into_result().into_result().unwrap(), 2);
}

async fn sqlx_delete_all(pool: &sqlx::PgPool) {
    sqlx::query("DELETE FROM idempotency_records")
        .execute(pool)
        .await
        .unwrap();
}
