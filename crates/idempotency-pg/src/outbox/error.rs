//! PostgreSQL errors as [`idempotency_outbox::Error`]s, classified by the crate's one SQLSTATE
//! classifier ([`store_error`](crate::store_error)) and named in the outbox's terms (the outbox
//! SPI has its own error type; the records store maps to the core's `StoreError`).

use idempotency_core::StoreError;
use idempotency_outbox::Error;

use crate::error::store_error;

/// Classifies `error` the way the records store does, then names it in the outbox's terms:
/// a lock timeout (55P03), a serialization failure or a deadlock are retryable
/// [`Error::Conflict`]s; connection errors, class 53 (too many connections, disk full) and
/// shutdowns are [`Error::Unavailable`]; anything else is [`Error::Database`].
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
