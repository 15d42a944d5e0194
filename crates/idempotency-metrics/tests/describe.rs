//! `FacadeMetrics::describe` gives every meter the unit and help text exporters show, registered
//! under the same kind (counter or histogram) the meter is recorded as.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

use std::collections::HashMap;
use std::time::Duration;

use idempotency_core::{CacheError, IdempotencyMetrics, Level, RecordStatus};
use idempotency_metrics::{FacadeMetrics, names};
use metrics::Unit;
use metrics_util::MetricKind;
use metrics_util::debugging::DebuggingRecorder;

/// Records every meter once through the SPI.
fn record_each_meter(m: &FacadeMetrics) {
    m.lookup_hit("PAY", Level::Distributed);
    m.replayed("PAY", RecordStatus::Completed);
    m.payload_conflict("PAY");
    m.acquired("PAY");
    m.acquire_conflict("PAY");
    m.acquire_wait("PAY", Duration::from_millis(7));
    m.persisted("PAY", RecordStatus::Rejected);
    m.cache_error("PAY", Level::Local, &CacheError::CircuitOpen);
    m.in_flight("PAY");
    m.cleanup_deleted(3);
}

/// Name -> (kind, unit, description) as the recorder reports them.
fn described(
    recorder: &DebuggingRecorder,
    describe: bool,
) -> HashMap<String, (MetricKind, Option<Unit>, Option<String>)> {
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(recorder, || {
        if describe {
            FacadeMetrics::describe();
        }
        record_each_meter(&FacadeMetrics);
    });
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, unit, description, _)| {
            let name = key.key().name().to_owned();
            (name, (key.kind(), unit, description.map(|d| d.to_string())))
        })
        .collect()
}

#[test]
fn every_meter_has_its_unit_and_description() {
    let seen = described(&DebuggingRecorder::new(), true);
    let expected = [
        (names::LOOKUP_HITS, MetricKind::Counter, Unit::Count),
        (names::REPLAYS, MetricKind::Counter, Unit::Count),
        (names::CONFLICTS, MetricKind::Counter, Unit::Count),
        (names::ACQUIRED, MetricKind::Counter, Unit::Count),
        (names::ACQUIRE_CONFLICTS, MetricKind::Counter, Unit::Count),
        (names::ACQUIRE_WAIT, MetricKind::Histogram, Unit::Seconds),
        (names::PERSISTED, MetricKind::Counter, Unit::Count),
        (names::CACHE_ERRORS, MetricKind::Counter, Unit::Count),
        (names::IN_FLIGHT, MetricKind::Counter, Unit::Count),
        (names::CLEANUP_DELETED, MetricKind::Counter, Unit::Count),
    ];
    assert_eq!(seen.len(), expected.len(), "{seen:?}");
    for (name, kind, unit) in expected {
        let (seen_kind, seen_unit, description) = seen
            .get(name)
            .unwrap_or_else(|| panic!("{name} not recorded: {seen:?}"));
        assert_eq!(*seen_kind, kind, "{name}");
        assert_eq!(*seen_unit, Some(unit), "{name} has no unit");
        let description = description.as_deref().unwrap_or_default();
        assert!(!description.is_empty(), "{name} has no description");
    }
}

#[test]
fn without_describe_meters_carry_no_metadata() {
    let seen = described(&DebuggingRecorder::new(), false);
    assert_eq!(seen.len(), 10, "{seen:?}");
    for (name, (_, unit, description)) in &seen {
        assert_eq!((unit, description), (&None, &None), "{name}");
    }
}
