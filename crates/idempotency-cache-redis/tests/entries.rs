//! What a Redis entry holds and how it reads back, on real Redis, moka and PostgreSQL: values
//! kept byte for byte, `null` rejection details, corrupt and foreign entries, other versions.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

mod support;

use idempotency_cache_redis::fred::prelude::{
    Builder, HashesInterface, KeysInterface, ListInterface,
};
use idempotency_cache_redis::{BreakerState, CacheSecret, RedisCache};
use idempotency_cache_redis::{CircuitBreakerConfig, DistributedCacheConfig};
use idempotency_core::{
    Call, DistributedCache, Error, ExecutionResult, FingerprintStrategy, IdempotencyKey,
    IdempotencyRecord, IdempotencyService, JcsFingerprint, JsonSerializer, Level, LocalCache,
    Origin, Outcome, ResultSerializer, StoredOutcome,
};
use idempotency_pg::PgStore;
use serde_json::value::RawValue;

use support::{Target, id, in_redis, moka, on_both, pay, redis, store, wipe_store};

/// A response the service never produced that the forged entries below hold: `666` for `7`.
fn forged_record(request: i64) -> IdempotencyRecord {
    let request = serde_json::to_value(request).unwrap();
    IdempotencyRecord {
        fingerprint: JcsFingerprint::default().fingerprint(&request).unwrap(),
        outcome: Some(StoredOutcome::Completed {
            payload: "666".to_owned(),
        }),
        created_at: std::time::SystemTime::now(),
        completed_at: Some(std::time::SystemTime::now()),
        expires_at: None,
        execution_span: None,
    }
}

/// A response the service never produced, as someone who can write to Redis but does not hold
/// the secret would plant it: the current format, tagged with another secret.
async fn a_forged_entry_is_never_replayed_and_is_deleted_and_counted(target: Target) {
    let (pool, store) = store().await;
    let l2 = redis(target, Default::default()).await;
    let attacker = RedisCache::new(
        l2.client().clone(),
        &DistributedCacheConfig {
            key_prefix: l2
                .key_for(&id("PAY", "", "forged-tag"))
                .strip_suffix("3:PAY:0::forged-tag")
                .unwrap()
                .to_owned(),
            secret: Some(CacheSecret::new("the-attackers-own-secret-0123456789").unwrap()),
            ..Default::default()
        },
    )
    .unwrap();
    let forged_tag = id("PAY", "", "forged-tag");
    attacker.put(&forged_tag, &forged_record(7)).await.unwrap();
    let planted = in_redis(&l2, &forged_tag).await.unwrap();

    let service = IdempotencyService::builder(store)
        .local_cache(moka())
        .distributed_cache(l2.clone())
        .build();
    let outcome = pay(&service, "forged-tag", 7).await;
    assert!(
        outcome.is_executed(),
        "the action runs, the forgery is not replayed: {:?}",
        outcome.origin()
    );
    assert_eq!(
        outcome.result().value(),
        Some(&serde_json::json!({"paid": 7}))
    );
    let stats = l2.stats();
    assert_eq!((stats.forged, stats.corrupt), (1, 1), "{stats:?}");
    let rewritten = in_redis(&l2, &forged_tag).await.unwrap();
    assert_ne!(
        rewritten, planted,
        "the forgery was replaced by the real outcome"
    );
    // The real outcome replays from L1; the forgery never reached L1.
    wipe_store(&pool).await;
    let replay = pay(&service, "forged-tag", 7).await;
    assert_eq!(replay.origin(), Origin::Replayed { from: Level::Local });
    assert_eq!(
        replay.result().value(),
        Some(&serde_json::json!({"paid": 7}))
    );
}

/// An entry in the format before the tag (`v1:`, no tag), as a release before it wrote it, or
/// as anyone who can write to Redis could plant it: like another version's entry it is a miss,
/// never a replay, left in place and not counted (during a rolling deploy the older release's
/// entries are not forgeries), and the request's own outcome overwrites it.
async fn an_untagged_v1_entry_is_a_miss_never_replayed_and_overwritten_by_the_outcome(
    target: Target,
) {
    let (pool, store) = store().await;
    let l2 = redis(target, Default::default()).await;
    let untagged = id("PAY", "", "forged-v1");
    let planted = format!(
        r#"v1:{{"f":"{}","s":"C","p":666,"t":[1,1,null]}}"#,
        forged_record(7).fingerprint.as_str()
    );
    let key = l2.key_for(&untagged);
    let _: () = l2
        .client()
        .set(key.as_str(), planted.as_str(), None, None, false)
        .await
        .unwrap();
    assert_eq!(l2.get(&untagged).await.unwrap(), None, "a miss");
    assert_eq!(
        in_redis(&l2, &untagged).await.as_deref(),
        Some(planted.as_str()),
        "left in place"
    );
    let stats = l2.stats();
    assert_eq!((stats.forged, stats.corrupt), (0, 0), "{stats:?}");

    let service = IdempotencyService::builder(store)
        .local_cache(moka())
        .distributed_cache(l2.clone())
        .build();
    let outcome = pay(&service, "forged-v1", 7).await;
    assert!(
        outcome.is_executed(),
        "the action runs, the v1 entry is not replayed: {:?}",
        outcome.origin()
    );
    assert_eq!(
        outcome.result().value(),
        Some(&serde_json::json!({"paid": 7}))
    );
    let rewritten = in_redis(&l2, &untagged).await.unwrap();
    assert!(
        rewritten.starts_with("v3:"),
        "the outcome overwrote it: {rewritten}"
    );
    let stats = l2.stats();
    assert_eq!((stats.forged, stats.corrupt), (0, 0), "{stats:?}");
    wipe_store(&pool).await;
    let replay = pay(&service, "forged-v1", 7).await;
    assert_eq!(replay.origin(), Origin::Replayed { from: Level::Local });
    assert_eq!(
        replay.result().value(),
        Some(&serde_json::json!({"paid": 7}))
    );
}

/// There is no cache without a secret: `new` and `connect` refuse the configuration (and
/// `connect` before it connects anywhere), so no entry is ever tagged with an empty key that
/// anyone who can write to Redis could reproduce.
#[tokio::test]
async fn without_a_secret_there_is_no_cache() {
    let url = idempotency_testing::redis_url();
    let refused = RedisCache::connect(&url, &DistributedCacheConfig::default());
    assert!(
        matches!(refused, Err(idempotency_cache_redis::Error::NoSecret)),
        "{:?}",
        refused.err()
    );
    let client = Builder::from_config(idempotency_cache_redis::client_config(&url).unwrap())
        .build()
        .unwrap();
    let refused = RedisCache::new(client, &DistributedCacheConfig::default());
    assert!(matches!(
        refused,
        Err(idempotency_cache_redis::Error::NoSecret)
    ));
    let message = idempotency_cache_redis::Error::NoSecret.to_string();
    assert!(
        message.contains("idempotency.distributed-cache.secret"),
        "{message}"
    );
}

async fn a_rejection_with_null_details_replays_from_redis_with_null_details(target: Target) {
    let (pool, store) = store().await;
    let l2 = redis(target, Default::default()).await;
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
async fn a_success_value_replays_byte_identical_from_redis_and_moka(target: Target) {
    let (_pool, store) = store().await;
    let l2 = redis(target, Default::default()).await;
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
        execution_span: None,
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
async fn a_success_value_replays_byte_identical_through_every_tier(target: Target) {
    let (_pool, store) = store().await;
    let l2 = redis(target, Default::default()).await;
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

async fn a_corrupt_entry_is_deleted_counted_and_read_as_a_miss(target: Target) {
    let (_pool, store) = store().await;
    let l2 = redis(
        target,
        DistributedCacheConfig {
            failure_policy: idempotency_core::FailurePolicy::FailFast,
            ..Default::default()
        },
    )
    .await;
    let service = IdempotencyService::new(store.clone());
    pay(&service, "corrupt", 7).await;
    let key = l2.key_for(&id("PAY", "", "corrupt"));
    let _: () = l2
        .client()
        .set(key.as_str(), "v3:{not json", None, None, false)
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
        refilled.starts_with("v3:"),
        "the corrupt entry was replaced: {refilled}"
    );
}

/// Puts what `plant` writes at the key of a stored record, then replays that record through a
/// fail-fast L2 whose breaker opens on the first failure: the entry must read as a corrupt miss
/// (the database answers), be counted, be replaced, and leave the breaker closed.
async fn a_foreign_value_is_a_corrupt_miss<F: Future<Output = ()>>(
    target: Target,
    key: &str,
    plant: impl FnOnce(RedisCache, String) -> F,
) {
    let (_pool, store) = store().await;
    let l2 = redis(
        target,
        DistributedCacheConfig {
            failure_policy: idempotency_core::FailurePolicy::FailFast,
            circuit_breaker: CircuitBreakerConfig {
                failure_threshold: 1,
                ..Default::default()
            },
            ..Default::default()
        },
    )
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
    assert!(refilled.starts_with("v3:"), "not replaced: {refilled}");
    assert_eq!(
        pay(&cached, key, 7).await.origin(),
        Origin::Replayed {
            from: Level::Distributed
        }
    );
}

async fn a_value_that_is_not_utf8_is_a_corrupt_miss_not_a_backend_error(target: Target) {
    a_foreign_value_is_a_corrupt_miss(target, "bytes", async |l2, key| {
        let bytes: &[u8] = b"v1:\xff\xfe{";
        let _: () = l2
            .client()
            .set(key.as_str(), bytes, None, None, false)
            .await
            .unwrap();
    })
    .await;
}

async fn a_key_holding_a_list_is_a_corrupt_miss_not_a_backend_error(target: Target) {
    a_foreign_value_is_a_corrupt_miss(target, "list", async |l2, key| {
        let _: i64 = l2.client().rpush(key.as_str(), "v1:{}").await.unwrap();
    })
    .await;
}

async fn a_key_holding_a_hash_is_a_corrupt_miss_not_a_backend_error(target: Target) {
    a_foreign_value_is_a_corrupt_miss(target, "hash", async |l2, key| {
        let _: i64 = l2.client().hset(key.as_str(), ("f", "v")).await.unwrap();
    })
    .await;
}

async fn another_format_version_is_a_miss_not_an_error(target: Target) {
    let l2 = redis(target, Default::default()).await;
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

on_both!(
    a_forged_entry_is_never_replayed_and_is_deleted_and_counted,
    an_untagged_v1_entry_is_a_miss_never_replayed_and_overwritten_by_the_outcome,
    a_rejection_with_null_details_replays_from_redis_with_null_details,
    a_success_value_replays_byte_identical_from_redis_and_moka,
    a_success_value_replays_byte_identical_through_every_tier,
    a_corrupt_entry_is_deleted_counted_and_read_as_a_miss,
    a_value_that_is_not_utf8_is_a_corrupt_miss_not_a_backend_error,
    a_key_holding_a_list_is_a_corrupt_miss_not_a_backend_error,
    a_key_holding_a_hash_is_a_corrupt_miss_not_a_backend_error,
    another_format_version_is_a_miss_not_an_error,
);
