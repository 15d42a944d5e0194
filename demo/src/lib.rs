//! The idempotency demo service: every scenario of both reference documents, over axum.
//!
//! Runs on PostgreSQL when `DATABASE_URL` is set, on MySQL / MariaDB when `MYSQL_URL` (or a
//! `mysql://` `DATABASE_URL`) is set, and on an embedded SQLite file otherwise; uses
//! Redis as L2 when `REDIS_URL` is set and NATS JetStream for the outbox when `NATS_URL` is set
//! (a logging publisher otherwise). See `demo/README.md` and `demo/scenarios.sh`.

pub mod admin;
pub mod app;
pub mod config;
pub mod db;
pub mod model;
pub mod openapi;
pub mod ops;
pub mod problem;
pub mod reconcile;
pub mod scope;
pub mod telemetry;
mod v2;

pub use app::{App, DemoService, router};

use idempotency::{Builder, Idempotency, MaybePublisher};

use crate::config::DemoConfig;
use crate::db::Database;

/// Starting the demo failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartupError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    /// The library could not be assembled from the configuration (the message names the
    /// property).
    #[error(transparent)]
    Idempotency(#[from] idempotency::Error),
    /// A database call failed.
    #[error("database error")]
    Database(#[from] sqlx::Error),
    /// The SQLite file could not be opened.
    #[error("SQLite")]
    SqliteStore(#[from] idempotency_sqlite::Error),
    /// `demo.sqlite-path` is not a file path SQLite would open as one.
    #[error("demo.sqlite-path (DEMO__SQLITE_PATH) {path:?} is refused: {reason}")]
    SqlitePath {
        /// The setting's value.
        path: String,
        /// Why, and what to write instead.
        reason: String,
    },
    /// The outbox publisher could not be set up.
    #[error("outbox")]
    Outbox(#[from] idempotency_outbox::Error),
    /// NATS could not be reached or configured.
    #[error("NATS: {0}")]
    Nats(String),
    /// The metrics recorder could not be installed.
    #[error("metrics recorder")]
    Metrics(#[from] idempotency::metrics::BuildError),
    /// `admin.token` is refused.
    #[error(transparent)]
    Admin(#[from] admin::AdminTokenError),
    /// Binding or serving failed.
    #[error("I/O")]
    Io(#[from] std::io::Error),
}

/// The demo's whole wiring of the library: creates the business tables, then the facade
/// assembles store, caches, meters, outbox, relay (to `publisher`, when given) and cleanup
/// from `config`, on `pool`.
pub async fn assemble<DB, P>(
    pool: DB::Pool,
    config: &DemoConfig,
    publisher: Option<P>,
    prometheus: Option<idempotency::metrics::PrometheusHandle>,
) -> Result<(DB, Idempotency<DB::Pool>), StartupError>
where
    DB: Database,
    P: MaybePublisher + idempotency_outbox::Publisher,
{
    DB::create_business_tables(&pool).await?;
    let settings = config.settings();
    let mut builder = Builder::new(&settings);
    if let Some(handle) = prometheus {
        builder = builder.prometheus(handle);
    }
    let idempotency = match publisher {
        Some(publisher) => builder.publisher(publisher).build(pool.clone()).await?,
        None => builder.build(pool.clone()).await?,
    };
    let outbox = idempotency.outbox()?.clone();
    let db = DB::new(pool, idempotency.store().clone(), outbox);
    Ok((db, idempotency))
}

/// [`assemble`] without a relay (`outbox.relay.enabled: false`) and without Prometheus, as
/// the tests use it.
pub async fn assemble_without_relay<DB: Database>(
    pool: DB::Pool,
    config: &DemoConfig,
) -> Result<(DB, Idempotency<DB::Pool>), StartupError> {
    assemble::<DB, idempotency::NoPublisher>(pool, config, None, None).await
}
