//! Helpers of the integration tests on real Redis, moka and PostgreSQL.

#![allow(dead_code, clippy::unwrap_used)] // each test file uses some; tests fail loudly

use std::time::{Duration, SystemTime};

use idempotency_cache_moka::LocalCacheConfig;
use idempotency_cache_moka::MokaCache;
use idempotency_cache_redis::RedisCache;
use idempotency_cache_redis::fred::prelude::{ClientLike, KeysInterface};
use idempotency_cache_redis::{CacheSecret, DistributedCacheConfig};
use idempotency_core::{
    Call, DistributedCache, Error, ExecutionResult, Fingerprint, IdempotencyKey, IdempotencyRecord,
    IdempotencyService, LocalCache, Operation, Outcome, RecordId, Scope, StoredOutcome,
};
use idempotency_pg::PgStore;
use sqlx::PgPool;

/// The Redis deployment a test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
    /// One Redis server: `REDIS_URL`.
    Standalone,
    /// The shared six-node Redis Cluster: `REDIS_CLUSTER_URL`.
    Cluster,
}

impl Target {
    pub(crate) fn url(self) -> String {
        match self {
            Self::Standalone => idempotency_testing::redis_url(),
            Self::Cluster => cluster::shared_cluster_url(),
        }
    }
}

/// Runs every listed `async fn name(target: Target)` twice: as `standalone::name` on Redis and
/// as `cluster::name` on the Redis Cluster.
#[allow(unused_macros)] // not every test file runs on both
macro_rules! on_both {
    ($($name:ident),* $(,)?) => {
        mod standalone {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name(crate::support::Target::Standalone).await;
                }
            )*
        }
        mod cluster {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name(crate::support::Target::Cluster).await;
                }
            )*
        }
    };
}
#[allow(unused_imports)] // not every test file runs on both
pub(crate) use on_both;

/// The entries' secret of the tests' caches.
pub(crate) fn secret() -> CacheSecret {
    CacheSecret::new("tests-only-secret-0123456789abcdef").unwrap()
}

/// A cache on `target` with a prefix of its own, a generous timeout and [`secret`] (unless the
/// config names one).
pub(crate) async fn redis(target: Target, config: DistributedCacheConfig) -> RedisCache {
    let config = DistributedCacheConfig {
        key_prefix: format!("{}:", idempotency_testing::unique_name("it")),
        timeout: Duration::from_secs(2),
        secret: config.secret.clone().or_else(|| Some(secret())),
        ..config
    };
    let url = target.url();
    let cache = RedisCache::connect(&url, &config).unwrap_or_else(|e| {
        panic!("{target:?} Redis at {url}: {e}; start it (scripts/services.sh) or set REDIS_URL / REDIS_CLUSTER_URL")
    });
    tokio::time::timeout(Duration::from_secs(10), cache.client().wait_for_connect())
        .await
        .unwrap_or_else(|_| {
            panic!("{target:?} Redis at {url} did not answer; start it (scripts/services.sh) or set REDIS_URL / REDIS_CLUSTER_URL")
        })
        .unwrap();
    cache
}

pub(crate) fn moka() -> MokaCache {
    MokaCache::new(&LocalCacheConfig {
        statistics: true,
        ..Default::default()
    })
}

pub(crate) async fn store() -> (PgPool, PgStore) {
    let pool = idempotency_testing::pg_pool().await;
    let store = PgStore::new(pool.clone());
    store.create_schema().await.unwrap();
    (pool, store)
}

/// The URL of a server that accepts connections and never answers (a hanging Redis).
pub(crate) async fn hanging_url() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    format!("redis://127.0.0.1:{port}")
}

/// A completed record whose payload is `{"n":n}`.
pub(crate) fn completed(n: usize) -> IdempotencyRecord {
    IdempotencyRecord {
        fingerprint: Fingerprint::new("f".repeat(64)),
        outcome: Some(StoredOutcome::Completed {
            payload: format!("{{\"n\":{n}}}"),
        }),
        created_at: SystemTime::now(),
        completed_at: Some(SystemTime::now()),
        expires_at: None,
        execution_span: None,
    }
}

pub(crate) fn id(op: &str, scope: &str, key: &str) -> RecordId {
    RecordId::new(
        Operation::new(op).unwrap(),
        Scope::new(scope).unwrap(),
        IdempotencyKey::new(key).unwrap(),
    )
}

pub(crate) async fn pay<L: LocalCache, D: DistributedCache>(
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

pub(crate) async fn in_redis(cache: &RedisCache, id: &RecordId) -> Option<String> {
    cache
        .client()
        .get(cache.key_for(id).as_str())
        .await
        .unwrap()
}

pub(crate) async fn wipe_store(pool: &PgPool) {
    sqlx::query("DELETE FROM idempotency_records")
        .execute(pool)
        .await
        .unwrap();
}

pub(crate) mod cluster;
pub(crate) mod server;
pub(crate) mod timed;
