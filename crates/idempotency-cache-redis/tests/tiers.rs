//! The cache scenarios of the reference, on real Redis, moka and PostgreSQL.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

mod support;

use std::time::Duration;

use idempotency_cache_redis::DistributedCacheConfig;
use idempotency_cache_redis::RedisCache;
use idempotency_cache_redis::fred::prelude::{ClientLike, KeysInterface};
use idempotency_core::{
    Call, DistributedCache, Error, ExecutionResult, Fingerprint, IdempotencyKey, IdempotencyRecord,
    IdempotencyService, Level, LocalCache, Origin, Outcome, Scope, StoredOutcome,
};

use support::{Target, id, in_redis, moka, on_both, pay, redis, store, wipe_store};

async fn a_fresh_outcome_fills_both_caches_after_commit_and_not_before(target: Target) {
    let (_pool, store) = store().await;
    let (l1, l2) = (moka(), redis(target, Default::default()).await);
    let service = IdempotencyService::builder(store)
        .local_cache(l1.clone())
        .distributed_cache(l2.clone())
        .build();
    let record = id("PAY", "", "fresh");

    let mut tx = service.begin().await.unwrap();
    let _: Outcome<i32> = service
        .execute_in(
            &mut tx,
            Call::new("PAY", record.key.clone(), &1),
            async |_c| Ok::<_, Error>(ExecutionResult::success(1)),
        )
        .await
        .unwrap();
    assert!(
        in_redis(&l2, &record).await.is_none(),
        "written to Redis before the commit"
    );
    assert!(
        l1.get(&record).is_none(),
        "written to moka before the commit"
    );
    tx.rollback().await.unwrap();
    assert!(
        in_redis(&l2, &record).await.is_none(),
        "a rolled-back outcome reached Redis"
    );
    assert!(
        l1.get(&record).is_none(),
        "a rolled-back outcome reached moka"
    );

    let _: Outcome<i32> = service
        .execute(Call::new("PAY", record.key.clone(), &1), async |_c| {
            Ok::<_, Error>(ExecutionResult::success(1))
        })
        .await
        .unwrap();
    assert!(in_redis(&l2, &record).await.unwrap().starts_with("v3:"));
    assert!(l1.get(&record).is_some());
}

async fn a_redis_hit_fills_moka_without_touching_the_store(target: Target) {
    let (pool, store) = store().await;
    let l2 = redis(target, Default::default()).await;
    let first = IdempotencyService::builder(store.clone())
        .local_cache(moka())
        .distributed_cache(l2.clone())
        .build();
    assert!(pay(&first, "shared", 10).await.is_executed());
    wipe_store(&pool).await; // only Redis can answer now

    let other_l1 = moka();
    let other_instance = IdempotencyService::builder(store)
        .local_cache(other_l1.clone())
        .distributed_cache(l2)
        .build();
    let replay = pay(&other_instance, "shared", 10).await;
    assert_eq!(
        replay.origin(),
        Origin::Replayed {
            from: Level::Distributed
        }
    );
    assert_eq!(
        replay.result().value(),
        Some(&serde_json::json!({"paid": 10}))
    );
    assert!(
        other_l1.get(&id("PAY", "", "shared")).is_some(),
        "the L2 hit was promoted to L1"
    );
    assert_eq!(
        pay(&other_instance, "shared", 10).await.origin(),
        Origin::Replayed { from: Level::Local }
    );
}

async fn a_store_hit_fills_both_caches(target: Target) {
    let (_pool, store) = store().await;
    let no_cache = IdempotencyService::new(store.clone());
    assert!(pay(&no_cache, "stored", 20).await.is_executed());

    let (l1, l2) = (moka(), redis(target, Default::default()).await);
    let cached = IdempotencyService::builder(store)
        .local_cache(l1.clone())
        .distributed_cache(l2.clone())
        .build();
    assert_eq!(
        pay(&cached, "stored", 20).await.origin(),
        Origin::Replayed {
            from: Level::Persistence
        }
    );
    let record = id("PAY", "", "stored");
    assert!(l1.get(&record).is_some());
    assert!(in_redis(&l2, &record).await.is_some());
}

async fn an_l1_hit_skips_l2_and_the_store(target: Target) {
    let (pool, store) = store().await;
    let (l1, l2) = (moka(), redis(target, Default::default()).await);
    let service = IdempotencyService::builder(store)
        .local_cache(l1)
        .distributed_cache(l2.clone())
        .build();
    pay(&service, "hot", 30).await;
    wipe_store(&pool).await;
    let _: i64 = l2
        .client()
        .del(l2.key_for(&id("PAY", "", "hot")).as_str())
        .await
        .unwrap();
    let replay = pay(&service, "hot", 30).await;
    assert_eq!(replay.origin(), Origin::Replayed { from: Level::Local });
}

async fn rejected_outcomes_round_trip_through_redis(target: Target) {
    let (pool, store) = store().await;
    let l2 = redis(target, Default::default()).await;
    let first = IdempotencyService::builder(store.clone())
        .distributed_cache(l2.clone())
        .build();
    let rejected = pay(&first, "poor", 5000).await;
    assert!(rejected.result().is_rejected());
    wipe_store(&pool).await;
    let other = IdempotencyService::builder(store)
        .local_cache(moka())
        .distributed_cache(l2)
        .build();
    let replay = pay(&other, "poor", 5000).await;
    assert_eq!(
        replay.origin(),
        Origin::Replayed {
            from: Level::Distributed
        }
    );
    assert_eq!(replay.result(), rejected.result());
}

async fn the_ttl_is_set_in_redis_and_never_exceeds_the_record(target: Target) {
    let (_pool, store) = store().await;
    let l2 = redis(
        target,
        DistributedCacheConfig {
            ttl: Duration::from_secs(3600),
            ..Default::default()
        },
    )
    .await;
    let service = IdempotencyService::builder(store)
        .distributed_cache(l2.clone())
        .build();
    pay(&service, "ttl", 1).await;
    let pttl: i64 = l2
        .client()
        .pttl(l2.key_for(&id("PAY", "", "ttl")).as_str())
        .await
        .unwrap();
    assert!(pttl > 3_500_000 && pttl <= 3_600_000, "PTTL {pttl}");

    let _: Outcome<i32> = service
        .execute(
            Call::new("PAY", IdempotencyKey::new("short").unwrap(), &1)
                .ttl(Duration::from_secs(30)),
            async |_c| Ok::<_, Error>(ExecutionResult::success(1)),
        )
        .await
        .unwrap();
    let pttl: i64 = l2
        .client()
        .pttl(l2.key_for(&id("PAY", "", "short")).as_str())
        .await
        .unwrap();
    assert!(
        pttl > 0 && pttl <= 30_000,
        "the entry outlives the record: PTTL {pttl}"
    );
}

fn record(outcome: Option<StoredOutcome>) -> IdempotencyRecord {
    IdempotencyRecord {
        fingerprint: Fingerprint::new("a".repeat(64)),
        outcome,
        created_at: std::time::SystemTime::now(),
        completed_at: None,
        expires_at: None,
        execution_span: None,
    }
}

async fn a_processing_record_is_never_cached(target: Target) {
    let l2 = redis(target, Default::default()).await;
    let processing = id("PAY", "", "processing");
    l2.put(&processing, &record(None)).await.unwrap();
    assert!(in_redis(&l2, &processing).await.is_none());
}

async fn colliding_triples_get_their_own_entries(target: Target) {
    let (pool, store) = store().await;
    let l2 = redis(target, Default::default()).await;
    let service = IdempotencyService::builder(store.clone())
        .distributed_cache(l2.clone())
        .build();
    let triples = [("a:b", "", "c"), ("a", "b:", "c")];
    for (i, (op, scope, key)) in triples.iter().enumerate() {
        let _: Outcome<usize> = service
            .execute(
                Call::new(op, IdempotencyKey::new(*key).unwrap(), &0)
                    .scoped(Scope::new(*scope).unwrap()),
                async |_c| Ok::<_, Error>(ExecutionResult::success(i)),
            )
            .await
            .unwrap();
    }
    let (a, b) = (id("a:b", "", "c"), id("a", "b:", "c"));
    assert_ne!(l2.key_for(&a), l2.key_for(&b));
    wipe_store(&pool).await;
    for (i, (op, scope, key)) in triples.iter().enumerate() {
        let replay: Outcome<usize> = service
            .execute(
                Call::new(op, IdempotencyKey::new(*key).unwrap(), &0)
                    .scoped(Scope::new(*scope).unwrap()),
                async |_c| Ok::<_, Error>(ExecutionResult::success(99)),
            )
            .await
            .unwrap();
        assert_eq!(
            replay.origin(),
            Origin::Replayed {
                from: Level::Distributed
            }
        );
        assert_eq!(
            replay.result().value(),
            Some(&i),
            "{op}/{scope}/{key} got another triple's value"
        );
    }
}

/// The cache takes the fred client the application already has: here a connection pool.
async fn a_fred_pool_works_as_well_as_a_client(target: Target) {
    use idempotency_cache_redis::fred::prelude::Builder;
    let (db, store) = store().await;
    let fred_pool =
        Builder::from_config(idempotency_cache_redis::client_config(&target.url()).unwrap())
            .build_pool(2)
            .unwrap();
    fred_pool.init().await.unwrap();
    let config = DistributedCacheConfig {
        key_prefix: format!("{}:", idempotency_testing::unique_name("pool")),
        timeout: Duration::from_secs(2),
        secret: Some(support::secret()),
        ..Default::default()
    };
    let l2 = RedisCache::new(fred_pool, &config).unwrap();
    let first = IdempotencyService::builder(store.clone())
        .distributed_cache(l2.clone())
        .build();
    pay(&first, "pooled", 5).await;
    wipe_store(&db).await; // only Redis, through the pool, can answer now
    let other = IdempotencyService::builder(store)
        .distributed_cache(l2)
        .build();
    assert_eq!(
        pay(&other, "pooled", 5).await.origin(),
        Origin::Replayed {
            from: Level::Distributed
        }
    );
}

on_both!(
    a_fresh_outcome_fills_both_caches_after_commit_and_not_before,
    a_redis_hit_fills_moka_without_touching_the_store,
    a_store_hit_fills_both_caches,
    an_l1_hit_skips_l2_and_the_store,
    rejected_outcomes_round_trip_through_redis,
    the_ttl_is_set_in_redis_and_never_exceeds_the_record,
    a_processing_record_is_never_cached,
    colliding_triples_get_their_own_entries,
    a_fred_pool_works_as_well_as_a_client,
);
