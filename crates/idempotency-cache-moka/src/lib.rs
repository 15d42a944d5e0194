#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use idempotency_core::{IdempotencyRecord, LocalCache, RecordId, StoredOutcome};
use moka::notification::RemovalCause;

mod config;

pub use config::LocalCacheConfig;
/// The moka version this crate is built on.
pub use moka;

type Entry = Arc<IdempotencyRecord>;

/// Hit, miss and eviction counts, when statistics are enabled.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Lookups that found a record.
    pub hits: u64,
    /// Lookups that found nothing.
    pub misses: u64,
    /// Entries removed to respect `max-size` or `max-bytes`.
    pub evictions: u64,
    /// Entries removed because their TTL or the record's `expires_at` passed.
    pub expirations: u64,
}

#[derive(Debug, Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    evictions: AtomicU64,
    expirations: AtomicU64,
}

/// Each entry lives for the configured TTL, or until the record's own `expires_at` if sooner.
struct RecordExpiry {
    ttl: Duration,
}

impl RecordExpiry {
    fn lifetime(&self, record: &IdempotencyRecord) -> Duration {
        match record.expires_at {
            Some(expires_at) => expires_at
                .duration_since(SystemTime::now())
                .unwrap_or(Duration::ZERO)
                .min(self.ttl),
            None => self.ttl,
        }
    }
}

impl moka::Expiry<RecordId, Entry> for RecordExpiry {
    fn expire_after_create(
        &self,
        _key: &RecordId,
        value: &Entry,
        _now: Instant,
    ) -> Option<Duration> {
        Some(self.lifetime(value))
    }

    fn expire_after_update(
        &self,
        _key: &RecordId,
        value: &Entry,
        _now: Instant,
        _current: Option<Duration>,
    ) -> Option<Duration> {
        Some(self.lifetime(value))
    }
}

/// What an entry weighs besides its strings: the record, the `Arc`, the key and moka's own
/// bookkeeping, rounded up.
const ENTRY_OVERHEAD: u64 = 256;

/// An entry's weight in bytes, at least `floor` (see [`LocalCacheConfig::max_bytes`]).
fn weight(id: &RecordId, record: &IdempotencyRecord, floor: u64) -> u32 {
    let outcome = match &record.outcome {
        Some(StoredOutcome::Completed { payload }) => payload.len(),
        Some(StoredOutcome::Rejected { code, details }) => {
            code.len() + details.as_ref().map_or(0, String::len)
        }
        None => 0,
    };
    let strings = outcome
        + record.fingerprint.as_str().len()
        + id.operation.as_str().len()
        + id.scope.as_str().len()
        + id.key.as_str().len();
    let bytes = u64::try_from(strings)
        .unwrap_or(u64::MAX)
        .saturating_add(ENTRY_OVERHEAD)
        .max(floor);
    u32::try_from(bytes).unwrap_or(u32::MAX)
}

/// The L1 cache: in-process, bounded by entries and by bytes, expire-after-write, on moka.
///
/// Only terminal records (`COMPLETED`, `REJECTED`) are stored; a `PROCESSING` record offered to
/// [`put`](LocalCache::put) is ignored. An entry never outlives the record's `expires_at`.
/// Cloning shares the cache.
///
/// ```
/// use idempotency_cache_moka::MokaCache;
/// use idempotency_cache_moka::LocalCacheConfig;
///
/// let cache = MokaCache::new(&LocalCacheConfig { statistics: true, ..Default::default() });
/// assert_eq!(cache.stats().map(|s| s.hits), Some(0));
/// // IdempotencyService::builder(store).local_cache(cache).build()
/// ```
#[derive(Clone)]
pub struct MokaCache {
    cache: moka::sync::Cache<RecordId, Entry>,
    counters: Option<Arc<Counters>>,
}

impl MokaCache {
    /// A cache from `idempotency.local-cache` (`ttl`, `max-size`, `max-bytes`, `statistics`).
    ///
    /// Entries are weighed in bytes (moka's weigher) against `max-bytes`; each weighs at least
    /// `max-bytes / max-size`, so the cache also never holds more than `max-size` entries.
    pub fn new(config: &LocalCacheConfig) -> Self {
        let counters = config.statistics.then(|| Arc::new(Counters::default()));
        let floor = config.max_bytes / config.max_size.max(1);
        let mut builder = moka::sync::Cache::builder()
            .max_capacity(config.max_bytes)
            .weigher(move |id: &RecordId, record: &Entry| weight(id, record, floor))
            .expire_after(RecordExpiry { ttl: config.ttl });
        if let Some(counters) = &counters {
            let counters = Arc::clone(counters);
            builder = builder.eviction_listener(move |_key, _value, cause| match cause {
                RemovalCause::Size => {
                    counters.evictions.fetch_add(1, Ordering::Relaxed);
                }
                RemovalCause::Expired => {
                    counters.expirations.fetch_add(1, Ordering::Relaxed);
                }
                RemovalCause::Explicit | RemovalCause::Replaced => {}
            });
        }
        Self {
            cache: builder.build(),
            counters,
        }
    }

    /// The statistics, or `None` when `statistics` is off.
    pub fn stats(&self) -> Option<CacheStats> {
        self.counters.as_ref().map(|c| CacheStats {
            hits: c.hits.load(Ordering::Relaxed),
            misses: c.misses.load(Ordering::Relaxed),
            evictions: c.evictions.load(Ordering::Relaxed),
            expirations: c.expirations.load(Ordering::Relaxed),
        })
    }

    /// Number of entries (approximate until pending maintenance ran; see [`sync`](Self::sync)).
    pub fn entry_count(&self) -> u64 {
        self.cache.entry_count()
    }

    /// The entries' weight in bytes, as counted against `max-bytes` (approximate until
    /// pending maintenance ran).
    pub fn weighted_size(&self) -> u64 {
        self.cache.weighted_size()
    }

    /// Runs moka's pending maintenance (evictions, expirations, counts) now.
    pub fn sync(&self) {
        self.cache.run_pending_tasks();
    }

    /// Removes one entry.
    pub fn invalidate(&self, id: &RecordId) {
        self.cache.invalidate(id);
    }

    /// Removes every entry.
    pub fn clear(&self) {
        self.cache.invalidate_all();
    }
}

impl Default for MokaCache {
    fn default() -> Self {
        Self::new(&LocalCacheConfig::default())
    }
}

impl LocalCache for MokaCache {
    fn get(&self, id: &RecordId) -> Option<Entry> {
        let found = self.cache.get(id);
        if let Some(counters) = &self.counters {
            let counter = if found.is_some() {
                &counters.hits
            } else {
                &counters.misses
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
        found
    }

    fn put(&self, id: &RecordId, record: Entry) {
        if record.is_terminal() {
            self.cache.insert(id.clone(), record);
        }
    }
}

impl fmt::Debug for MokaCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MokaCache")
            .field("entries", &self.cache.entry_count())
            .field("stats", &self.stats())
            .finish()
    }
}
