//! Operations endpoints: `GET /metrics`, and the documentation of the facade's
//! `GET /health/live`, `/health/ready` and `/health` (`idempotency::Idempotency::health_router`).

use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use crate::app::App;
use crate::db::Database;

/// `GET /health/ready`: the facade's readiness report (`idempotency::health::Health`),
/// served by `Idempotency::health_router`; this function only documents it.
#[utoipa::path(
    get,
    path = "/health/ready",
    responses(
        (status = 200, description = "Ready: the database answers and the outbox backlog is within `outbox.health.max-pending-age`. Each dependency is listed: database, cache (with its breaker), relay (configured, running, panics), outbox (pending, oldest pending age, threshold, dead letters), broker, cleanup.", body = serde_json::Value),
        (status = 503, description = "Not ready: the database does not answer, or the outbox backlog is older than its threshold", body = serde_json::Value),
    )
)]
pub async fn health_ready() {}

/// `GET /health`: the same report as `/health/ready`.
#[utoipa::path(
    get,
    path = "/health",
    responses(
        (status = 200, description = "Ready (the report of `/health/ready`)", body = serde_json::Value),
        (status = 503, description = "Not ready", body = serde_json::Value),
    )
)]
pub async fn health() {}

/// `GET /health/live`: `{"status":"UP"}` while the process answers; no dependency is asked.
#[utoipa::path(
    get,
    path = "/health/live",
    responses(
        (status = 200, description = "The process answers", body = serde_json::Value),
    )
)]
pub async fn health_live() {}

/// `GET /metrics`: Prometheus text exposition of every metric (idempotency, outbox, process).
#[utoipa::path(
    get,
    path = "/metrics",
    responses(
        (status = 200, description = "Prometheus text exposition", body = String, content_type = "text/plain"),
        (status = 404, description = "No metrics recorder installed (an app built without one)", body = crate::openapi::Problem, content_type = "application/problem+json"),
    )
)]
pub async fn metrics<DB: Database>(State(app): State<Arc<App<DB>>>) -> Response {
    match &app.prometheus {
        Some(handle) => {
            idempotency::metrics::publish_local_cache_stats(&app.service);
            (
                [(
                    header::CONTENT_TYPE,
                    "text/plain; version=0.0.4; charset=utf-8",
                )],
                handle.render(),
            )
                .into_response()
        }
        None => crate::problem::not_found("metrics recorder in this app").into_response(),
    }
}
