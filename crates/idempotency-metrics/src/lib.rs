#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

use std::time::Duration;

use idempotency_core::{CacheError, IdempotencyMetrics, Level, RecordStatus};
use metrics::{Unit, counter, describe_counter, describe_histogram};

mod cached;
mod handles;

pub use cached::CachedMetrics;

/// Metric names, one scheme for both halves of the workspace (the outbox's `outbox_*` too):
/// Prometheus names, `_total` on counters, `_seconds` on durations.
pub mod names {
    /// Counter, labels `operation`, `level` (`local`, `distributed`, `persistence`).
    pub const LOOKUP_HITS: &str = "idempotency_lookup_hits_total";
    /// Counter, labels `operation`, `status` (`COMPLETED`, `REJECTED`).
    pub const REPLAYS: &str = "idempotency_replays_total";
    /// Counter, label `operation`: same key, different payload.
    pub const CONFLICTS: &str = "idempotency_conflicts_total";
    /// Counter, label `operation`: keys acquired (the action ran).
    pub const ACQUIRED: &str = "idempotency_acquired_total";
    /// Counter, label `operation`: inserts that found an existing record.
    pub const ACQUIRE_CONFLICTS: &str = "idempotency_acquire_conflicts_total";
    /// Histogram in seconds, label `operation`: time in acquire, including waits on a holder.
    pub const ACQUIRE_WAIT: &str = "idempotency_acquire_wait_seconds";
    /// Counter, labels `operation`, `status`: outcomes committed (counted after the commit).
    pub const PERSISTED: &str = "idempotency_persisted_total";
    /// Counter, labels `operation`, `level`, `kind` (`timeout`, `backend`, `circuit_open`,
    /// `corrupt`): cache failures.
    pub const CACHE_ERRORS: &str = "idempotency_cache_errors_total";
    /// Counter, label `operation`: requests refused because the key was in flight.
    pub const IN_FLIGHT: &str = "idempotency_in_flight_total";
    /// Counter: expired records deleted by cleanup.
    pub const CLEANUP_DELETED: &str = "idempotency_cleanup_deleted_total";
    /// Counter: L1 (moka) lookups that found a record, when `local-cache.statistics` is on.
    pub const LOCAL_CACHE_HITS: &str = "idempotency_local_cache_hits_total";
    /// Counter: L1 lookups that found nothing, when `local-cache.statistics` is on.
    pub const LOCAL_CACHE_MISSES: &str = "idempotency_local_cache_misses_total";
    /// Counter: L1 entries removed to respect `local-cache.max-size`.
    pub const LOCAL_CACHE_EVICTIONS: &str = "idempotency_local_cache_evictions_total";
    /// Counter: L1 entries removed because their TTL or the record's `expires_at` passed.
    pub const LOCAL_CACHE_EXPIRATIONS: &str = "idempotency_local_cache_expirations_total";
    /// Counter, labels `breaker` (`requests`, `writes`), `state` (`open`, `half_open`,
    /// `closed`): the L2 cache's circuit breaker changed state (recorded by
    /// `idempotency-cache-redis`, `BREAKER_METRIC`).
    pub const CACHE_BREAKER_TRANSITIONS: &str = "idempotency_cache_breaker_transitions_total";
    /// Counter, label `state` (`lost`, `back`): the L2 cache's calls started failing, or
    /// succeeded again (recorded by `idempotency-cache-redis`, `CONNECTION_METRIC`).
    pub const CACHE_CONNECTION_CHANGES: &str = "idempotency_cache_connection_changes_total";
}

#[cfg(feature = "prometheus")]
#[cfg_attr(docsrs, doc(cfg(feature = "prometheus")))]
pub mod prometheus;

/// The metrics SPI on the `metrics` facade: every measurement goes to whatever recorder the
/// application installed (e.g. `metrics-exporter-prometheus`).
///
/// Labels are the operation name, the cache level, the record status and the cache error kind.
/// Keys, scopes and fingerprints are never labels: the SPI does not even receive them.
///
/// Each call registers its meter with the recorder in effect, which suits recorders that come
/// and go (`metrics::with_local_recorder`). With one recorder for the life of the process,
/// [`CachedMetrics`] records the same and keeps the handles, several times cheaper per call.
///
/// ```
/// use idempotency_metrics::FacadeMetrics;
/// FacadeMetrics::describe(); // optional: units and help texts for exporters
/// // IdempotencyService::builder(store).metrics(FacadeMetrics).build()
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct FacadeMetrics;

impl FacadeMetrics {
    /// Registers the description and unit of every metric with the installed recorder.
    pub fn describe() {
        describe_counter!(
            names::LOOKUP_HITS,
            Unit::Count,
            "Stored outcomes found, by level"
        );
        describe_counter!(
            names::REPLAYS,
            Unit::Count,
            "Outcomes replayed instead of executed"
        );
        describe_counter!(
            names::CONFLICTS,
            Unit::Count,
            "Keys reused with a different payload"
        );
        describe_counter!(
            names::ACQUIRED,
            Unit::Count,
            "Keys acquired; the action ran"
        );
        describe_counter!(
            names::ACQUIRE_CONFLICTS,
            Unit::Count,
            "Inserts that found an existing record"
        );
        describe_histogram!(
            names::ACQUIRE_WAIT,
            Unit::Seconds,
            "Time spent acquiring a key"
        );
        describe_counter!(names::PERSISTED, Unit::Count, "Outcomes committed");
        describe_counter!(
            names::CACHE_ERRORS,
            Unit::Count,
            "Cache failures, by level and kind"
        );
        describe_counter!(
            names::IN_FLIGHT,
            Unit::Count,
            "Requests refused while the key was in flight"
        );
        describe_counter!(
            names::CLEANUP_DELETED,
            Unit::Count,
            "Expired records deleted by cleanup"
        );
        describe_counter!(
            names::LOCAL_CACHE_HITS,
            Unit::Count,
            "L1 cache lookups that found a record"
        );
        describe_counter!(
            names::LOCAL_CACHE_MISSES,
            Unit::Count,
            "L1 cache lookups that found nothing"
        );
        describe_counter!(
            names::LOCAL_CACHE_EVICTIONS,
            Unit::Count,
            "L1 cache entries evicted to respect max-size"
        );
        describe_counter!(
            names::LOCAL_CACHE_EXPIRATIONS,
            Unit::Count,
            "L1 cache entries expired"
        );
        describe_counter!(
            names::CACHE_BREAKER_TRANSITIONS,
            Unit::Count,
            "L2 cache circuit breaker changes of state, by breaker and state entered"
        );
        describe_counter!(
            names::CACHE_CONNECTION_CHANGES,
            Unit::Count,
            "L2 cache outages as its calls see them: lost, back"
        );
    }

    /// Publishes the L1 cache's statistics (totals since start, as the cache counts them) as
    /// the `idempotency_local_cache_*_total` counters. Call it before each scrape.
    pub fn local_cache_totals(hits: u64, misses: u64, evictions: u64, expirations: u64) {
        counter!(names::LOCAL_CACHE_HITS).absolute(hits);
        counter!(names::LOCAL_CACHE_MISSES).absolute(misses);
        counter!(names::LOCAL_CACHE_EVICTIONS).absolute(evictions);
        counter!(names::LOCAL_CACHE_EXPIRATIONS).absolute(expirations);
    }
}

impl IdempotencyMetrics for FacadeMetrics {
    fn lookup_hit(&self, operation: &str, level: Level) {
        handles::lookup_hits(operation, level).increment(1);
    }

    fn replayed(&self, operation: &str, status: RecordStatus) {
        handles::replays(operation, status).increment(1);
    }

    fn payload_conflict(&self, operation: &str) {
        handles::conflicts(operation).increment(1);
    }

    fn acquired(&self, operation: &str) {
        handles::acquired(operation).increment(1);
    }

    fn acquire_conflict(&self, operation: &str) {
        handles::acquire_conflicts(operation).increment(1);
    }

    fn acquire_wait(&self, operation: &str, waited: Duration) {
        handles::acquire_wait(operation).record(waited.as_secs_f64());
    }

    fn persisted(&self, operation: &str, status: RecordStatus) {
        handles::persisted(operation, status).increment(1);
    }

    fn cache_error(&self, operation: &str, level: Level, error: &CacheError) {
        handles::cache_errors(operation, level, error).increment(1);
    }

    fn in_flight(&self, operation: &str) {
        handles::in_flight(operation).increment(1);
    }

    fn cleanup_deleted(&self, count: u64) {
        handles::cleanup_deleted().increment(count);
    }
}
