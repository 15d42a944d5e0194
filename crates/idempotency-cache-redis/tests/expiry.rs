//! An entry never outlives its record: its expiry is absolute (`PXAT`), a write the cache gave
//! up on is never sent later, and an entry read after its record's `expires_at` is a miss.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

mod support;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use idempotency_cache_redis::fred::prelude::{ClientLike, KeysInterface};
use idempotency_cache_redis::{DistributedCacheConfig, RedisCache};
use idempotency_core::{CacheError, DistributedCache};

use support::server::OwnRedis;
use support::{Target, completed as record, id, redis};

fn unix_ms(time: SystemTime) -> i64 {
    i64::try_from(time.duration_since(UNIX_EPOCH).unwrap().as_millis()).unwrap()
}

/// The entry expires exactly when its record does (when that is sooner than the TTL), also
/// when the write reaches Redis late: Redis is down when `put` writes, and the write (with a
/// timeout long enough to wait) is sent after Redis is back a second later. A relative
/// lifetime, computed before the wait, would keep the entry a second past its record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_entry_expires_at_its_records_expiry_even_when_written_late() {
    let mut server = OwnRedis::start("pxat", &[]).await;
    let config = DistributedCacheConfig {
        key_prefix: format!("{}:", idempotency_testing::unique_name("pxat")),
        timeout: Duration::from_secs(20),
        secret: Some(support::secret()),
        ..Default::default()
    };
    let cache = RedisCache::connect(&server.url(), &config).unwrap();
    tokio::time::timeout(Duration::from_secs(10), cache.client().wait_for_connect())
        .await
        .unwrap()
        .unwrap();
    let id = id("PAY", "", "late");
    let expires_at = SystemTime::now() + Duration::from_secs(60) + Duration::from_micros(777);
    let record = idempotency_core::IdempotencyRecord {
        expires_at: Some(expires_at),
        ..record(1)
    };
    server.kill();
    let put = tokio::spawn({
        let (cache, id, record) = (cache.clone(), id.clone(), record.clone());
        async move { cache.put(&id, &record).await }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    server.restart().await;
    put.await.unwrap().unwrap();
    let at: i64 = cache
        .client()
        .custom(
            idempotency_cache_redis::fred::cmd!("PEXPIRETIME"),
            vec![cache.key_for(&id)],
        )
        .await
        .unwrap();
    assert_eq!(at, unix_ms(expires_at), "PEXPIRETIME");
}

/// An entry whose record has expired reads as a miss, even if Redis still holds it (written by
/// a release that wrote a relative expiry late, or a key someone made persistent).
#[tokio::test]
async fn an_entry_read_after_its_records_expiry_is_a_miss() {
    let cache = redis(Target::Standalone, DistributedCacheConfig::default()).await;
    let id = id("PAY", "", &idempotency_testing::unique_name("expired"));
    let record = idempotency_core::IdempotencyRecord {
        expires_at: Some(SystemTime::now() + Duration::from_millis(300)),
        ..record(1)
    };
    cache.put(&id, &record).await.unwrap();
    let kept: bool = cache.client().persist(cache.key_for(&id)).await.unwrap();
    assert!(kept, "the entry was written");
    let read = cache
        .get(&id)
        .await
        .unwrap()
        .expect("the entry, while its record lives");
    assert_eq!(read.outcome, record.outcome);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        cache.get(&id).await.unwrap(),
        None,
        "an entry past its record's expires_at replayed"
    );
}

/// Redis is down when `put` writes: the write times out, and is never sent after Redis comes
/// back (fred would otherwise keep it queued and send it after reconnecting, so the entry
/// would outlive a record deleted meanwhile).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_given_up_after_the_timeout_is_never_sent_later() {
    let mut server = OwnRedis::start("given-up", &[]).await;
    let config = DistributedCacheConfig {
        key_prefix: format!("{}:", idempotency_testing::unique_name("given-up")),
        timeout: Duration::from_millis(50),
        secret: Some(support::secret()),
        ..Default::default()
    };
    let cache = RedisCache::connect(&server.url(), &config).unwrap();
    tokio::time::timeout(Duration::from_secs(10), cache.client().wait_for_connect())
        .await
        .unwrap()
        .unwrap();
    let given_up = id("PAY", "", "given-up");
    server.kill();
    let error = cache.put(&given_up, &record(1)).await.unwrap_err();
    assert!(
        matches!(error, CacheError::Timeout(_) | CacheError::Backend(_)),
        "{error:?}"
    );
    server.restart().await;
    // Once the client serves again, whatever it kept queued has been sent.
    let started = Instant::now();
    while cache.get(&id("PAY", "", "probe")).await.is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no reconnection"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let stored: Option<String> = cache.client().get(cache.key_for(&given_up)).await.unwrap();
    assert_eq!(stored, None, "the given-up write reached Redis after all");
}
