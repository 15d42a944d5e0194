//! This crate's errors, and how database errors map to the core's [`StoreError`].

use std::fmt;

use idempotency_core::StoreError;

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
    /// A column has another type.
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
        /// The minimum length.
        min: i32,
        /// The column's length.
        found: i32,
    },
    /// A column is `NOT NULL` where the store writes `NULL`, or the reverse.
    Nullability {
        /// The column.
        column: &'static str,
        /// Whether the store needs it nullable.
        nullable: bool,
    },
    /// No primary key or unique index on exactly `(operation, scope, idempotency_key)`, which
    /// `INSERT ... ON CONFLICT` relies on.
    MissingPrimaryKey,
    /// No index leading with `expires_at`, which cleanup relies on.
    MissingExpiryIndex,
    /// `result_payload` is `jsonb`, the type of tables created by earlier releases: it refuses the
    /// `\u0000` escape (every such outcome failed to store, and its retries ran the action
    /// again) and reorders keys and rewrites numbers, so replays were not byte-identical.
    /// The store needs `json`, which keeps the text as written.
    JsonbPayload,
    /// The table has the layout of the Spring Boot idempotency starter's DDL: primary key
    /// `(operation, idempotency_key)`, no `scope` column, a `result_type` column and a `json` /
    /// `jsonb` `result_payload`. Reported alone: the migration it names converts the table (and
    /// keeps every row replayable); the differences it resolves are not listed one by one.
    StarterTable {
        /// The migration file (under `migrations/`) that converts the table.
        migration: &'static str,
    },
    /// The sequence the fencing tokens of leased claims come from (`<table>_lease_token_seq`)
    /// is missing: leased mode needs it, with the lease columns (reported as missing columns).
    MissingLeaseSequence {
        /// The sequence, schema-qualified when the table is.
        sequence: String,
    },
    /// A key column has a nondeterministic (case- or accent-insensitive) collation: the
    /// primary key would merge keys, or tenants, that differ only in case.
    NondeterministicCollation {
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
                "column {column} is missing (added by \
                 migrations/{}, or by schema create)",
                crate::records::TRACE_MIGRATION
            ),
            Self::MissingColumn { column } => write!(f, "column {column} is missing"),
            Self::WrongType {
                column,
                expected,
                found,
            } => write!(f, "column {column} is {found}, expected {expected}"),
            Self::TooShort { column, min, found } => {
                write!(
                    f,
                    "column {column} holds {found} characters, at least {min} are needed"
                )
            }
            Self::Nullability { column, nullable } => {
                let want = if *nullable { "nullable" } else { "NOT NULL" };
                write!(f, "column {column} must be {want}")
            }
            Self::MissingPrimaryKey => {
                f.write_str("no primary key or unique index on (operation, scope, idempotency_key)")
            }
            Self::MissingExpiryIndex => f.write_str("no index on expires_at"),
            Self::MissingLeaseSequence { sequence } => write!(
                f,
                "sequence {sequence} (the fencing tokens of leased claims) is missing"
            ),
            Self::JsonbPayload => f.write_str(
                "column result_payload is jsonb, which cannot store \\u0000 and rewrites keys \
                 and numbers; migrate it to json with `ALTER TABLE <table> ALTER COLUMN \
                 result_payload TYPE json USING result_payload::text::json` \
                 (migrations/20261201000001_idempotency_payload_json.sql)",
            ),
            Self::StarterTable { migration } => write!(
                f,
                "the table has the layout of the Spring Boot idempotency starter (primary key \
                 (operation, idempotency_key), no scope column, result_type, result_payload \
                 jsonb); apply migrations/{migration} to convert it in place, keeping every \
                 record replayable (it is written for the table idempotency_records: for \
                 another name, run its statements with that name)"
            ),
            Self::NondeterministicCollation { column, collation } => write!(
                f,
                "column {column} has the nondeterministic collation {collation}, which would \
                 merge keys that differ only in case; use a deterministic collation (the \
                 database default, or \"C\")"
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

/// [`store_error`] for a statement that may wait for a concurrent holder of the key (`acquire`,
/// `insert_completed`): a `statement_timeout` (57014) that fires during that wait is the
/// in-flight wait running out, like `lock_timeout`, so it is [`StoreError::LockTimeout`]
/// (HTTP 409 with `Retry-After`), not a database error.
pub(crate) fn wait_error(error: sqlx::Error) -> StoreError {
    let canceled = error
        .as_database_error()
        .and_then(|db| db.code())
        .is_some_and(|code| code == "57014");
    if canceled {
        StoreError::LockTimeout(Box::new(error))
    } else {
        store_error(error)
    }
}

/// Classifies a database error by SQLSTATE and error kind, never by message text.
///
/// Public so that an action can classify its own statements' errors the same way: a lost
/// connection becomes [`StoreError::Unavailable`] (HTTP 503 with `idempotency-axum`), a
/// serialization failure or deadlock [`StoreError::Conflict`] (retryable), anything else
/// [`StoreError::Database`].
pub fn store_error(error: sqlx::Error) -> StoreError {
    let code = error
        .as_database_error()
        .and_then(|db| db.code())
        .map(|code| code.into_owned());
    match (&error, code.as_deref()) {
        // lock_not_available: the in-flight wait budget (lock_timeout) ran out.
        (_, Some("55P03")) => StoreError::LockTimeout(Box::new(error)),
        // serialization_failure, deadlock_detected
        (_, Some("40001" | "40P01")) => StoreError::Conflict(Box::new(error)),
        // connection_exception class, insufficient_resources class (too many connections, disk
        // full, out of memory), admin/crash shutdown, cannot_connect_now
        (_, Some(code))
            if code.starts_with("08")
                || code.starts_with("53")
                || matches!(code, "57P01" | "57P02" | "57P03") =>
        {
            StoreError::Unavailable(Box::new(error))
        }
        (
            sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed,
            _,
        ) => StoreError::Unavailable(Box::new(error)),
        _ => StoreError::Database(Box::new(error)),
    }
}
