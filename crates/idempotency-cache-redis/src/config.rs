//! [`DistributedCacheConfig`] and [`CircuitBreakerConfig`]: the `idempotency.distributed-cache`
//! section.

use std::time::Duration;

use idempotency_core::FailurePolicy;
use serde::{Deserialize, Serialize};

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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
