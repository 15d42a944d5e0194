//! This crate's errors, and how MySQL errors map to the core's [`StoreError`].

use std::fmt;

use idempotency_core::{BoxError, StoreError};
use sqlx::mysql::MySqlDatabaseError;

/// Setting up the store failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The configured table name is not a safe identifier.
    #[error("invalid table name {name:?}: {reason}")]
    InvalidTableName {
        /// The name as configured.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Schema validation found the table missing or different from what the store needs.
    #[error(
        "table {table} does not match the idempotency schema: {}",
        SchemaProblems(problems)
    )]
    Schema {
        /// The table checked.
        table: String,
        /// Everything that differs.
        problems: Vec<SchemaProblem>,
    },
    /// The server is older than MySQL 8.0.16 or MariaDB 10.6: MariaDB before 10.6 and MySQL
    /// before 8.0.1 lack `SKIP LOCKED`, and MySQL before 8.0.16 parses the tables' `CHECK`
    /// constraints and ignores them.
    #[error(
        "unsupported server {version:?}: MySQL 8.0.16+ or MariaDB 10.6+ is needed (FOR UPDATE SKIP LOCKED, enforced CHECK constraints)"
    )]
    UnsupportedServer {
        /// What `SELECT VERSION()` answered.
        version: String,
    },
    /// A database call failed.
    #[error("database error")]
    Database(#[from] sqlx::Error),
}

/// One difference between the table and the canonical schema.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SchemaProblem {
    /// The table does not exist.
    MissingTable,
    /// A column is missing.
    MissingColumn {
        /// The column.
        column: &'static str,
    },
    /// A column has another type (`json` for `result_payload` too: MySQL's JSON type
    /// normalizes the text, reordering keys and rewriting numbers, so replays would not be
    /// byte-identical).
    WrongType {
        /// The column.
        column: &'static str,
        /// What the store needs.
        expected: &'static str,
        /// What the table has.
        found: String,
    },
    /// A text column is shorter than values the store writes.
    TooShort {
        /// The column.
        column: &'static str,
        /// The minimum length, in characters.
        min: i64,
        /// The column's length.
        found: i64,
    },
    /// A column is `NOT NULL` where the store writes `NULL`, or the reverse.
    Nullability {
        /// The column.
        column: &'static str,
        /// Whether the store needs it nullable.
        nullable: bool,
    },
    /// No primary key or unique index on exactly `(operation, scope, idempotency_key)` (whole
    /// columns, no prefix), which the acquire's duplicate check relies on.
    MissingPrimaryKey,
    /// No index leading with `expires_at`, which cleanup relies on.
    MissingExpiryIndex,
    /// A key column has a case- or accent-insensitive collation (MySQL's defaults, e.g.
    /// `utf8mb4_general_ci`, `utf8mb4_0900_ai_ci`, or MariaDB's `utf8mb4_uca1400_ai_cs`): the
    /// primary key would merge keys, or tenants, that differ only in case (or values that
    /// differ only in accents).
    CaseInsensitiveCollation {
        /// The column.
        column: &'static str,
        /// The collation found.
        collation: String,
    },
}

impl fmt::Display for SchemaProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::MissingTable => f.write_str("the table does not exist"),
            Self::MissingColumn { column } if matches!(*column, "trace_id" | "span_id") => write!(
                f,
                "column {column} is missing (added by migrations/{}, or by schema create)",
                crate::records::TRACE_MIGRATION
            ),
            Self::MissingColumn { column } => write!(f, "column {column} is missing"),
            Self::WrongType {
                column,
                expected,
                found,
            } => write!(f, "column {column} is {found}, expected {expected}"),
            Self::TooShort { column, min, found } => write!(
                f,
                "column {column} holds {found} characters, at least {min} are needed"
            ),
            Self::Nullability { column, nullable } => {
                let want = if *nullable { "nullable" } else { "NOT NULL" };
                write!(f, "column {column} must be {want}")
            }
            Self::MissingPrimaryKey => {
                f.write_str("no primary key or unique index on (operation, scope, idempotency_key)")
            }
            Self::MissingExpiryIndex => f.write_str("no index on expires_at"),
            Self::CaseInsensitiveCollation { column, collation } => write!(
                f,
                "key column {column} has the collation {collation}, which would merge keys that \
                 differ only in case or accents; use a binary collation (utf8mb4_bin)"
            ),
        }
    }
}

struct SchemaProblems<'a>(&'a [SchemaProblem]);

impl fmt::Display for SchemaProblems<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, problem) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{problem}")?;
        }
        Ok(())
    }
}

/// The server ended the caller's whole transaction while one of this crate's statements ran in
/// it, or before it: InnoDB rolled it back (a deadlock, 1213; a lock wait timeout under
/// `innodb_rollback_on_timeout`; ...) and the session went back to autocommit, while sqlx still
/// counts the transaction as open. A statement of this crate that would write in the caller's
/// transaction (an acquire, an outbox enqueue, an inbox record) first makes sure that the
/// transaction is still open, so a caller whose own statement deadlocked and who went on gets
/// this error too, instead of a write that commits on its own.
///
/// Whatever ran after that would commit on its own, so the connection is closed (the server
/// ends the session): every later statement through that transaction, its commit included,
/// fails, and the pool replaces the connection. Retry the whole transaction, from its `BEGIN`,
/// not the call. It is the source of [`StoreError::Conflict`] (records store) and of the
/// outbox's `Error::Conflict` (outbox, inbox); find it with `downcast_ref`.
///
/// ```
/// use idempotency_mysql::TransactionRolledBack;
///
/// fn whole_transaction_lost(error: &idempotency_core::StoreError) -> bool {
///     std::error::Error::source(error)
///         .is_some_and(|source| source.downcast_ref::<TransactionRolledBack>().is_some())
/// }
/// # assert!(!whole_transaction_lost(&idempotency_core::StoreError::Poisoned));
/// ```
#[derive(Debug, thiserror::Error)]
#[error(
    "the server rolled back the whole transaction and the connection was closed so that \
     nothing runs outside it: retry the whole transaction, not the call"
)]
pub struct TransactionRolledBack {
    #[source]
    source: BoxError,
}

impl TransactionRolledBack {
    /// `source`: the error with which the server ended the transaction.
    pub(crate) fn new(source: impl Into<BoxError>) -> Self {
        Self {
            source: source.into(),
        }
    }
}

/// The source of a [`TransactionRolledBack`] found at one of this crate's statements when the
/// server had ended the transaction before it: an earlier statement of the caller's (a
/// deadlock, 1213) rolled it back, and the caller went on.
#[derive(Debug, thiserror::Error)]
#[error(
    "the server had ended the transaction before this statement (an earlier statement's error, \
     such as a deadlock, rolled it back)"
)]
pub(crate) struct EndedEarlier;

/// A statement of this crate that failed in the caller's transaction.
#[derive(Debug)]
pub(crate) enum InTransaction {
    /// The statement failed; the transaction is still open.
    Statement(sqlx::Error),
    /// The server ended the transaction.
    RolledBack(TransactionRolledBack),
}

impl From<InTransaction> for StoreError {
    fn from(error: InTransaction) -> Self {
        match error {
            InTransaction::Statement(error) => store_error(error),
            InTransaction::RolledBack(error) => StoreError::Conflict(Box::new(error)),
        }
    }
}

/// `ER_BAD_NULL_ERROR`: a `NOT NULL` column was given `NULL` (on MariaDB, the transaction
/// guard of this crate's inserts, `connect::IN_TRANSACTION_ONLY`).
pub(crate) const ER_BAD_NULL_ERROR: u16 = 1048;
/// `ER_DUP_ENTRY`: the key exists.
pub(crate) const ER_DUP_ENTRY: u16 = 1062;
/// `ER_LOCK_WAIT_TIMEOUT`: `innodb_lock_wait_timeout` ran out (also MariaDB's `NOWAIT`).
pub(crate) const ER_LOCK_WAIT_TIMEOUT: u16 = 1205;
/// `ER_LOCK_DEADLOCK`: InnoDB chose this transaction as the deadlock victim and rolled it back.
pub(crate) const ER_LOCK_DEADLOCK: u16 = 1213;
/// `ER_SP_DOES_NOT_EXIST`: no such savepoint (also: no transaction to hold one).
pub(crate) const ER_SP_DOES_NOT_EXIST: u16 = 1305;
/// `ER_LOCK_NOWAIT` (MySQL 8): a `NOWAIT` locking read found the row locked.
const ER_LOCK_NOWAIT: u16 = 3572;
/// Too many connections, server shutdown, connection killed, out of memory, disk full, and
/// the like: the server cannot serve the statement now.
const UNAVAILABLE: &[u16] = &[
    1021, // ER_DISK_FULL
    1037, // ER_OUTOFMEMORY
    1038, // ER_OUT_OF_SORTMEMORY
    1040, // ER_CON_COUNT_ERROR
    1041, // ER_OUT_OF_RESOURCES
    1053, // ER_SERVER_SHUTDOWN
    1152, // ER_ABORTING_CONNECTION
    1203, // ER_TOO_MANY_USER_CONNECTIONS
    1290, // ER_OPTION_PREVENTS_STATEMENT (read-only replica, --read-only)
    1792, // ER_CANT_EXECUTE_IN_READ_ONLY_TRANSACTION
    1836, // ER_READ_ONLY_MODE
    1927, // ER_CONNECTION_KILLED (MariaDB)
    4031, // ER_CLIENT_INTERACTION_TIMEOUT (MySQL 8)
];

/// The server's error number, when the error came from the server.
pub(crate) fn error_number(error: &sqlx::Error) -> Option<u16> {
    error
        .as_database_error()
        .and_then(|db| db.try_downcast_ref::<MySqlDatabaseError>())
        .map(MySqlDatabaseError::number)
}

/// Classifies a database error by MySQL error number, SQLSTATE and sqlx error kind, never by
/// message text.
///
/// Public so that an action can classify its own statements' errors the same way: a lock wait
/// timeout (1205) is [`StoreError::LockTimeout`] (HTTP 409 with `Retry-After` with
/// `idempotency-axum`), like PostgreSQL's `55P03`; a deadlock (1213) or serialization
/// failure (SQLSTATE `40001`) is [`StoreError::Conflict`] (retryable), like `40P01`; a lost
/// or killed connection, a full server or a read-only one is [`StoreError::Unavailable`]
/// (HTTP 503); anything else is [`StoreError::Database`].
pub fn store_error(error: sqlx::Error) -> StoreError {
    let number = error_number(&error);
    let sqlstate = error
        .as_database_error()
        .and_then(|db| db.code())
        .map(|code| code.into_owned());
    match (&error, number, sqlstate.as_deref()) {
        (_, Some(ER_LOCK_WAIT_TIMEOUT | ER_LOCK_NOWAIT), _) => {
            StoreError::LockTimeout(Box::new(error))
        }
        (_, Some(ER_LOCK_DEADLOCK), _) | (_, _, Some("40001")) => {
            StoreError::Conflict(Box::new(error))
        }
        (_, Some(number), _) if UNAVAILABLE.contains(&number) => {
            StoreError::Unavailable(Box::new(error))
        }
        (_, _, Some(code)) if code.starts_with("08") => StoreError::Unavailable(Box::new(error)),
        (
            sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed,
            _,
            _,
        ) => StoreError::Unavailable(Box::new(error)),
        _ => StoreError::Database(Box::new(error)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problems_are_listed_in_the_message() {
        let error = Error::Schema {
            table: "t".into(),
            problems: vec![
                SchemaProblem::MissingColumn { column: "status" },
                SchemaProblem::CaseInsensitiveCollation {
                    column: "idempotency_key",
                    collation: "utf8mb4_general_ci".into(),
                },
            ],
        };
        assert_eq!(
            error.to_string(),
            "table t does not match the idempotency schema: column status is missing; key column \
             idempotency_key has the collation utf8mb4_general_ci, which would merge keys that \
             differ only in case or accents; use a binary collation (utf8mb4_bin)"
        );
    }

    #[test]
    fn client_side_errors_are_classified_by_kind() {
        assert!(matches!(
            store_error(sqlx::Error::PoolTimedOut),
            StoreError::Unavailable(_)
        ));
        assert!(matches!(
            store_error(sqlx::Error::Io(std::io::Error::from(
                std::io::ErrorKind::ConnectionReset
            ))),
            StoreError::Unavailable(_)
        ));
        assert!(matches!(
            store_error(sqlx::Error::RowNotFound),
            StoreError::Database(_)
        ));
    }
}
