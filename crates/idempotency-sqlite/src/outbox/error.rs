//! SQLite errors as [`idempotency_outbox::Error`]s, classified by result code and sqlx error
//! kind, never by message text (the outbox SPI has its own error type; the records store maps
//! to the core's `StoreError` in `crate::error`).

use idempotency_core::StoreError;
use idempotency_outbox::Error;

use crate::error::store_error;

/// Classifies `error` the way the records store does, then names it in the outbox's terms:
/// `SQLITE_BUSY` (the write lock stayed taken for the whole busy timeout), a stale snapshot
/// and shared-cache table locks are retryable [`Error::Conflict`]s; I/O, cannot-open and pool
/// errors are [`Error::Unavailable`]; anything else is [`Error::Database`].
pub(crate) fn outbox_error(error: sqlx::Error) -> Error {
    match store_error(error) {
        StoreError::LockTimeout(source) | StoreError::Conflict(source) => Error::Conflict(source),
        StoreError::Unavailable(source) => Error::Unavailable(source),
        StoreError::Database(source) => Error::Database(source),
        other => Error::Database(Box::new(other)),
    }
}

/// This crate's setup errors (table names, schema introspection) in the outbox's terms.
pub(crate) fn from_crate_error(error: crate::Error) -> Error {
    match error {
        crate::Error::InvalidTableName { name, reason } => Error::InvalidName {
            what: "table name",
            name,
            reason,
        },
        crate::Error::Database(error) => outbox_error(error),
        other => Error::Database(Box::new(other)),
    }
}

/// A stored row that cannot be read back.
pub(crate) fn corrupt(reason: impl Into<String>) -> Error {
    Error::Corrupt {
        reason: reason.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification_follows_the_records_store() {
        assert!(matches!(
            outbox_error(sqlx::Error::PoolTimedOut),
            Error::Unavailable(_)
        ));
        assert!(matches!(
            outbox_error(sqlx::Error::RowNotFound),
            Error::Database(_)
        ));
        let invalid = from_crate_error(crate::Error::InvalidTableName {
            name: "a b".into(),
            reason: "bad",
        });
        assert!(matches!(
            invalid,
            Error::InvalidName {
                what: "table name",
                ..
            }
        ));
    }
}
