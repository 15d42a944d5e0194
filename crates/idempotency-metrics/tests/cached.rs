//! `CachedMetrics` records what `FacadeMetrics` records, follows the recorder in effect, and
//! counts every call when threads race to register the same handles.
//!
//! No test here installs a global recorder: outside a local one, the no-op recorder is in
//! effect.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

use std::time::Duration;

use idempotency_core::{CacheError, IdempotencyMetrics, Level, RecordStatus};
use idempotency_metrics::{CachedMetrics, FacadeMetrics, names};
use idempotency_testing::recorded::Recorded;
use metrics_util::debugging::DebuggingRecorder;

/// Every method, with every label value, some of them twice.
fn record_everything(meters: &impl IdempotencyMetrics) {
    for operation in ["PAY", "REFUND", "PAY"] {
        for level in [Level::Local, Level::Distributed, Level::Persistence] {
            meters.lookup_hit(operation, level);
            meters.cache_error(operation, level, &CacheError::Timeout(Duration::ZERO));
            meters.cache_error(operation, level, &CacheError::Backend("down".into()));
        }
        for status in [
            RecordStatus::Processing,
            RecordStatus::Completed,
            RecordStatus::Rejected,
        ] {
            meters.replayed(operation, status);
            meters.persisted(operation, status);
        }
        meters.payload_conflict(operation);
        meters.acquired(operation);
        meters.acquire_conflict(operation);
        meters.acquire_wait(operation, Duration::from_millis(3));
        meters.acquire_wait(operation, Duration::from_micros(250));
        meters.in_flight(operation);
    }
    meters.cleanup_deleted(7);
}

#[test]
fn records_exactly_what_the_facade_records() {
    let facade = DebuggingRecorder::new();
    let cached = DebuggingRecorder::new();
    let meters = CachedMetrics::default();
    metrics::with_local_recorder(&facade, || record_everything(&FacadeMetrics));
    metrics::with_local_recorder(&cached, || {
        record_everything(&meters);
        record_everything(&meters.clone()); // clones share the handles
    });
    metrics::with_local_recorder(&facade, || record_everything(&FacadeMetrics));

    let expected = Recorded::take(&facade.snapshotter());
    assert_eq!(Recorded::take(&cached.snapshotter()), expected);
    // 2 operations: 3 levels, 3 statuses twice, 5 meters without a second label, 6 cache
    // error series; and the cleanup counter
    assert_eq!(expected.series().len(), 2 * (3 + 3 + 3 + 5 + 6) + 1);
}

#[test]
fn registers_again_when_another_recorder_is_in_effect() {
    let first = DebuggingRecorder::new();
    let second = DebuggingRecorder::new();
    let meters = CachedMetrics::default();

    meters.acquired("PAY"); // the no-op recorder: lost, as with FacadeMetrics
    metrics::with_local_recorder(&first, || meters.acquired("PAY"));
    metrics::with_local_recorder(&second, || meters.acquired("PAY"));
    metrics::with_local_recorder(&first, || {
        meters.acquired("PAY");
        meters.acquired("PAY");
    });
    meters.acquired("PAY");

    assert_eq!(
        Recorded::take(&first.snapshotter()).total(names::ACQUIRED),
        3
    );
    assert_eq!(
        Recorded::take(&second.snapshotter()).total(names::ACQUIRED),
        1
    );
}

#[test]
fn threads_racing_to_register_count_every_call() {
    const THREADS: u64 = 8;
    const ROUNDS: u64 = 2_000;
    let recorder = DebuggingRecorder::new();
    let meters = CachedMetrics::default();
    std::thread::scope(|scope| {
        for thread in 0..THREADS {
            let (recorder, meters) = (&recorder, &meters);
            scope.spawn(move || {
                metrics::with_local_recorder(recorder, || {
                    for round in 0..ROUNDS {
                        // each thread registers the operations in another order
                        let operation = ["A", "B", "C", "D"][((thread + round) % 4) as usize];
                        meters.replayed(operation, RecordStatus::Completed);
                        meters.lookup_hit(operation, Level::Local);
                    }
                });
            });
        }
    });
    let recorded = Recorded::take(&recorder.snapshotter());
    assert_eq!(recorded.total(names::REPLAYS), THREADS * ROUNDS);
    assert_eq!(recorded.total(names::LOOKUP_HITS), THREADS * ROUNDS);
    assert_eq!(recorded.series().len(), 2 * 4);
}
