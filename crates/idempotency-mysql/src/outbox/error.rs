//! MySQL errors as [`idempotency_outbox::Error`]s, classified like the records store's
//! (the outbox SPI has its own error type; the records store maps to the core's `StoreError`
//! in `crate::error`).

use idempotency_core::StoreError;
use idempotency_outbox::Error;

use crate::error::{InTransaction, store_error};

/// Classifies `error` the way the records store does, then names it in the outbox's terms:
/// lock wait timeouts (1205) and deadlocks (1213) are retryable [`Error::Conflict`]s; lost or
/// killed connections and pool errors are [`Error::Unavailable`]; anything else is
/// [`Error::Database`].
pub(crate) fn outbox_error(error: sqlx::Error) -> Error {
    match store_error(error) {
        StoreError::LockTimeout(source) | StoreError::Conflict(source) => Error::Conflict(source),
        StoreError::Unavailable(source) => Error::Unavailable(source),
        StoreError::Database(source) => Error::Database(source),
        other => Error::Database(Box::new(other)),
    }
}

/// A statement's failure in the caller's transaction (see `connect::in_transaction`): the
/// transaction's end is a retryable [`Error::Conflict`] whose source says to retry it whole.
pub(crate) fn in_transaction_error(error: InTransaction) -> Error {
    match error {
        InTransaction::Statement(error) => outbox_error(error),
        InTransaction::RolledBack(error) => Error::Conflict(Box::new(error)),
    }
}

/// This crate's setup errors (table names, server version, introspection) in the outbox's
/// terms.
pub(crate) fn from_crate_error(error: crate::Error) -> Error {
    match error {
        crate::Error::InvalidTableName { name, reason } => Error::InvalidName {
            what: "table name",
            name,
            reason,
        },
        crate::Error::UnsupportedServer { .. } => Error::InvalidConfig {
            reason: error.to_string(),
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
        let old = from_crate_error(crate::Error::UnsupportedServer {
            version: "5.7.44".into(),
        });
        assert!(matches!(old, Error::InvalidConfig { .. }), "{old:?}");
    }
}
