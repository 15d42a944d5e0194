//! This crate's errors, and how SQLite errors map to the core's [`StoreError`].

use std::fmt;

use idempotency_core::StoreError;

/// Setting up the store failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The configured table name is not a safe identifier, or names a schema SQLite lacks.
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
    /// A database call failed (including opening the database file).
    #[error("database error")]
    Database(#[from] sqlx::Error),
    /// A plain path given to [`connect_options`](crate::connect_options) that SQLite would not
    /// take as a file name (`file:...`, `:memory:`).
    #[error("invalid SQLite path {path:?}: {reason}")]
    InvalidPath {
        /// The path as given.
        path: String,
        /// Why it is refused, and what to write instead.
        reason: &'static str,
    },
    /// The permissions of a database file [`open_pool`](crate::open_pool) created could not be
    /// restricted to its owner.
    #[error("cannot restrict the permissions of {}", path.display())]
    File {
        /// The file.
        path: std::path::PathBuf,
        /// What the file system said.
        #[source]
        source: std::io::Error,
    },
}

/// One difference between the table and the canonical schema.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SchemaProblem {
    /// The table does not exist in the `main` database.
    MissingTable,
    /// A column is missing.
    MissingColumn {
        /// The column.
        column: &'static str,
    },
    /// A column's declared type gives it another type affinity than the store needs (SQLite
    /// converts values to the column's affinity, so `TIMESTAMP` or `JSON` would change what is
    /// stored and how it compares).
    WrongType {
        /// The column.
        column: &'static str,
        /// The affinity the store needs: `TEXT` or `INTEGER`.
        expected: &'static str,
        /// The declared type, as written in the table definition (empty when none).
        found: String,
    },
    /// A column is `NOT NULL` where the store writes `NULL`, or the reverse. (SQLite lets a
    /// `PRIMARY KEY` column of an ordinary table hold `NULL` unless it is declared `NOT NULL`.)
    Nullability {
        /// The column.
        column: &'static str,
        /// Whether the store needs it nullable.
        nullable: bool,
    },
    /// No primary key or unique index on exactly `(operation, scope, idempotency_key)`, which
    /// `INSERT ... ON CONFLICT` relies on.
    MissingPrimaryKey,
    /// The key index compares a column with a collation other than `BINARY` (e.g. `NOCASE`),
    /// which would make keys that differ only in case the same record.
    KeyCollation {
        /// The column.
        column: &'static str,
        /// The collation found.
        found: String,
    },
    /// No index leading with `expires_at`, which cleanup relies on.
    MissingExpiryIndex,
    /// The one-row table the fencing tokens of leased claims are counted in
    /// (`<table>_lease_tokens`) is missing: leased mode needs it, with the lease columns
    /// (reported as missing columns).
    MissingLeaseCounter {
        /// The counter table, quoted.
        table: String,
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
            Self::MissingLeaseCounter { table } => write!(
                f,
                "table {table} (the fencing tokens of leased claims) is missing"
            ),
            Self::WrongType {
                column,
                expected,
                found,
            } => write!(
                f,
                "column {column} is declared {found:?}, which does not have {expected} affinity"
            ),
            Self::Nullability { column, nullable } => {
                let want = if *nullable { "nullable" } else { "NOT NULL" };
                write!(f, "column {column} must be {want}")
            }
            Self::MissingPrimaryKey => {
                f.write_str("no primary key or unique index on (operation, scope, idempotency_key)")
            }
            Self::KeyCollation { column, found } => write!(
                f,
                "key column {column} uses collation {found}, expected BINARY (keys are case-sensitive)"
            ),
            Self::MissingExpiryIndex => f.write_str("no index on expires_at"),
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

// Primary result codes (https://www.sqlite.org/rescode.html); sqlx reports the extended code,
// whose low byte is the primary one.
pub(crate) const SQLITE_BUSY: i32 = 5;
const SQLITE_LOCKED: i32 = 6;
const SQLITE_IOERR: i32 = 10;
/// The disk (or `max_page_count`) is full: like PostgreSQL's class 53 (insufficient
/// resources), the database cannot take writes now and may later.
const SQLITE_FULL: i32 = 13;
const SQLITE_CANTOPEN: i32 = 14;
/// A deferred transaction's snapshot went stale before it could write.
const SQLITE_BUSY_SNAPSHOT: i32 = 517;

/// Classifies a database error by SQLite result code and sqlx error kind, never by message text.
///
/// Public so that an action can classify its own statements' errors the same way: a lost
/// connection or a full disk becomes [`StoreError::Unavailable`] (HTTP 503 with
/// `idempotency-axum`), a
/// serialization failure or deadlock [`StoreError::Conflict`] (retryable), anything else
/// [`StoreError::Database`].
pub fn store_error(error: sqlx::Error) -> StoreError {
    let code = error
        .as_database_error()
        .and_then(|db| db.code())
        .and_then(|code| code.parse::<i32>().ok());
    match (&error, code) {
        // A stale snapshot cannot be waited out: only a new transaction can write.
        (_, Some(SQLITE_BUSY_SNAPSHOT)) => StoreError::Conflict(Box::new(error)),
        // The write lock stayed taken for the whole busy timeout.
        (_, Some(code)) if code & 0xff == SQLITE_BUSY => StoreError::LockTimeout(Box::new(error)),
        // A table lock held by another connection of a shared cache.
        (_, Some(code)) if code & 0xff == SQLITE_LOCKED => StoreError::Conflict(Box::new(error)),
        // The file cannot be opened, read or written, or the disk is full.
        (_, Some(code)) if matches!(code & 0xff, SQLITE_IOERR | SQLITE_FULL | SQLITE_CANTOPEN) => {
            StoreError::Unavailable(Box::new(error))
        }
        (
            sqlx::Error::Io(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed,
            _,
        ) => StoreError::Unavailable(Box::new(error)),
        _ => StoreError::Database(Box::new(error)),
    }
}

/// The source of the [`StoreError::Conflict`] a write inside a caller's deferred transaction
/// gets when another connection holds the write lock.
#[derive(Debug, thiserror::Error)]
#[error(
    "the transaction could not take SQLite's write lock, which another connection holds; \
     retry the request, and begin the transaction with BEGIN IMMEDIATE so that it waits"
)]
struct WriteLockNotTaken(#[source] sqlx::Error);

/// Classifies the error of a store statement that runs in a transaction (acquire, complete,
/// insert-completed). The store's own transactions hold the write lock since `BEGIN IMMEDIATE`,
/// so `SQLITE_BUSY` there comes from a caller's deferred (`BEGIN`) transaction. If it read
/// before this write, SQLite refuses the upgrade to a writer at once, without waiting
/// (its busy handler is not run for a reader, which could deadlock); if it did not, it waited
/// the busy timeout for a lock that any writer, not necessarily one holding this key, may
/// hold. Either way it is no sign of the same key in flight (`LockTimeout`, which the service
/// answers as `InFlight`, 409): it is a retryable [`StoreError::Conflict`] that names
/// `BEGIN IMMEDIATE`. Anything else is classified by [`store_error`].
pub(crate) fn in_transaction_error(error: sqlx::Error) -> StoreError {
    match store_error(error) {
        StoreError::LockTimeout(source) => match source.downcast::<sqlx::Error>() {
            Ok(error) => StoreError::Conflict(Box::new(WriteLockNotTaken(*error))),
            Err(source) => StoreError::Conflict(source),
        },
        other => other,
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
                SchemaProblem::KeyCollation {
                    column: "idempotency_key",
                    found: "NOCASE".into(),
                },
            ],
        };
        assert_eq!(
            error.to_string(),
            "table t does not match the idempotency schema: column status is missing; \
             key column idempotency_key uses collation NOCASE, expected BINARY (keys are case-sensitive)"
        );
    }

    #[test]
    fn pool_errors_are_unavailable() {
        assert!(matches!(
            store_error(sqlx::Error::PoolTimedOut),
            StoreError::Unavailable(_)
        ));
        assert!(matches!(
            store_error(sqlx::Error::RowNotFound),
            StoreError::Database(_)
        ));
    }
}
