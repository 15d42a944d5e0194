//! The meters of one request through the Prometheus recorder: [`FacadeMetrics`] (registered
//! on every call) against [`CachedMetrics`] (handles kept), with [`NoopMetrics`] as the floor.
//!
//! `cargo bench -p idempotency-metrics --features prometheus --bench meters`

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use idempotency_core::{IdempotencyMetrics, Level, NoopMetrics, RecordStatus};
use idempotency_metrics::{CachedMetrics, FacadeMetrics};

/// What a replay from the local cache records.
fn replay(meters: &dyn IdempotencyMetrics) {
    meters.lookup_hit(black_box("create_payment"), Level::Local);
    meters.replayed(black_box("create_payment"), RecordStatus::Completed);
}

/// What a first execution records.
fn first_execution(meters: &dyn IdempotencyMetrics) {
    meters.acquire_wait(black_box("create_payment"), Duration::from_micros(300));
    meters.acquired(black_box("create_payment"));
    meters.persisted(black_box("create_payment"), RecordStatus::Completed);
}

/// What one request records, on the meters given.
type Scenario = fn(&dyn IdempotencyMetrics);

fn meters(c: &mut Criterion) {
    let recorder = idempotency_metrics::prometheus::builder().build_recorder();
    let _in_effect = metrics::set_default_local_recorder(&recorder);
    let cached = CachedMetrics::default();
    let scenarios: [(&str, Scenario); 2] =
        [("replay", replay), ("first_execution", first_execution)];
    let implementations: [(&str, &dyn IdempotencyMetrics); 3] = [
        ("noop", &NoopMetrics),
        ("facade", &FacadeMetrics),
        ("cached", &cached),
    ];
    for (scenario, record) in scenarios {
        let mut group = c.benchmark_group(scenario);
        for (name, meters) in implementations {
            group.bench_function(name, |b| b.iter(|| record(meters)));
        }
        group.finish();
    }
}

criterion_group!(benches, meters);
criterion_main!(benches);
