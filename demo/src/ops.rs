//! Operations endpoints: `GET /health` and `GET /metrics`.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::app::App;
use crate::db::Database;

/// The state of one dependency.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Status {
    /// Answering.
    Up,
    /// Not answering.
    Down,
    /// Not configured.
    Disabled,
}

/// The body of `GET /health`.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Health {
    /// `UP` when the database answers (the caches, the broker and the relay only degrade the
    /// service: requests are served, events wait in the outbox).
    pub status: Status,
    /// The database.
    pub database: Status,
    /// The Redis cache.
    pub cache: Status,
    /// The message broker (NATS), or `DISABLED` with the logging publisher.
    pub broker: Status,
    /// The outbox relay: `DOWN` while one of its workers is not running (stopped, or
    /// panicked and waiting for its restart), `DISABLED` when none runs in this process.
    pub relay: Status,
    /// The relay's workers, when one runs in this process.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub relay_workers: Option<RelayWorkers>,
}

/// The relay's workers in `GET /health`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct RelayWorkers {
    /// Workers configured.
    pub configured: usize,
    /// Workers running now.
    pub running: usize,
    /// Worker panics since the start (each worker was restarted); above zero, a bug to look
    /// at in the logs.
    pub panics: u64,
}

/// `GET /health`: 200 when the database answers, 503 otherwise; each dependency is listed.
#[utoipa::path(
    get,
    path = "/health",
    responses(
        (status = 200, description = "The database answers", body = Health),
        (status = 503, description = "The database does not answer", body = Health),
    )
)]
pub async fn health<DB: Database>(State(app): State<Arc<App<DB>>>) -> Response {
    let database =
        match tokio::time::timeout(std::time::Duration::from_secs(2), app.db.ping()).await {
            Ok(Ok(())) => Status::Up,
            _ => Status::Down,
        };
    // The breaker and a bounded PING, not fred's connection state (which a cluster that
    // recovered through redirections never sets back to connected).
    let cache = match &app.redis {
        Some(redis) if redis.is_healthy().await => Status::Up,
        Some(_) => Status::Down,
        None => Status::Disabled,
    };
    let broker = match &app.nats {
        Some(nats) if nats.connection_state() == async_nats::connection::State::Connected => {
            Status::Up
        }
        Some(_) => Status::Down,
        None => Status::Disabled,
    };
    let health = app
        .relay
        .as_ref()
        .map(idempotency_outbox::RelayMonitor::health);
    let relay = match health {
        Some(health) if health.all_running() => Status::Up,
        Some(_) => Status::Down,
        None => Status::Disabled,
    };
    let relay_workers = health.map(|health| RelayWorkers {
        configured: health.workers,
        running: health.running,
        panics: health.worker_panics,
    });
    let status = database;
    let code = if status == Status::Up {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        code,
        Json(Health {
            status,
            database,
            cache,
            broker,
            relay,
            relay_workers,
        }),
    )
        .into_response()
}

/// `GET /metrics`: Prometheus text exposition of every metric (idempotency, outbox, process).
#[utoipa::path(
    get,
    path = "/metrics",
    responses(
        (status = 200, description = "Prometheus text exposition", body = String, content_type = "text/plain"),
        (status = 404, description = "No metrics recorder installed"),
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
        None => StatusCode::NOT_FOUND.into_response(),
    }
}
