//! The idempotency demo service: every scenario of both reference documents, over axum.
//!
//! Runs on PostgreSQL when `DATABASE_URL` is set, on MySQL / MariaDB when `MYSQL_URL` (or a
//! `mysql://` `DATABASE_URL`) is set, and on an embedded SQLite file otherwise; uses
//! Redis as L2 when `REDIS_URL` is set and NATS JetStream for the outbox when `NATS_URL` is set
//! (a logging publisher otherwise). See `demo/README.md` and `demo/scenarios.sh`.

pub mod app;
pub mod config;
pub mod db;
pub mod model;
pub mod openapi;
pub mod ops;
pub mod problem;
pub mod scope;
mod v2;

pub use app::{App, DemoService, router};

use idempotency_cache_moka::MokaCache;
use idempotency_cache_redis::RedisCache;
use idempotency_core::{
    HashAlgorithm, IdempotencyService, IdempotencyStore, JcsFingerprint, ServiceConfig,
};
use idempotency_metrics::FacadeMetrics;

/// Starting the demo failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartupError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    /// A database call failed.
    #[error("database error")]
    Database(#[from] sqlx::Error),
    /// The PostgreSQL idempotency store could not be set up.
    #[error("PostgreSQL idempotency store")]
    PgStore(#[from] idempotency_pg::Error),
    /// The MySQL idempotency store could not be set up.
    #[error("MySQL idempotency store")]
    MysqlStore(#[from] idempotency_mysql::Error),
    /// The SQLite idempotency store could not be set up.
    #[error("SQLite idempotency store")]
    SqliteStore(#[from] idempotency_sqlite::Error),
    /// The outbox could not be set up.
    #[error("outbox")]
    Outbox(#[from] idempotency_outbox::Error),
    /// The Redis cache could not be set up.
    #[error("Redis cache")]
    Redis(#[from] idempotency_cache_redis::Error),
    /// NATS could not be reached or configured.
    #[error("NATS: {0}")]
    Nats(String),
    /// The metrics recorder could not be installed.
    #[error("metrics recorder")]
    Metrics(#[from] metrics_exporter_prometheus::BuildError),
    /// The cleanup schedule is not a valid cron expression.
    #[error(transparent)]
    Cleanup(#[from] idempotency_core::cleanup::InvalidCron),
    /// Binding or serving failed.
    #[error("I/O")]
    Io(#[from] std::io::Error),
}

/// The idempotency service over `store`, configured by `idempotency.*`: moka when
/// `local-cache.enabled`, the given Redis cache, metrics on the facade.
pub fn build_service<S: IdempotencyStore>(
    store: S,
    config: &config::IdempotencySection,
    redis: Option<RedisCache>,
) -> DemoService<S> {
    let local = config
        .local_cache
        .enabled
        .then(|| MokaCache::new(&config.local_cache));
    let redis = redis.filter(|_| config.distributed_cache.enabled);
    let algorithm: HashAlgorithm = config.fingerprint.algorithm;
    IdempotencyService::builder(store)
        .config(ServiceConfig::from(&config.core()))
        .fingerprint(JcsFingerprint::new(algorithm))
        .local_cache(local)
        .distributed_cache(redis)
        .metrics(FacadeMetrics)
        .build()
}
