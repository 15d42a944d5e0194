//! The Prometheus exporter, set up as users of the meters expect: `_seconds` histograms with
//! buckets (not summaries), every meter described.

use metrics_exporter_prometheus::Matcher;
pub use metrics_exporter_prometheus::{BuildError, PrometheusBuilder, PrometheusHandle};

use crate::FacadeMetrics;

/// Bucket bounds, in seconds, of every `*_seconds` histogram: 0.5 ms to 10 s, for waits on a
/// key holder and the outbox's commit-to-ack latency alike.
pub const SECONDS_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// A Prometheus exporter builder with [`SECONDS_BUCKETS`] on every metric ending in
/// `_seconds`; add your own settings, then install it.
///
/// ```
/// let builder = idempotency_metrics::prometheus::builder();
/// let recorder = builder.build_recorder(); // or `install_recorder()` for the global one
/// let handle = recorder.handle();
/// metrics::with_local_recorder(&recorder, || {
///     metrics::histogram!("idempotency_acquire_wait_seconds").record(0.003);
/// });
/// assert!(handle.render().contains("idempotency_acquire_wait_seconds_bucket{le=\"0.005\"} 1"));
/// ```
pub fn builder() -> PrometheusBuilder {
    // The matcher is a fixed suffix and the buckets are non-empty: this cannot fail.
    let builder = PrometheusBuilder::new();
    match builder.set_buckets_for_metric(Matcher::Suffix("_seconds".to_owned()), SECONDS_BUCKETS) {
        Ok(builder) => builder,
        Err(_) => PrometheusBuilder::new(),
    }
}

/// Installs [`builder`]'s recorder as the global `metrics` recorder and describes the
/// idempotency meters ([`FacadeMetrics::describe`]); render the exposition text with the
/// returned handle (a `/metrics` route). Fails if a global recorder is already installed.
///
/// ```no_run
/// let handle = idempotency_metrics::prometheus::install()?;
/// let text = handle.render();
/// # Ok::<(), idempotency_metrics::prometheus::BuildError>(())
/// ```
pub fn install() -> Result<PrometheusHandle, BuildError> {
    let handle = builder().install_recorder()?;
    FacadeMetrics::describe();
    Ok(handle)
}
