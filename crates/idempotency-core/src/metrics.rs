//! The metrics SPI. Every method has a no-op default; `idempotency-metrics` implements it on the
//! `metrics` facade.
//!
//! Labels are low-cardinality by construction: operation names, levels and statuses. Keys,
//! scopes and fingerprints are never passed to a metrics implementation.
//!
//! The trait and its forwarding impl for `Arc<M>` are generated from one list of methods, so a
//! method added to the trait is forwarded too: it can never record nothing behind an `Arc`.

use std::time::Duration;

use crate::cache::CacheError;
use crate::record::RecordStatus;
use crate::result::Level;

/// The trait with a no-op default for every method, and `Arc<M>` forwarding each one.
macro_rules! metrics_spi {
    ($(
        $(#[$doc:meta])*
        fn $name:ident(&self $(, $arg:ident: $ty:ty)*);
    )*) => {
        /// Receives the service's measurements.
        pub trait IdempotencyMetrics: Send + Sync + 'static {
            $(
                $(#[$doc])*
                fn $name(&self $(, $arg: $ty)*) {
                    let _ = ($($arg,)*);
                }
            )*
        }

        impl<M: IdempotencyMetrics + ?Sized> IdempotencyMetrics for std::sync::Arc<M> {
            $(
                fn $name(&self $(, $arg: $ty)*) {
                    (**self).$name($($arg),*);
                }
            )*
        }
    };
}

metrics_spi! {
    /// A stored outcome was found at `level` (`idempotency_lookup_hits_total{level}`).
    fn lookup_hit(&self, operation: &str, level: Level);
    /// A stored outcome was replayed (`idempotency_replays_total{status}`).
    fn replayed(&self, operation: &str, status: RecordStatus);
    /// The key was reused with another payload (`idempotency_conflicts_total`).
    fn payload_conflict(&self, operation: &str);
    /// The key was acquired (`idempotency_acquired_total`): its claim was inserted and the
    /// action will run; in optimistic mode, its record was inserted and committed.
    fn acquired(&self, operation: &str);
    /// The insert found an existing record (`idempotency_acquire_conflicts_total`); in
    /// optimistic mode also an insert or commit that failed with a serialization failure and
    /// then found the record a concurrent duplicate committed.
    fn acquire_conflict(&self, operation: &str);
    /// Time spent in acquire, including any wait for a concurrent holder
    /// (`idempotency_acquire_wait_seconds`, seconds).
    fn acquire_wait(&self, operation: &str, waited: Duration);
    /// An outcome was committed (`idempotency_persisted_total{status}`); called after the commit.
    fn persisted(&self, operation: &str, status: RecordStatus);
    /// A cache call failed (`idempotency_cache_errors_total{level,kind}`).
    fn cache_error(&self, operation: &str, level: Level, error: &CacheError);
    /// A request was refused because the same key is in flight (`idempotency_in_flight_total`).
    fn in_flight(&self, operation: &str);
    /// Cleanup deleted `count` expired records (`idempotency_cleanup_deleted_total`).
    fn cleanup_deleted(&self, count: u64);
}

/// Discards every measurement. The default.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoopMetrics;

impl IdempotencyMetrics for NoopMetrics {}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// Records the name of every method called.
    #[derive(Default)]
    struct Names(Mutex<Vec<&'static str>>);

    impl Names {
        fn push(&self, name: &'static str) {
            self.0.lock().unwrap().push(name);
        }
    }

    impl IdempotencyMetrics for Names {
        fn lookup_hit(&self, _: &str, _: Level) {
            self.push("lookup_hit");
        }
        fn replayed(&self, _: &str, _: RecordStatus) {
            self.push("replayed");
        }
        fn payload_conflict(&self, _: &str) {
            self.push("payload_conflict");
        }
        fn acquired(&self, _: &str) {
            self.push("acquired");
        }
        fn acquire_conflict(&self, _: &str) {
            self.push("acquire_conflict");
        }
        fn acquire_wait(&self, _: &str, _: Duration) {
            self.push("acquire_wait");
        }
        fn persisted(&self, _: &str, _: RecordStatus) {
            self.push("persisted");
        }
        fn cache_error(&self, _: &str, _: Level, _: &CacheError) {
            self.push("cache_error");
        }
        fn in_flight(&self, _: &str) {
            self.push("in_flight");
        }
        fn cleanup_deleted(&self, _: u64) {
            self.push("cleanup_deleted");
        }
    }

    #[test]
    fn every_method_reaches_the_implementation_through_an_arc() {
        let inner = Arc::new(Names::default());
        let metrics: Arc<Names> = Arc::clone(&inner);
        let through: &dyn IdempotencyMetrics = &metrics;
        through.lookup_hit("OP", Level::Local);
        through.replayed("OP", RecordStatus::Completed);
        through.payload_conflict("OP");
        through.acquired("OP");
        through.acquire_conflict("OP");
        through.acquire_wait("OP", Duration::ZERO);
        through.persisted("OP", RecordStatus::Rejected);
        through.cache_error("OP", Level::Distributed, &CacheError::CircuitOpen);
        through.in_flight("OP");
        through.cleanup_deleted(1);
        assert_eq!(inner.0.lock().unwrap().len(), 10);
    }
}
