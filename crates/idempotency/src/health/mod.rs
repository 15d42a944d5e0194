//! Health and readiness: what [`Idempotency::health`](crate::Idempotency::health) reports, and
//! the `/health/live` and `/health/ready` routes of
//! [`Idempotency::health_router`](crate::Idempotency::health_router) (feature `axum`).
//!
//! Liveness and readiness follow Kubernetes' convention:
//!
//! - **`GET /health/live`** answers `200 {"status":"UP"}` while the process serves HTTP. It asks
//!   no dependency: a database outage must not make the orchestrator restart every instance.
//! - **`GET /health/ready`** (and `GET /health`, the same) answers the whole [`Health`] report,
//!   `200` when the instance can serve, `503` when it cannot: the source of truth (the database)
//!   does not answer, or the outbox's oldest pending event is older than
//!   `outbox.health.max-pending-age` (the relay stopped publishing, or a broker outage outlasted
//!   the threshold), or the outbox cannot be read. The caches, the broker and the relay's workers
//!   only degrade the service (requests are served; events wait in the outbox): they are
//!   reported, and do not fail readiness.
//!
//! Each probe is bounded by [`HealthCheck::with_timeout`] (default [`DEFAULT_TIMEOUT`]), and
//! the probes run concurrently, so a hanging dependency costs one timeout, not one per probe.
//! The report names errors as the drivers word them: mount the routes where the orchestrator
//! and the operators reach them, not on a public listener.
//!
//! ```json
//! {
//!   "status": "UP",
//!   "database": { "status": "UP" },
//!   "cache": { "status": "UP", "breaker": "CLOSED", "consecutive_failures": 0,
//!              "write_breaker": "CLOSED" },
//!   "relay": { "status": "UP", "configured": 2, "running": 2, "panics": 0 },
//!   "outbox": { "status": "UP", "pending": 3, "oldest_pending_age_seconds": 0.4,
//!               "max_pending_age_seconds": 300.0, "dead_lettered": 0 },
//!   "broker": { "status": "UP", "destination": "nats" },
//!   "cleanup": { "status": "UP" }
//! }
//! ```

use std::time::Duration;

use serde::Serialize;

mod check;
#[cfg(feature = "axum")]
mod router;

pub(crate) use check::CleanupSlot;
pub use check::HealthCheck;
#[cfg(feature = "axum")]
pub(crate) use router::router;

/// How long one probe may take by default: past it, the dependency is reported `DOWN` with
/// `"timed out"`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

/// The state of one part, as `/health/ready` writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
#[non_exhaustive]
pub enum Status {
    /// Answering / running / within bounds.
    Up,
    /// Not answering, not running, or out of bounds.
    Down,
    /// The part cannot tell (a custom publisher that does not implement
    /// `idempotency_outbox::Publisher::health`).
    Unknown,
    /// Not configured in this process.
    Disabled,
}

/// The whole report: the body of `GET /health/ready`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Health {
    /// `UP` when the instance is ready ([`is_ready`](Self::is_ready)), `DOWN` otherwise.
    pub status: Status,
    /// The database, the source of truth: `UP` when it answers `SELECT 1`.
    pub database: Probe,
    /// The L2 cache (Redis) and its circuit breaker.
    pub cache: CacheHealth,
    /// The outbox relay's workers in this process.
    pub relay: RelayHealth,
    /// The outbox's backlog (the whole table, every instance's events).
    pub outbox: OutboxHealth,
    /// The relay's broker, as its publisher sees it.
    pub broker: BrokerHealth,
    /// The expired-records cleanup job (`persistence.cleanup.enabled`).
    pub cleanup: Probe,
}

impl Health {
    /// Whether the instance can serve: the database answers and the outbox's backlog is within
    /// `outbox.health.max-pending-age` (and readable).
    pub fn is_ready(&self) -> bool {
        self.database.status == Status::Up && self.outbox.status != Status::Down
    }
}

/// A part with a status and, when it is down, why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Probe {
    /// Its state.
    pub status: Status,
    /// Why it is down (the driver's error, or `timed out`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Probe {
    pub(crate) fn new(status: Status) -> Self {
        Self {
            status,
            error: None,
        }
    }

    pub(crate) fn down(error: impl Into<String>) -> Self {
        Self {
            status: Status::Down,
            error: Some(error.into()),
        }
    }
}

/// The L2 cache in [`Health`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct CacheHealth {
    /// `UP` when its breaker is closed and Redis answers a `PING` within the cache's timeout;
    /// `DISABLED` without `distributed-cache`.
    pub status: Status,
    /// The request path's circuit breaker, when there is a cache.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub breaker: Option<Breaker>,
    /// Consecutive failures counted by the closed breaker (it opens at
    /// `circuit-breaker.failure-threshold`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub consecutive_failures: Option<u32>,
    /// The breaker of writes (the after-commit `put`s, the write-behind writer), when there is
    /// a cache. Open while Redis refuses writes (`OOM`, `READONLY`) though it answers reads:
    /// replays then read the database. Shown, not part of `status` (reads are served).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub write_breaker: Option<Breaker>,
}

/// A circuit breaker's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
#[non_exhaustive]
pub enum Breaker {
    /// Calls go to Redis.
    Closed,
    /// Calls are refused until the cool-down ends (the cache is skipped).
    Open,
    /// The cool-down ended; one trial call decides.
    HalfOpen,
}

/// The relay's workers in [`Health`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct RelayHealth {
    /// `UP` when every worker runs; `DOWN` while one does not (it panicked and waits for its
    /// restart, or the relay stopped); `DISABLED` when no relay runs in this process.
    pub status: Status,
    /// Workers configured (`outbox.relay.workers`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub configured: Option<usize>,
    /// Workers running now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub running: Option<usize>,
    /// Worker panics since the start (each worker was restarted): above zero, a bug to read
    /// about in the logs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub panics: Option<u64>,
}

/// The outbox's backlog in [`Health`].
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct OutboxHealth {
    /// `DOWN` when the oldest pending event is older than `max_pending_age_seconds`, or the
    /// outbox could not be read; `DISABLED` without an `outbox` section.
    pub status: Status,
    /// Events neither published nor dead-lettered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pending: Option<u64>,
    /// Age of the oldest pending event, in seconds (0 when none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oldest_pending_age_seconds: Option<f64>,
    /// `outbox.health.max-pending-age` in seconds (absent when `null`: no threshold).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_pending_age_seconds: Option<f64>,
    /// Dead-lettered events, waiting for an operator.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dead_lettered: Option<u64>,
    /// Why the outbox could not be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The broker in [`Health`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct BrokerHealth {
    /// `UP`, `DOWN` (with `error`), `UNKNOWN` (the publisher cannot tell), or `DISABLED` when
    /// no relay runs in this process.
    pub status: Status,
    /// The publisher's label (`nats`, `rabbitmq`, `log`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub destination: Option<String>,
    /// Why it is down.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The body of `GET /health/live`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Liveness {
    /// Always `UP`: the process answers.
    pub status: Status,
}

impl Liveness {
    /// The process answers.
    pub const UP: Self = Self { status: Status::Up };
}
