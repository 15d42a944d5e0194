//! [`DistributedCacheConfig`], [`CircuitBreakerConfig`] and [`WriteBehindConfig`]: the
//! `idempotency.distributed-cache` section.

use std::num::NonZeroUsize;
use std::time::Duration;

use idempotency_core::FailurePolicy;
use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::sign::CacheSecret;

/// `idempotency.distributed-cache`: the settings of [`RedisCache`](crate::RedisCache).
///
/// ```
/// let config: idempotency_cache_redis::DistributedCacheConfig = serde_json::from_str(
///     r#"{"failure-policy": "fail-fast", "timeout": "20ms", "circuit-breaker": {"cool-down": "1s"}}"#,
/// )?;
/// assert_eq!(config.timeout, std::time::Duration::from_millis(20));
/// assert_eq!(config.key_prefix, "idempotency:");
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct DistributedCacheConfig {
    /// Whether the application wires the L2 cache. Default `true`.
    pub enabled: bool,
    /// The Redis server, as a `redis://` (or `rediss://`) URL. `null` (the default) leaves it
    /// to the application; the `idempotency` facade refuses an enabled cache without one.
    pub url: Option<String>,
    /// Entry time to live. Default `1h`.
    #[serde(with = "humantime_serde")]
    pub ttl: Duration,
    /// Prefix of every key. Default `idempotency:`.
    pub key_prefix: String,
    /// `fail-open` (default) or `fail-fast`.
    pub failure_policy: FailurePolicy,
    /// Bound on every cache call. Default `50ms`.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// The circuit breaker that stops calling a failing cache.
    pub circuit_breaker: CircuitBreakerConfig,
    /// Writing committed records in the background instead of before the answer.
    pub write_behind: WriteBehindConfig,
    /// The key of the HMAC that authenticates every entry (at least 32 bytes; the same in
    /// every instance sharing the Redis). An entry whose tag does not verify is a miss, deleted
    /// and counted (`RedisCacheStats::forged`), never a replay. Default `null`, which
    /// [`RedisCache::new`](crate::RedisCache::new) and `connect` refuse
    /// ([`Error::NoSecret`](crate::Error::NoSecret)), as the `idempotency` facade refuses an
    /// enabled cache without one.
    pub secret: Option<CacheSecret>,
}

/// The URL without its password ([`redact_url`](idempotency_core::redact_url)), the secret
/// hidden: settings are printed with `{:?}` in logs and traces.
impl std::fmt::Debug for DistributedCacheConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Self {
            enabled,
            url,
            ttl,
            key_prefix,
            failure_policy,
            timeout,
            circuit_breaker,
            write_behind,
            secret,
        } = self;
        f.debug_struct("DistributedCacheConfig")
            .field("enabled", enabled)
            .field("url", &url.as_deref().map(idempotency_core::redact_url))
            .field("ttl", ttl)
            .field("key_prefix", key_prefix)
            .field("failure_policy", failure_policy)
            .field("timeout", timeout)
            .field("circuit_breaker", circuit_breaker)
            .field("write_behind", write_behind)
            .field("secret", secret)
            .finish()
    }
}

impl Default for DistributedCacheConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            url: None,
            ttl: Duration::from_secs(60 * 60),
            key_prefix: "idempotency:".to_owned(),
            failure_policy: FailurePolicy::FailOpen,
            timeout: Duration::from_millis(50),
            circuit_breaker: CircuitBreakerConfig::default(),
            write_behind: WriteBehindConfig::default(),
            secret: None,
        }
    }
}

/// `idempotency.distributed-cache.circuit-breaker`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct CircuitBreakerConfig {
    /// Consecutive failures that open the breaker. Default `5`.
    pub failure_threshold: u32,
    /// How long the breaker stays open before one trial call. Default `5s`.
    #[serde(with = "humantime_serde")]
    pub cool_down: Duration,
}

impl Default for CircuitBreakerConfig {
    fn default() -> Self {
        Self {
            failure_threshold: 5,
            cool_down: Duration::from_secs(5),
        }
    }
}

/// `idempotency.distributed-cache.write-behind`: the writes of committed records to Redis,
/// off the request path.
///
/// Off (the default), [`RedisCache::put`](crate::RedisCache) sends the `SET` and waits for
/// Redis before the first execution answers. On, `put` queues the entry and returns; one
/// background task per cache (started by the first `put`, in its runtime) writes the queue in
/// batches, the `SET`s of a batch sent together (pipelined; on a cluster, per node) as one call
/// under the cache's `timeout` and the breaker of writes (with the `circuit-breaker`
/// settings; the `put`s that write themselves share it), so that failing writes never open
/// the breaker of reads. Only
/// the writes move: reads and the failure policy are unchanged, and only committed records are
/// ever written (the service calls `put` after the commit). A queue that is full is not a loss:
/// `put` then writes that entry itself and waits for it (within `timeout`), as when
/// write-behind is off. A batch that fails is logged and counted
/// ([`RedisCacheStats`](crate::RedisCacheStats)`::unwritten`, and the `metrics` counter
/// [`WRITE_BEHIND_METRIC`](crate::WRITE_BEHIND_METRIC)). Entries still queued at shutdown (the
/// `idempotency` facade's `shutdown` quits the client) or when the writer's runtime stops are
/// not written; replays of them read the database.
///
/// ```
/// let config: idempotency_cache_redis::DistributedCacheConfig = serde_json::from_str(
///     r#"{"write-behind": {"enabled": true, "capacity": 4096, "linger": "2ms"}}"#,
/// )?;
/// assert!(config.write_behind.enabled);
/// assert_eq!(config.write_behind.max_batch.get(), 64);
/// // A queue or a batch of zero entries is refused.
/// assert!(serde_json::from_str::<idempotency_cache_redis::DistributedCacheConfig>(
///     r#"{"write-behind": {"capacity": 0}}"#,
/// ).is_err());
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct WriteBehindConfig {
    /// Whether `put` queues the write instead of waiting for it. Default `false`.
    pub enabled: bool,
    /// Entries the queue holds; a `put` that finds it full writes its entry itself. Default
    /// `1024`.
    pub capacity: NonZeroUsize,
    /// Entries written together at most. Default `64`.
    pub max_batch: NonZeroUsize,
    /// How long the writer waits for more entries after the first of a batch, so that writes
    /// arriving close together share one round trip. Default `1ms`.
    #[serde(with = "humantime_serde")]
    pub linger: Duration,
}

impl Default for WriteBehindConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            capacity: NonZeroUsize::new(1024).unwrap_or(NonZeroUsize::MIN),
            max_batch: NonZeroUsize::new(64).unwrap_or(NonZeroUsize::MIN),
            linger: Duration::from_millis(1),
        }
    }
}

/// The largest write-behind queue: a million entries (each up to a stored response).
pub const MAX_WRITE_BEHIND_CAPACITY: usize = 1 << 20;

/// The largest write-behind batch, the `SET`s sent together.
pub const MAX_WRITE_BEHIND_BATCH: usize = 10_000;

impl WriteBehindConfig {
    /// Refuses a `capacity` over [`MAX_WRITE_BEHIND_CAPACITY`] or a `max-batch` over
    /// [`MAX_WRITE_BEHIND_BATCH`]. [`RedisCache::new`](crate::RedisCache::new) asks it when
    /// write-behind is enabled (a disabled one allocates nothing).
    ///
    /// ```
    /// use std::num::NonZeroUsize;
    /// use idempotency_cache_redis::WriteBehindConfig;
    ///
    /// WriteBehindConfig::default().validate()?;
    /// let unbounded = WriteBehindConfig {
    ///     capacity: NonZeroUsize::MAX,
    ///     ..WriteBehindConfig::default()
    /// };
    /// assert!(unbounded.validate().unwrap_err().to_string().contains("write-behind.capacity"));
    /// # Ok::<(), idempotency_cache_redis::Error>(())
    /// ```
    pub fn validate(&self) -> Result<(), Error> {
        for (property, value, max) in [
            ("capacity", self.capacity.get(), MAX_WRITE_BEHIND_CAPACITY),
            ("max-batch", self.max_batch.get(), MAX_WRITE_BEHIND_BATCH),
        ] {
            if value > max {
                return Err(Error::WriteBehindTooLarge {
                    property,
                    value,
                    max,
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::DistributedCacheConfig;

    /// Settings are printed with `{:?}` (logs, `#[instrument]`): the Redis password is not
    /// (before: derived `Debug`, `url: Some("redis://:hunter2@…")`), nor the secret.
    #[test]
    fn debug_output_hides_the_password() {
        let config = DistributedCacheConfig {
            url: Some("redis://:hunter2@cache:6379/0".to_owned()),
            ..DistributedCacheConfig::default()
        };
        let shown = format!("{config:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("redis://:***@cache:6379/0"), "{shown}");
    }
}
