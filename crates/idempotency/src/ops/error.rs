//! [`OpsError`]: why an operator operation failed.

use idempotency_core::{BoxError, StoreError};

/// An operator operation failed. Nothing was changed unless it is [`OpsError::Partial`] (or
/// the message says so).
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
    /// The record was deleted, but its L2 (Redis) entry could not be: the old outcome
    /// replays from it until its TTL, unless it is deleted by hand.
    #[error(
        "the record was deleted, but its Redis (L2) entry could not be ({source}): it replays \
         until its TTL unless the Redis key {key:?} is deleted by hand"
    )]
    Cache {
        /// The entry's Redis key.
        key: String,
        /// Why it could not be deleted.
        #[source]
        source: BoxError,
    },
    /// A bulk change (requeue, discard) failed after earlier batches of it had committed:
    /// `done` rows were changed, the rest not.
    #[error("{done} row(s) were changed before a later batch failed: {source}")]
    Partial {
        /// The rows the committed batches changed.
        done: u64,
        /// Why the next batch failed (nothing of it changed).
        #[source]
        source: Box<OpsError>,
    },
}

impl OpsError {
    /// `self` after `done` rows of a bulk change were changed: [`OpsError::Partial`] when
    /// some were, `self` when none were.
    pub(crate) fn after(self, done: u64) -> Self {
        if done == 0 {
            self
        } else {
            Self::Partial {
                done,
                source: Box::new(self),
            }
        }
    }

    pub(crate) fn schema(table: &str, source: impl Into<BoxError>) -> Self {
        Self::Schema {
            table: table.to_owned(),
            source: source.into(),
        }
    }
}
