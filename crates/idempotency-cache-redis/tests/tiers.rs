//! The cache scenarios of the reference, on real Redis, moka and PostgreSQL.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

use std::time::Duration;

use idempotency_cache_moka::MokaCache;
use idempotency_cache_redis::fred::prelude::{
    ClientLike, HashesInterface, KeysInterface, ListInterface,
};
use idempotency_cache_redis::{BreakerState, RedisCache};
use idempotency_core::config::{CircuitBreakerConfig, DistributedCacheConfig, LocalCacheConfig};
use idempotency_core::{
    Call, DistributedCache, Error, ExecutionResult, Fingerprint, FingerprintStrategy,
    IdempotencyKey, IdempotencyRecord, IdempotencyService, JcsFingerprint, JsonSerializer, Level,
    LocalCache, Operation, Origin, Outcome, RecordId, ResultSerializer, Scope, StoredOutcome,
};
use idempotency_pg::PgStore;
use idempotency_pg::sqlx::PgPool;
use serde_json::value::RawValue;

async fn redis(config: DistributedCacheConfig) -> RedisCache {
    let config = DistributedCacheConfig {
        key_prefix: format!("{}:", idempotency_testing::unique_name("it")),
        timeout: Duration::from_secs(2),
        ..config
    };
    let cache = RedisCache::connect(&idempotency_testing::redis_url(), &config).unwrap();
    tokio::time::timeout(Duration::from_secs(10), cache.client().wait_for_connect())
        .await
        .unwrap_or_else(|_| {
            panic!(
                "Redis at {} did not answer; start it or set REDIS_URL",
                idempotency_testing::redis_url()
            )
        })
        .unwrap();
    cache
}

fn moka() -> MokaCache {
    MokaCache::new(&LocalCacheConfig {
        statistics: true,
        ..Default::default()
    })
}

async fn store() -> (PgPool, PgStore) {
    let pool = idempotency_testing::pg_pool().await;
    let store = PgStore::new(pool.clone());
    store.create_schema().await.unwrap();
    (pool, store)
}

fn id(op: &str, scope: &str, key: &str) -> RecordId {
    RecordId::new(
        Operation::new(op).unwrap(),
        Scope::new(scope).unwrap(),
        IdempotencyKey::new(key).unwrap(),
    )
}

async fn pay<L: LocalCache, D: DistributedCache>(
    service: &IdempotencyService<PgStore, L, D>,
    key: &str,
    amount: i64,
) -> Outcome<serde_json::Value> {
    service
        .execute(
            Call::new("PAY", IdempotencyKey::new(key).unwrap(), &amount),
            async |_c| {
                if amount > 1000 {
                    return Ok(ExecutionResult::rejected_with(
                        "INSUFFICIENT_FUNDS",
                        &serde_json::json!({"requested": amount}),
                    )
                    .unwrap());
                }
                Ok::<_, Error>(ExecutionResult::success(
                    serde_json::json!({"paid": amount}),
                ))
            },
        )
        .await
        .unwrap()
}

async fn in_redis(cache: &RedisCache, id: &RecordId) -> Option<String> {
    cache
        .client()
        .get(cache.key_for(id).as_str())
        .await
        .unwrap()
}

async fn wipe_store(pool: &PgPool) {
    idempotency_pg::sqlx::query("DELETE FROM idempotency_records")
        .execute(pool)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_fresh_outcome_fills_both_caches_after_commit_and_not_before() {
    let (_pool, store) = store().await;
    let (l1, l2) = (moka(), redis(Default::default()).await);
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
    assert!(in_redis(&l2, &record).await.unwrap().starts_with("v1:"));
    assert!(l1.get(&record).is_some());
}

#[tokio::test]
async fn a_redis_hit_fills_moka_without_touching_the_store() {
    let (pool, store) = store().await;
    let l2 = redis(Default::default()).await;
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

#[tokio::test]
async fn a_store_hit_fills_both_caches() {
    let (_pool, store) = store().await;
    let no_cache = IdempotencyService::new(store.clone());
    assert!(pay(&no_cache, "stored", 20).await.is_executed());

    let (l1, l2) = (moka(), redis(Default::default()).await);
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

#[tokio::test]
async fn an_l1_hit_skips_l2_and_the_store() {
    let (pool, store) = store().await;
    let (l1, l2) = (moka(), redis(Default::default()).await);
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

#[tokio::test]
async fn rejected_outcomes_round_trip_through_redis() {
    let (pool, store) = store().await;
    let l2 = redis(Default::default()).await;
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

#[tokio::test]
async fn a_rejection_with_null_details_replays_from_redis_with_null_details() {
    let (pool, store) = store().await;
    let l2 = redis(Default::default()).await;
    let first = IdempotencyService::builder(store.clone())
        .distributed_cache(l2.clone())
        .build();
    let reject = async |_c: &mut _| {
        Ok::<_, Error>(
            ExecutionResult::<i32>::rejected_with("NO", &serde_json::Value::Null).unwrap(),
        )
    };
    let call = || Call::new("PAY", IdempotencyKey::new("null-details").unwrap(), &1);
    let rejected = first.execute(call(), reject).await.unwrap();
    let details = rejected.result().rejection().unwrap().details();
    assert_eq!(details, Some(&serde_json::Value::Null));
    wipe_store(&pool).await;
    let other = IdempotencyService::builder(store)
        .distributed_cache(l2)
        .build();
    let replay = other.execute(call(), reject).await.unwrap();
    assert_eq!(
        replay.origin(),
        Origin::Replayed {
            from: Level::Distributed
        }
    );
    assert_eq!(replay.result(), rejected.result());
}

#[tokio::test]
async fn the_ttl_is_set_in_redis_and_never_exceeds_the_record() {
    let (_pool, store) = store().await;
    let l2 = redis(DistributedCacheConfig {
        ttl: Duration::from_secs(3600),
        ..Default::default()
    })
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
    }
}

/// A success value as its action serialized it: object keys out of order, a number spelled `1e2`,
/// a string holding U+0000. A replay must give back these bytes, not an equal JSON value.
const AWKWARD: &str = r#"{"zebra":1,"apple":1e2,"text":"a\u0000b","nested":{"y":[1e2],"x":null}}"#;

fn awkward() -> Box<RawValue> {
    RawValue::from_string(AWKWARD.to_owned()).unwrap()
}

async fn pay_awkward<L: LocalCache, D: DistributedCache>(
    service: &IdempotencyService<PgStore, L, D>,
    key: &str,
) -> Outcome<Box<RawValue>> {
    service
        .execute(
            Call::new("PAY", IdempotencyKey::new(key).unwrap(), &1),
            async |_c| Ok::<_, Error>(ExecutionResult::success(awkward())),
        )
        .await
        .unwrap()
}

fn replayed_text(outcome: &Outcome<Box<RawValue>>) -> &str {
    outcome.result().value().unwrap().get()
}

/// The caches alone, whatever the store does to a payload: the record the first answer stores
/// (its value serialized as the service does) goes into Redis, and replays from Redis, then from
/// moka, give back the same bytes.
#[tokio::test]
async fn a_success_value_replays_byte_identical_from_redis_and_moka() {
    let (_pool, store) = store().await;
    let l2 = redis(Default::default()).await;
    let first_answer = JsonSerializer.serialize(&awkward()).unwrap();
    assert_eq!(first_answer, AWKWARD);
    let request = serde_json::to_value(1).unwrap();
    let stored = IdempotencyRecord {
        fingerprint: JcsFingerprint::default().fingerprint(&request).unwrap(),
        outcome: Some(StoredOutcome::Completed {
            payload: first_answer.clone(),
        }),
        created_at: std::time::SystemTime::now(),
        completed_at: Some(std::time::SystemTime::now()),
        expires_at: None,
    };
    l2.put(&id("PAY", "", "awkward"), &stored).await.unwrap();

    let service = IdempotencyService::builder(store)
        .local_cache(moka())
        .distributed_cache(l2)
        .build();
    let from_redis = pay_awkward(&service, "awkward").await;
    assert_eq!(
        from_redis.origin(),
        Origin::Replayed {
            from: Level::Distributed
        }
    );
    assert_eq!(replayed_text(&from_redis), first_answer);
    let from_moka = pay_awkward(&service, "awkward").await;
    assert_eq!(from_moka.origin(), Origin::Replayed { from: Level::Local });
    assert_eq!(replayed_text(&from_moka), first_answer);
}

/// The whole path: executed once (stored in PostgreSQL, then written to both caches), replayed
/// by another instance from Redis, then from its moka, then from the store alone.
#[tokio::test]
#[ignore = "the PostgreSQL store keeps payloads as JSONB, which refuses \\u0000 and rewrites \
            numbers and key order; runs once payloads are stored as json text"]
async fn a_success_value_replays_byte_identical_through_every_tier() {
    let (_pool, store) = store().await;
    let l2 = redis(Default::default()).await;
    let first = IdempotencyService::builder(store.clone())
        .local_cache(moka())
        .distributed_cache(l2.clone())
        .build();
    let executed = pay_awkward(&first, "awkward-all").await;
    assert!(executed.is_executed());
    let first_answer = JsonSerializer
        .serialize(executed.result().value().unwrap())
        .unwrap();
    assert_eq!(first_answer, AWKWARD);

    let other = IdempotencyService::builder(store.clone())
        .local_cache(moka())
        .distributed_cache(l2)
        .build();
    let from_redis = pay_awkward(&other, "awkward-all").await;
    assert_eq!(
        from_redis.origin(),
        Origin::Replayed {
            from: Level::Distributed
        }
    );
    assert_eq!(replayed_text(&from_redis), first_answer);
    let from_moka = pay_awkward(&other, "awkward-all").await;
    assert_eq!(from_moka.origin(), Origin::Replayed { from: Level::Local });
    assert_eq!(replayed_text(&from_moka), first_answer);

    let from_store = pay_awkward(&IdempotencyService::new(store), "awkward-all").await;
    assert_eq!(
        from_store.origin(),
        Origin::Replayed {
            from: Level::Persistence
        }
    );
    assert_eq!(replayed_text(&from_store), first_answer);
}

#[tokio::test]
async fn a_processing_record_is_never_cached() {
    let l2 = redis(Default::default()).await;
    let processing = id("PAY", "", "processing");
    l2.put(&processing, &record(None)).await.unwrap();
    assert!(in_redis(&l2, &processing).await.is_none());
}

#[tokio::test]
async fn colliding_triples_get_their_own_entries() {
    let (pool, store) = store().await;
    let l2 = redis(Default::default()).await;
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

#[tokio::test]
async fn a_corrupt_entry_is_deleted_counted_and_read_as_a_miss() {
    let (_pool, store) = store().await;
    let l2 = redis(DistributedCacheConfig {
        failure_policy: idempotency_core::FailurePolicy::FailFast,
        ..Default::default()
    })
    .await;
    let service = IdempotencyService::new(store.clone());
    pay(&service, "corrupt", 7).await;
    let key = l2.key_for(&id("PAY", "", "corrupt"));
    let _: () = l2
        .client()
        .set(key.as_str(), "v1:{not json", None, None, false)
        .await
        .unwrap();

    let cached = IdempotencyService::builder(store)
        .distributed_cache(l2.clone())
        .build();
    let replay = pay(&cached, "corrupt", 7).await;
    assert_eq!(
        replay.origin(),
        Origin::Replayed {
            from: Level::Persistence
        },
        "corrupt is a miss even in fail-fast"
    );
    assert_eq!(l2.stats().corrupt, 1);
    let refilled = in_redis(&l2, &id("PAY", "", "corrupt")).await.unwrap();
    assert!(
        refilled.starts_with("v1:{"),
        "the corrupt entry was replaced: {refilled}"
    );
}

/// Puts what `plant` writes at the key of a stored record, then replays that record through a
/// fail-fast L2 whose breaker opens on the first failure: the entry must read as a corrupt miss
/// (the database answers), be counted, be replaced, and leave the breaker closed.
async fn a_foreign_value_is_a_corrupt_miss<F: Future<Output = ()>>(
    key: &str,
    plant: impl FnOnce(RedisCache, String) -> F,
) {
    let (_pool, store) = store().await;
    let l2 = redis(DistributedCacheConfig {
        failure_policy: idempotency_core::FailurePolicy::FailFast,
        circuit_breaker: CircuitBreakerConfig {
            failure_threshold: 1,
            ..Default::default()
        },
        ..Default::default()
    })
    .await;
    pay(&IdempotencyService::new(store.clone()), key, 7).await;
    plant(l2.clone(), l2.key_for(&id("PAY", "", key))).await;

    let cached = IdempotencyService::builder(store)
        .distributed_cache(l2.clone())
        .build();
    let replay = pay(&cached, key, 7).await;
    assert_eq!(
        replay.origin(),
        Origin::Replayed {
            from: Level::Persistence
        },
        "a corrupt entry is a miss even in fail-fast"
    );
    let stats = l2.stats();
    assert_eq!((stats.corrupt, stats.errors), (1, 0), "{stats:?}");
    assert_eq!(l2.breaker_state(), BreakerState::Closed { failures: 0 });
    let refilled = in_redis(&l2, &id("PAY", "", key)).await.unwrap();
    assert!(refilled.starts_with("v1:{"), "not replaced: {refilled}");
    assert_eq!(
        pay(&cached, key, 7).await.origin(),
        Origin::Replayed {
            from: Level::Distributed
        }
    );
}

#[tokio::test]
async fn a_value_that_is_not_utf8_is_a_corrupt_miss_not_a_backend_error() {
    a_foreign_value_is_a_corrupt_miss("bytes", async |l2, key| {
        let bytes: &[u8] = b"v1:\xff\xfe{";
        let _: () = l2
            .client()
            .set(key.as_str(), bytes, None, None, false)
            .await
            .unwrap();
    })
    .await;
}

#[tokio::test]
async fn a_key_holding_a_list_is_a_corrupt_miss_not_a_backend_error() {
    a_foreign_value_is_a_corrupt_miss("list", async |l2, key| {
        let _: i64 = l2.client().rpush(key.as_str(), "v1:{}").await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn a_key_holding_a_hash_is_a_corrupt_miss_not_a_backend_error() {
    a_foreign_value_is_a_corrupt_miss("hash", async |l2, key| {
        let _: i64 = l2.client().hset(key.as_str(), ("f", "v")).await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn another_format_version_is_a_miss_not_an_error() {
    let l2 = redis(Default::default()).await;
    let other = id("PAY", "", "v9");
    let key = l2.key_for(&other);
    let _: () = l2
        .client()
        .set(key.as_str(), "v9:{\"future\":true}", None, None, false)
        .await
        .unwrap();
    assert_eq!(l2.get(&other).await.unwrap(), None);
    assert!(
        in_redis(&l2, &other).await.is_some(),
        "another version's entry is left alone"
    );
    assert_eq!(l2.stats().corrupt, 0);
}

/// The cache takes the fred client the application already has: here a connection pool.
#[tokio::test]
async fn a_fred_pool_works_as_well_as_a_client() {
    use idempotency_cache_redis::fred::prelude::{Builder, Config};
    let (db, store) = store().await;
    let fred_pool =
        Builder::from_config(Config::from_url(&idempotency_testing::redis_url()).unwrap())
            .build_pool(2)
            .unwrap();
    fred_pool.init().await.unwrap();
    let config = DistributedCacheConfig {
        key_prefix: format!("{}:", idempotency_testing::unique_name("pool")),
        timeout: Duration::from_secs(2),
        ..Default::default()
    };
    let l2 = RedisCache::new(fred_pool, &config);
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
