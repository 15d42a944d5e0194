//! The metrics SPI. Every method has a no-op default; `idempotency-metrics` implements it on the
//! `metrics` facade.
//!
//! Labels are low-cardinality by construction: operation names, levels and statuses. Keys,
//! scopes and fingerprints are never passed to a metrics implementation.

use std::time::Duration;

use crate::cache::CacheError;
use crate::record::RecordStatus;
use crate::result::Level;

/// Receives the service's measurements.
pub trait IdempotencyMetrics: Send + Sync + 'static {
    /// A stored outcome was found at `level` (`idempotency.lookup.hits{level}`).
    fn lookup_hit(&self, operation: &str, level: Level) {
        let _ = (operation, level);
    }
    /// A stored outcome was replayed (`idempotency.replays{status}`).
    fn replayed(&self, operation: &str, status: RecordStatus) {
        let _ = (operation, status);
    }
    /// The key was reused with another payload (`idempotency.conflicts`).
    fn payload_conflict(&self, operation: &str) {
        let _ = operation;
    }
    /// The key was acquired and the action will run (`idempotency.acquired`).
    fn acquired(&self, operation: &str) {
        let _ = operation;
    }
    /// The insert found an existing record (`idempotency.acquire.conflicts`).
    fn acquire_conflict(&self, operation: &str) {
        let _ = operation;
    }
    /// Time spent in acquire, including any wait for a concurrent holder
    /// (`idempotency.acquire.wait`, seconds).
    fn acquire_wait(&self, operation: &str, waited: Duration) {
        let _ = (operation, waited);
    }
    /// An outcome was committed (`idempotency.persisted{status}`); called after the commit.
    fn persisted(&self, operation: &str, status: RecordStatus) {
        let _ = (operation, status);
    }
    /// A cache call failed (`idempotency.cache.errors{level,kind}`).
    fn cache_error(&self, operation: &str, level: Level, error: &CacheError) {
        let _ = (operation, level, error);
    }
    /// A request was refused because the same key is in flight (`idempotency.in_flight`).
    fn in_flight(&self, operation: &str) {
        let _ = operation;
    }
    /// Cleanup deleted `count` expired records (`idempotency.cleanup.deleted`).
    fn cleanup_deleted(&self, count: u64) {
        let _ = count;
    }
}

/// Discards every measurement. The default.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoopMetrics;

impl IdempotencyMetrics for NoopMetrics {}

impl<M: IdempotencyMetrics + ?Sized> IdempotencyMetrics for std::sync::Arc<M> {
    fn lookup_hit(&self, operation: &str, level: Level) {
        (**self).lookup_hit(operation, level);
    }
    fn replayed(&self, operation: &str, status: RecordStatus) {
        (**self).replayed(operation, status);
    }
    fn payload_conflict(&self, operation: &str) {
        (**self).payload_conflict(operation);
    }
    fn acquired(&self, operation: &str) {
        (**self).acquired(operation);
    }
    fn acquire_conflict(&self, operation: &str) {
        (**self).acquire_conflict(operation);
    }
    fn acquire_wait(&self, operation: &str, waited: Duration) {
        (**self).acquire_wait(operation, waited);
    }
    fn persisted(&self, operation: &str, status: RecordStatus) {
        (**self).persisted(operation, status);
    }
    fn cache_error(&self, operation: &str, level: Level, error: &CacheError) {
        (**self).cache_error(operation, level, error);
    }
    fn in_flight(&self, operation: &str) {
        (**self).in_flight(operation);
    }
    fn cleanup_deleted(&self, count: u64) {
        (**self).cleanup_deleted(count);
    }
}
