//! [`OpsError`]: why an operator operation failed.

use idempotency_core::{BoxError, StoreError};

/// An operator operation failed. Nothing was changed unless the message says so.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpsError {
    /// The store, the outbox or the cache could not be set up from the configuration.
    #[error(transparent)]
    Setup(#[from] crate::Error),
    /// A statement of the records table failed.
    #[error("records table: {0}")]
    Store(#[from] StoreError),
    /// A statement of the outbox table failed.
    #[error("outbox table: {0}")]
    Outbox(#[from] idempotency_outbox::Error),
    /// A schema statement or a catalog query failed, or a table name is invalid.
    #[error("{table}: {source}")]
    Schema {
        /// The table, as configured.
        table: String,
        /// What failed.
        #[source]
        source: BoxError,
    },
    /// The operation does not apply to this database or configuration (partitions on SQLite,
    /// on a plain outbox).
    #[error("{operation}: {reason}")]
    Unsupported {
        /// The operation.
        operation: &'static str,
        /// Why not, and what would make it apply.
        reason: String,
    },
    /// An outbox operation, but the configuration has no `outbox` section.
    #[error("no outbox is configured: the configuration has no `outbox` section")]
    NoOutbox,
    /// The L2 cache entry could not be deleted (the record was).
    #[error("the Redis entry could not be deleted: {0}")]
    Cache(#[source] BoxError),
}

impl OpsError {
    pub(crate) fn schema(table: &str, source: impl Into<BoxError>) -> Self {
        Self::Schema {
            table: table.to_owned(),
            source: source.into(),
        }
    }
}
