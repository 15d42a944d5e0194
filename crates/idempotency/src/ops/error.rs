//! [`OpsError`]: why an operator operation failed.

use idempotency_core::{BoxError, StoreError};

/// An operator operation failed. Nothing was changed unless it is [`OpsError::Partial`] or
/// [`OpsError::Unconfirmed`] (or the message says so).
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
    /// The service or its runtime is shutting down, and the operation would need what it
    /// quits (the service's Redis client): refused before anything changed. Run it again on
    /// a running instance (or with the CLI). An eviction the runtime's shutdown cut short is
    /// this inside [`OpsError::Unconfirmed`]: it may have deleted the record.
    #[error("{operation}: {reason}")]
    ShuttingDown {
        /// The operation.
        operation: &'static str,
        /// What is shutting down, and that nothing changed.
        reason: String,
    },
    /// An outbox operation, but the configuration has no `outbox` section.
    #[error("no outbox is configured: the configuration has no `outbox` section")]
    NoOutbox,
    /// The key's L2 (Redis) entry could not be deleted. With `evicted`, its record was (the
    /// old outcome replays from the entry until its TTL); without, there was no record, and
    /// whether an entry is left is unknown. Evicting the key again deletes it
    /// ([`Operations::key_evict`](super::Operations::key_evict) deletes the entry of a key
    /// without a record too).
    #[error(
        "{}",
        if *evicted {
            format!(
                "the record is deleted, but its Redis (L2) entry could not be ({source}): the \
                 old outcome replays from it until its TTL unless the key is evicted again"
            )
        } else {
            format!(
                "the key has no record; whether Redis (L2) holds an entry for it is unknown \
                 (deleting it failed: {source}): evict the key again once Redis answers"
            )
        }
    )]
    Cache {
        /// The entry's Redis key.
        key: String,
        /// Whether the record was deleted (else there was none).
        evicted: bool,
        /// Why it could not be deleted.
        #[source]
        source: BoxError,
    },
    /// A change's statement was sent and its connection failed before the answer came back:
    /// it may have been applied (its commit reached the database, the answer did not come
    /// back), or not. An eviction is safe to run again (it also deletes a cache entry left
    /// behind); for the outbox, look first (`outbox status`, `outbox dead list`).
    #[error("the change may or may not have been applied: {source}")]
    Unconfirmed {
        /// The connection's failure.
        #[source]
        source: Box<OpsError>,
    },
    /// A bulk change (requeue, discard, purge, cleanup) failed after earlier batches of it had
    /// committed: `done` rows were changed (a partition a cleanup dropped counts as one); the failed batch was not, unless `source` is
    /// [`OpsError::Unconfirmed`]; the rest were not.
    #[error("{done} row(s) were changed before a later batch failed: {source}")]
    Partial {
        /// The rows the committed batches changed.
        done: u64,
        /// Why the next batch failed.
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

    /// `self` as the failure of a change's statement: a connection that failed with the
    /// statement possibly sent (an I/O or TLS error, the connection's worker gone) becomes
    /// [`OpsError::Unconfirmed`]; anything else stays as it is: the database refused it, or
    /// no connection was had (a pool timeout, a refused connection), and nothing was sent.
    pub(crate) fn of_change(self) -> Self {
        let source = match &self {
            Self::Store(StoreError::Unavailable(source))
            | Self::Outbox(idempotency_outbox::Error::Unavailable(source)) => source,
            _ => return self,
        };
        if lost_on_the_wire(source) {
            Self::Unconfirmed {
                source: Box::new(self),
            }
        } else {
            self
        }
    }

    #[cfg(feature = "redis")]
    /// `self` ([`OpsError::Cache`]) after an eviction that deleted the record (`evicted`) or
    /// found none.
    pub(crate) fn evicted(self, evicted: bool) -> Self {
        match self {
            Self::Cache { key, source, .. } => Self::Cache {
                key,
                evicted,
                source,
            },
            other => other,
        }
    }

    /// Whether the change may have been applied in part or in whole: [`OpsError::Partial`],
    /// [`OpsError::Unconfirmed`], or [`OpsError::Cache`] after the record was deleted.
    pub fn changed_something(&self) -> bool {
        matches!(
            self,
            Self::Partial { .. } | Self::Unconfirmed { .. } | Self::Cache { evicted: true, .. }
        )
    }

    pub(crate) fn schema(table: &str, source: impl Into<BoxError>) -> Self {
        Self::Schema {
            table: table.to_owned(),
            source: source.into(),
        }
    }
}

/// Whether `source` is a connection's failure after which a statement sent may have run: an
/// I/O error (reset, broken pipe, end of stream, timeout, unreachable), or the connection's
/// worker gone. Not a TLS handshake, nor an I/O error that only opening a connection gives
/// (refused, no such address): nothing was sent. An error this cannot place (a failed name
/// lookup) counts as lost: "may have been applied" is the safe side.
fn lost_on_the_wire(source: &BoxError) -> bool {
    #[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
    match source.downcast_ref::<sqlx::Error>() {
        Some(sqlx::Error::Io(io)) => return !opening(io),
        Some(sqlx::Error::WorkerCrashed) => return true,
        // The server (or a pooler) ended the connection under the statement: a connection
        // failure, an administrator's or a crash's shutdown; not one refused while opening.
        Some(sqlx::Error::Database(error)) => {
            return error.code().is_some_and(|code| {
                (code.starts_with("08") && !matches!(&*code, "08001" | "08004"))
                    || matches!(&*code, "57P01" | "57P02")
            });
        }
        Some(_) => return false,
        None => {}
    }
    source
        .downcast_ref::<std::io::Error>()
        .is_some_and(|io| !opening(io))
}

/// Whether `io` is an error only the opening of a connection gives.
fn opening(io: &std::io::Error) -> bool {
    use std::io::ErrorKind::{AddrInUse, AddrNotAvailable, ConnectionRefused, NotFound};
    matches!(
        io.kind(),
        ConnectionRefused | NotFound | AddrNotAvailable | AddrInUse
    )
}

#[cfg(all(test, any(feature = "postgres", feature = "sqlite", feature = "mysql")))]
mod tests {
    use super::*;

    fn lost() -> BoxError {
        Box::new(sqlx::Error::Io(std::io::Error::from(
            std::io::ErrorKind::ConnectionReset,
        )))
    }

    #[test]
    fn a_change_lost_on_its_connection_may_have_been_applied() {
        let error = OpsError::from(idempotency_outbox::Error::Unavailable(lost())).of_change();
        assert!(matches!(error, OpsError::Unconfirmed { .. }), "{error:?}");
        assert!(error.to_string().contains("may or may not"), "{error}");
        assert!(error.changed_something());
        let error = OpsError::from(StoreError::Unavailable(lost())).of_change();
        assert!(matches!(error, OpsError::Unconfirmed { .. }), "{error:?}");
        let partial = error.after(3);
        assert!(partial.to_string().contains("may or may not"), "{partial}");
        assert!(partial.changed_something());
        // Refused by the database, or no connection had: nothing was applied.
        let refused = OpsError::from(StoreError::Database(lost())).of_change();
        assert!(matches!(refused, OpsError::Store(_)), "{refused:?}");
        assert!(!refused.changed_something());
        for unsent in [
            sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::AddrNotAvailable)),
            sqlx::Error::PoolTimedOut,
            sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionRefused)),
            sqlx::Error::Tls("bad certificate".into()),
        ] {
            let unsent = OpsError::from(StoreError::Unavailable(Box::new(unsent))).of_change();
            assert!(matches!(unsent, OpsError::Store(_)), "{unsent:?}");
        }
    }
}
