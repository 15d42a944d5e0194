//! [`LocalCacheConfig`]: the `idempotency.local-cache` section.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// `idempotency.local-cache`: the settings of [`MokaCache`](crate::MokaCache).
///
/// ```
/// let config: idempotency_cache_moka::LocalCacheConfig =
///     serde_json::from_str(r#"{"ttl": "5m", "max-size": 500, "statistics": true}"#)?;
/// assert_eq!(config.max_size, 500);
/// assert_eq!(config.max_bytes, 64 * 1024 * 1024);
/// assert!(config.enabled);
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct LocalCacheConfig {
    /// Whether the application wires the L1 cache. Default `true`.
    pub enabled: bool,
    /// Expire after write. Default `10m`.
    #[serde(with = "humantime_serde")]
    pub ttl: Duration,
    /// Maximum number of entries. Default `10000`.
    pub max_size: u64,
    /// Maximum bytes the entries hold together (their stored responses, fingerprints and keys,
    /// plus a fixed overhead per entry). Default `64MiB`. Each entry weighs at least
    /// `max-bytes / max-size`, so neither bound is exceeded: a few large responses (a client
    /// can make a stored 4xx echo a large body) cannot grow the cache past the budget.
    pub max_bytes: u64,
    /// Record hits, misses and evictions. Default `false`.
    pub statistics: bool,
}

impl Default for LocalCacheConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            ttl: Duration::from_secs(10 * 60),
            max_size: 10_000,
            max_bytes: 64 * 1024 * 1024,
            statistics: false,
        }
    }
}
