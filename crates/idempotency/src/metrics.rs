//! Meters as Prometheus users expect them: `_total` counters, `_seconds` histograms with
//! buckets, one naming scheme for the idempotency (`idempotency_*`) and outbox (`outbox_*`)
//! meters, the L1 statistics as counters, and a ready `/metrics` route.

use idempotency_core::IdempotencyStore;
pub use idempotency_metrics::prometheus::{
    BuildError, PrometheusBuilder, PrometheusHandle, SECONDS_BUCKETS, builder,
};
pub use idempotency_metrics::{CachedMetrics, FacadeMetrics, names};

use crate::assemble::Service;

/// Installs the Prometheus exporter as the global `metrics` recorder, with buckets on every
/// `*_seconds` histogram, and describes every idempotency and outbox meter (`# HELP`,
/// `# TYPE`). Give the handle to [`Builder::prometheus`](crate::Builder::prometheus).
///
/// ```no_run
/// let handle = idempotency::metrics::install()?;
/// # Ok::<(), idempotency::metrics::BuildError>(())
/// ```
pub fn install() -> Result<PrometheusHandle, BuildError> {
    let handle = idempotency_metrics::prometheus::install()?;
    describe();
    Ok(handle)
}

/// Describes every meter to the installed recorder (done by [`install`]; call it after
/// installing a recorder of your own).
pub fn describe() {
    FacadeMetrics::describe();
    #[cfg(feature = "outbox")]
    idempotency_outbox::metrics::describe();
}

/// Publishes the L1 cache's statistics as `idempotency_local_cache_*_total`, when the service
/// has an L1 cache with `statistics` on.
pub fn publish_local_cache_stats<S: IdempotencyStore>(service: &Service<S>) {
    #[cfg(feature = "moka")]
    if let Some(stats) = service
        .local_cache()
        .as_ref()
        .and_then(idempotency_cache_moka::MokaCache::stats)
    {
        FacadeMetrics::local_cache_totals(
            stats.hits,
            stats.misses,
            stats.evictions,
            stats.expirations,
        );
    }
    #[cfg(not(feature = "moka"))]
    let _ = service;
}

/// `GET /metrics`: the exposition text, after publishing the L1 statistics.
#[cfg(feature = "axum")]
pub(crate) fn router<S, T>(service: Service<S>, handle: Option<PrometheusHandle>) -> axum::Router<T>
where
    S: IdempotencyStore,
    T: Clone + Send + Sync + 'static,
{
    use axum::http::{StatusCode, header};
    use axum::response::IntoResponse;

    axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || async move {
            match &handle {
                Some(handle) => {
                    publish_local_cache_stats(&service);
                    (
                        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                        handle.render(),
                    )
                        .into_response()
                }
                None => StatusCode::NOT_FOUND.into_response(),
            }
        }),
    )
}
