//! [`Timed`]: a distributed cache that records its slowest call.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idempotency_core::{CacheError, DistributedCache, FailurePolicy, IdempotencyRecord, RecordId};

/// Forwards to `inner` and keeps the duration of its slowest `get` or `put`: what the cache
/// adds to a request, apart from the database's share (a checkpoint's flush on a shared
/// machine can stall a commit for half a second, which says nothing about the cache).
#[derive(Clone)]
pub(crate) struct Timed<C> {
    inner: C,
    slowest: Arc<Mutex<Duration>>,
}

impl<C> Timed<C> {
    pub(crate) fn new(inner: C) -> Self {
        Self {
            inner,
            slowest: Arc::default(),
        }
    }

    /// The slowest call since the last `take_slowest`, which starts a new measure.
    pub(crate) fn take_slowest(&self) -> Duration {
        std::mem::take(&mut *self.slowest.lock().unwrap())
    }

    fn record(&self, started: Instant) {
        let took = started.elapsed();
        let mut slowest = self.slowest.lock().unwrap();
        *slowest = (*slowest).max(took);
    }
}

impl<C: DistributedCache> DistributedCache for Timed<C> {
    async fn get(&self, id: &RecordId) -> Result<Option<IdempotencyRecord>, CacheError> {
        let started = Instant::now();
        let result = self.inner.get(id).await;
        self.record(started);
        result
    }

    async fn put(&self, id: &RecordId, record: &IdempotencyRecord) -> Result<(), CacheError> {
        let started = Instant::now();
        let result = self.inner.put(id, record).await;
        self.record(started);
        result
    }

    fn failure_policy(&self) -> FailurePolicy {
        self.inner.failure_policy()
    }
}
