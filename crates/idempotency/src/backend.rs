//! [`Database`]: the pools the facade assembles a store (and an outbox) on.

use std::future::Future;

use idempotency_core::config::PersistenceConfig;
use idempotency_core::{ExpiredCleanup, IdempotencyStore};

use crate::Error;

/// A connection pool the facade can build the idempotency store (and, with the `outbox`
/// feature, the outbox) on: `sqlx::PgPool` (feature `postgres`), `sqlx::SqlitePool`
/// (`sqlite`), `sqlx::MySqlPool` (`mysql`).
pub trait Database: Clone + Send + Sync + 'static {
    /// The idempotency store of this database.
    type Store: IdempotencyStore + ExpiredCleanup + Clone + Send + Sync + 'static;
    /// The outbox of this database.
    #[cfg(feature = "outbox")]
    #[cfg_attr(docsrs, doc(cfg(feature = "outbox")))]
    type Outbox: idempotency_outbox::RelayStore
        + idempotency_outbox::Housekeeping
        + idempotency_outbox::Enqueue<Connection = <Self::Store as IdempotencyStore>::Connection>
        + Clone
        + Send
        + Sync
        + 'static;
    /// Whether the outbox can wake its relay by notification (`outbox.notify-channel`).
    const NOTIFICATIONS: bool;
    /// Whether the outbox table can be time-partitioned (`outbox.partitioning.enabled`):
    /// PostgreSQL only. Default `false`.
    const PARTITIONED_OUTBOX: bool = false;
    /// The store, with `persistence.table-name` and `persistence.schema.mode` applied.
    fn store(
        self,
        config: &PersistenceConfig,
    ) -> impl Future<Output = Result<Self::Store, Error>> + Send;
    /// The outbox, with `outbox.table-name`, `ordering`, `notify-channel` and `schema.mode`
    /// applied.
    #[cfg(feature = "outbox")]
    #[cfg_attr(docsrs, doc(cfg(feature = "outbox")))]
    fn outbox(
        self,
        config: &idempotency_outbox::config::OutboxConfig,
    ) -> impl Future<Output = Result<Self::Outbox, Error>> + Send;
}

#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
fn store_error(error: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::Store(Box::new(error))
}

#[cfg(all(
    feature = "outbox",
    any(feature = "postgres", feature = "sqlite", feature = "mysql")
))]
fn outbox_error(error: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::Outbox(Box::new(error))
}

macro_rules! database {
    ($feature:literal, $pool:ty, $store:ty, $outbox:ty, $notifications:expr, $partitions:expr) => {
        #[cfg(feature = $feature)]
        #[cfg_attr(docsrs, doc(cfg(feature = $feature)))]
        impl Database for $pool {
            type Store = $store;
            #[cfg(feature = "outbox")]
            type Outbox = $outbox;
            const NOTIFICATIONS: bool = $notifications;
            const PARTITIONED_OUTBOX: bool = $partitions;

            async fn store(self, config: &PersistenceConfig) -> Result<Self::Store, Error> {
                <$store>::from_config(self, config)
                    .await
                    .map_err(store_error)
            }

            #[cfg(feature = "outbox")]
            async fn outbox(
                self,
                config: &idempotency_outbox::config::OutboxConfig,
            ) -> Result<Self::Outbox, Error> {
                <$outbox>::from_config(self, config)
                    .await
                    .map_err(outbox_error)
            }
        }
    };
}

database!(
    "postgres",
    sqlx::PgPool,
    idempotency_pg::PgStore,
    idempotency_pg::PgOutbox,
    true,
    true
);
database!(
    "sqlite",
    sqlx::SqlitePool,
    idempotency_sqlite::SqliteStore,
    idempotency_sqlite::SqliteOutbox,
    false,
    false
);
database!(
    "mysql",
    sqlx::MySqlPool,
    idempotency_mysql::MysqlStore,
    idempotency_mysql::MysqlOutbox,
    false,
    false
);
