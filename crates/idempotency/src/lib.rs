#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(all(
    feature = "admin",
    any(feature = "postgres", feature = "sqlite", feature = "mysql")
))]
#[cfg_attr(docsrs, doc(cfg(feature = "admin")))]
pub mod admin;
mod assemble;
mod backend;
#[cfg(feature = "outbox")]
mod enqueue;
mod error;
pub mod health;
mod load;
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub mod metrics;
#[cfg(all(
    feature = "ops",
    any(feature = "postgres", feature = "sqlite", feature = "mysql")
))]
#[cfg_attr(docsrs, doc(cfg(feature = "ops")))]
pub mod ops;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql")))
)]
pub mod pool;
mod report;
mod settings;
#[cfg(feature = "axum")]
mod signal;

pub use assemble::{
    Builder, DistributedTier, Idempotency, LocalTier, MaybePublisher, Meters, NoPublisher, Service,
    ShutdownReport,
};
pub use backend::Database;
#[cfg(feature = "outbox")]
#[cfg_attr(docsrs, doc(cfg(feature = "outbox")))]
pub use enqueue::EnqueueInTx;
pub use error::Error;
pub use load::{LoadError, Loader};
pub use report::Report;
pub use settings::{IdempotencyConfig, Settings};
#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub use signal::shutdown_signal;

/// The core: the service, keys, outcomes, the store SPI, configuration types.
pub use idempotency_core as core;
pub use idempotency_core::{
    Call, ExecutionResult, IdempotencyKey, IdempotencyService, Outcome, Rejection, Scope, Tx,
};

/// The PostgreSQL store and outbox (`idempotency-pg`).
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use idempotency_pg as postgres;

/// The SQLite store and outbox (`idempotency-sqlite`).
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use idempotency_sqlite as sqlite;

/// The MySQL / MariaDB store and outbox (`idempotency-mysql`).
#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub use idempotency_mysql as mysql;

/// The sqlx version the stores are built on.
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql")))
)]
pub use sqlx;

/// The L1 cache (`idempotency-cache-moka`).
#[cfg(feature = "moka")]
#[cfg_attr(docsrs, doc(cfg(feature = "moka")))]
pub use idempotency_cache_moka as moka;

/// The L2 cache (`idempotency-cache-redis`).
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use idempotency_cache_redis as redis;

/// The transactional outbox, its relay and publishers (`idempotency-outbox`).
#[cfg(feature = "outbox")]
#[cfg_attr(docsrs, doc(cfg(feature = "outbox")))]
pub use idempotency_outbox as outbox;

/// Extractors, problem responses and the tower middleware (`idempotency-axum`).
#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub use idempotency_axum as axum;

/// The caller's side: a reqwest middleware that retries with one key (`idempotency-client`).
#[cfg(feature = "client")]
#[cfg_attr(docsrs, doc(cfg(feature = "client")))]
pub use idempotency_client as client;
