//! The cache SPI: an in-process L1 and a shared L2 in front of the store.
//!
//! Caches only speed up replays. The service writes them after the commit, only with terminal
//! records, and falls back to the store on any miss or failure (unless the L2 is `fail-fast`).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::key::RecordId;
use crate::record::IdempotencyRecord;
use crate::store::BoxError;

/// What the service does when the distributed cache fails.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FailurePolicy {
    /// Treat the failure as a miss, log it at `warn` and count it. The default.
    #[default]
    FailOpen,
    /// Fail the request with [`Error::Cache`](crate::Error::Cache) before the action runs.
    /// Failures writing the cache after a commit are still only logged and counted.
    FailFast,
}

/// A cache operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CacheError {
    /// The call did not finish within the configured timeout.
    #[error("cache call timed out after {0:?}")]
    Timeout(Duration),
    /// The circuit breaker is open after repeated failures; the cache is not being called.
    #[error("cache circuit breaker is open")]
    CircuitOpen,
    /// An entry could not be decoded; it was removed and reads as a miss.
    #[error("corrupt cache entry")]
    Corrupt(#[source] BoxError),
    /// The backend failed (connection refused, protocol error, ...).
    #[error("cache backend error")]
    Backend(#[source] BoxError),
}

impl CacheError {
    /// A short label for metrics: `timeout`, `circuit_open`, `corrupt` or `backend`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Timeout(_) => "timeout",
            Self::CircuitOpen => "circuit_open",
            Self::Corrupt(_) => "corrupt",
            Self::Backend(_) => "backend",
        }
    }
}

/// The L1 cache: in-process, synchronous, infallible.
pub trait LocalCache: Send + Sync + 'static {
    /// The cached terminal record for `id`, if any.
    fn get(&self, id: &RecordId) -> Option<Arc<IdempotencyRecord>>;
    /// Caches a terminal record. Implementations must not keep it past its `expires_at`.
    fn put(&self, id: &RecordId, record: Arc<IdempotencyRecord>);
}

/// The L2 cache: shared between instances, asynchronous, fallible.
///
/// The service counts each failed call (`IdempotencyMetrics::cache_error`) and logs it at
/// `debug` only: an outage must not log once per request. An implementation logs its own
/// outages, once per change of state (as `idempotency-cache-redis` does: lost / back, circuit
/// breaker opened / half-open / closed).
pub trait DistributedCache: Send + Sync + 'static {
    /// The cached terminal record for `id`, if any.
    fn get(
        &self,
        id: &RecordId,
    ) -> impl Future<Output = Result<Option<IdempotencyRecord>, CacheError>> + Send;
    /// Caches a terminal record.
    fn put(
        &self,
        id: &RecordId,
        record: &IdempotencyRecord,
    ) -> impl Future<Output = Result<(), CacheError>> + Send;
    /// What the service does when a read fails.
    fn failure_policy(&self) -> FailurePolicy {
        FailurePolicy::FailOpen
    }
}

/// No cache: every read misses, every write is dropped. The default for both levels.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoCache;

impl LocalCache for NoCache {
    fn get(&self, _id: &RecordId) -> Option<Arc<IdempotencyRecord>> {
        None
    }
    fn put(&self, _id: &RecordId, _record: Arc<IdempotencyRecord>) {}
}

impl DistributedCache for NoCache {
    async fn get(&self, _id: &RecordId) -> Result<Option<IdempotencyRecord>, CacheError> {
        Ok(None)
    }
    async fn put(&self, _id: &RecordId, _record: &IdempotencyRecord) -> Result<(), CacheError> {
        Ok(())
    }
}

/// An optional L1 chosen at run time: `None` behaves as [`NoCache`].
impl<L: LocalCache> LocalCache for Option<L> {
    fn get(&self, id: &RecordId) -> Option<Arc<IdempotencyRecord>> {
        self.as_ref().and_then(|cache| cache.get(id))
    }
    fn put(&self, id: &RecordId, record: Arc<IdempotencyRecord>) {
        if let Some(cache) = self {
            cache.put(id, record);
        }
    }
}

/// An optional L2 chosen at run time (for example only when `REDIS_URL` is set): `None`
/// behaves as [`NoCache`].
impl<D: DistributedCache> DistributedCache for Option<D> {
    async fn get(&self, id: &RecordId) -> Result<Option<IdempotencyRecord>, CacheError> {
        match self {
            Some(cache) => cache.get(id).await,
            None => Ok(None),
        }
    }
    async fn put(&self, id: &RecordId, record: &IdempotencyRecord) -> Result<(), CacheError> {
        match self {
            Some(cache) => cache.put(id, record).await,
            None => Ok(()),
        }
    }
    fn failure_policy(&self) -> FailurePolicy {
        self.as_ref()
            .map_or(FailurePolicy::FailOpen, DistributedCache::failure_policy)
    }
}
