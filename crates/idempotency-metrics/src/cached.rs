//! [`CachedMetrics`]: the facade's meters with each handle registered once and kept.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock, PoisonError, RwLock};
use std::time::Duration;

use idempotency_core::{CacheError, IdempotencyMetrics, Level, RecordStatus};
use metrics::{Counter, Histogram};

use crate::handles;

/// The meters of [`FacadeMetrics`](crate::FacadeMetrics) (the same names, labels and values),
/// with each handle registered once with the recorder and kept.
///
/// `FacadeMetrics` registers on every call: it builds the key (the name, the operation copied
/// into an owned label, the other labels) and the recorder hashes it and looks it up in its
/// registry. `CachedMetrics` does that once per operation, meter and label. A call then costs
/// a shared lock and a lookup of the operation's name; the hot paths record two or three
/// meters per request (a replay: `lookup_hit` and `replayed`).
///
/// Handles belong to the recorder that registered them. Every call checks which recorder is in
/// effect (by its address) and registers again when it changed, so a recorder installed after
/// the first requests loses nothing. A recorder dropped while this value lives and another one
/// created at the same address cannot be told apart: with recorders that come and go (one
/// `metrics::with_local_recorder` scope after another, as tests do), use `FacadeMetrics`. With
/// one global recorder for the life of the process, as `prometheus::install` sets up, the two
/// record exactly the same.
///
/// The operations are kept for the life of the value, as the recorder keeps their series.
/// Failures (`cache_error`) and cleanup are rare and registered per call. Clones share the
/// handles.
///
/// ```
/// use idempotency_core::{IdempotencyMetrics, Level, RecordStatus};
/// use idempotency_metrics::CachedMetrics;
/// use metrics_util::debugging::DebuggingRecorder;
///
/// let recorder = DebuggingRecorder::new();
/// let snapshotter = recorder.snapshotter();
/// let meters = CachedMetrics::default(); // IdempotencyService::builder(store).metrics(meters)
/// metrics::with_local_recorder(&recorder, || {
///     for _ in 0..3 {
///         meters.lookup_hit("PAY", Level::Local);
///         meters.replayed("PAY", RecordStatus::Completed);
///     }
/// });
/// let replays = snapshotter.snapshot().into_vec().into_iter().find(|(key, ..)| {
///     key.key().name() == "idempotency_replays_total"
/// });
/// assert!(matches!(
///     replays.map(|(_, _, _, value)| value),
///     Some(metrics_util::debugging::DebugValue::Counter(3))
/// ));
/// ```
#[derive(Clone, Default)]
pub struct CachedMetrics {
    registered: Arc<RwLock<Registered>>,
}

impl std::fmt::Debug for CachedMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let registered = self
            .registered
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        f.debug_struct("CachedMetrics")
            .field("operations", &registered.operations.len())
            .finish_non_exhaustive()
    }
}

/// The handles, and the recorder they belong to.
#[derive(Default)]
struct Registered {
    /// The address of the recorder that registered `operations`; 0 before the first call.
    recorder: usize,
    operations: HashMap<Box<str>, Operation>,
}

/// One operation's handles, each registered the first time it records.
#[derive(Default)]
struct Operation {
    lookup_hits: [OnceLock<Counter>; 3],
    replays: [OnceLock<Counter>; 3],
    persisted: [OnceLock<Counter>; 3],
    conflicts: OnceLock<Counter>,
    acquired: OnceLock<Counter>,
    acquire_conflicts: OnceLock<Counter>,
    acquire_wait: OnceLock<Histogram>,
    in_flight: OnceLock<Counter>,
}

fn level_slot(level: Level) -> usize {
    match level {
        Level::Local => 0,
        Level::Distributed => 1,
        Level::Persistence => 2,
    }
}

fn status_slot(status: RecordStatus) -> usize {
    match status {
        RecordStatus::Processing => 0,
        RecordStatus::Completed => 1,
        RecordStatus::Rejected => 2,
    }
}

/// The address of the recorder in effect: the thread's local one, else the global one, else
/// the no-op recorder.
fn recorder_in_effect() -> usize {
    metrics::with_recorder(|recorder| std::ptr::from_ref(recorder).cast::<()>().addr())
}

impl CachedMetrics {
    /// Runs `record` on `operation`'s handles for the recorder in effect, registering the
    /// operation first (and dropping every handle of another recorder) when needed.
    fn with(&self, operation: &str, record: impl FnOnce(&Operation)) {
        let recorder = recorder_in_effect();
        {
            let registered = self
                .registered
                .read()
                .unwrap_or_else(PoisonError::into_inner);
            if registered.recorder == recorder
                && let Some(handles) = registered.operations.get(operation)
            {
                record(handles);
                return;
            }
        }
        let mut registered = self
            .registered
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if registered.recorder != recorder {
            registered.operations.clear();
            registered.recorder = recorder;
        }
        record(registered.operations.entry(operation.into()).or_default());
    }
}

impl IdempotencyMetrics for CachedMetrics {
    fn lookup_hit(&self, operation: &str, level: Level) {
        self.with(operation, |handles| {
            handles.lookup_hits[level_slot(level)]
                .get_or_init(|| handles::lookup_hits(operation, level))
                .increment(1);
        });
    }

    fn replayed(&self, operation: &str, status: RecordStatus) {
        self.with(operation, |handles| {
            handles.replays[status_slot(status)]
                .get_or_init(|| handles::replays(operation, status))
                .increment(1);
        });
    }

    fn payload_conflict(&self, operation: &str) {
        self.with(operation, |handles| {
            handles
                .conflicts
                .get_or_init(|| handles::conflicts(operation))
                .increment(1);
        });
    }

    fn acquired(&self, operation: &str) {
        self.with(operation, |handles| {
            handles
                .acquired
                .get_or_init(|| handles::acquired(operation))
                .increment(1);
        });
    }

    fn acquire_conflict(&self, operation: &str) {
        self.with(operation, |handles| {
            handles
                .acquire_conflicts
                .get_or_init(|| handles::acquire_conflicts(operation))
                .increment(1);
        });
    }

    fn acquire_wait(&self, operation: &str, waited: Duration) {
        self.with(operation, |handles| {
            handles
                .acquire_wait
                .get_or_init(|| handles::acquire_wait(operation))
                .record(waited.as_secs_f64());
        });
    }

    fn persisted(&self, operation: &str, status: RecordStatus) {
        self.with(operation, |handles| {
            handles.persisted[status_slot(status)]
                .get_or_init(|| handles::persisted(operation, status))
                .increment(1);
        });
    }

    fn cache_error(&self, operation: &str, level: Level, error: &CacheError) {
        handles::cache_errors(operation, level, error).increment(1);
    }

    fn in_flight(&self, operation: &str) {
        self.with(operation, |handles| {
            handles
                .in_flight
                .get_or_init(|| handles::in_flight(operation))
                .increment(1);
        });
    }

    fn cleanup_deleted(&self, count: u64) {
        handles::cleanup_deleted().increment(count);
    }
}
