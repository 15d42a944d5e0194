//! The `/health`, `/health/live` and `/health/ready` routes.

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Serialize;

use super::{HealthCheck, Liveness};
use crate::backend::Database;

/// `body` as JSON with `status`, never cached.
fn json<B: Serialize>(status: StatusCode, body: &B) -> Response {
    match serde_json::to_vec(body) {
        Ok(bytes) => (
            status,
            [
                (header::CONTENT_TYPE, "application/json"),
                (header::CACHE_CONTROL, "no-store"),
            ],
            bytes,
        )
            .into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

pub(crate) fn router<D, T>(check: HealthCheck<D>) -> axum::Router<T>
where
    D: Database,
    T: Clone + Send + Sync + 'static,
{
    let ready = move || {
        let check = check.clone();
        async move {
            let health = check.check().await;
            let status = if health.is_ready() {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            json(status, &health)
        }
    };
    axum::Router::new()
        .route(
            "/health/live",
            get(|| async { json(StatusCode::OK, &Liveness::UP) }),
        )
        .route("/health/ready", get(ready.clone()))
        .route("/health", get(ready))
}
