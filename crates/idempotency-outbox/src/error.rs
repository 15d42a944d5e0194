//! This crate's error type.

use std::fmt;

use idempotency_core::BoxError;

/// Everything that can go wrong in the outbox, its stores and its relay.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A configured SQL identifier (table name, notification channel) is not safe to use.
    #[error("invalid {what} {name:?}: {reason}")]
    InvalidName {
        /// What the name is for.
        what: &'static str,
        /// The name as configured.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A configuration value is out of range or inconsistent.
    #[error("invalid configuration: {reason}")]
    InvalidConfig {
        /// What is wrong.
        reason: String,
    },
    /// A configuration property cannot take effect as set; the message names it
    /// (`outbox.publisher.nats.url`).
    #[error("{property}: {reason}")]
    Property {
        /// The property, from its top-level section down.
        property: &'static str,
        /// Why, and what to do.
        reason: String,
    },
    /// An event cannot be enqueued as given (empty aggregate, header name with `:`...).
    #[error("invalid event: {reason}")]
    InvalidEvent {
        /// What is wrong.
        reason: String,
    },
    /// A write that must join the caller's transaction got a connection outside one: it would
    /// commit on its own, whatever the caller's business change does. Nothing was written.
    #[error(
        "{operation} needs a connection in a transaction (begin one, or use the connection an \
         `execute` action receives); nothing was written"
    )]
    NotInTransaction {
        /// What was called (`enqueue`, `inbox record`).
        operation: &'static str,
    },
    /// The event payload could not be serialized to JSON.
    #[error("the event payload cannot be serialized to JSON")]
    Payload(#[source] serde_json::Error),
    /// Schema validation found a table missing or different from what the store needs.
    #[error(
        "table {table} does not match the outbox schema: {}",
        Problems(problems)
    )]
    Schema {
        /// The table checked.
        table: String,
        /// Everything that differs.
        problems: Vec<SchemaProblem>,
    },
    /// A stored row could not be read (headers that are not a JSON object of strings...).
    #[error("stored outbox row is corrupt: {reason}")]
    Corrupt {
        /// What is wrong with it.
        reason: String,
    },
    /// The transaction conflicted with a concurrent one (serialization failure, deadlock
    /// between writers of the same aggregates); retrying the whole transaction is safe.
    #[error("the transaction conflicted with a concurrent one; retry it")]
    Conflict(#[source] BoxError),
    /// The database could not be reached (connection refused or lost, pool timeout).
    #[error("the database is unavailable")]
    Unavailable(#[source] BoxError),
    /// Any other database error.
    #[error("database error")]
    Database(#[source] BoxError),
    /// A requeue was refused: these dead letters' aggregates already published a later event
    /// (their successors went out while they were dead-lettered), so requeuing them would
    /// publish them out of order. Nothing was requeued.
    #[error(
        "{} dead letter(s) have a later event of their aggregate already published: requeuing \
         them would publish them out of order; nothing was requeued",
        ids.len()
    )]
    RequeueOutOfOrder {
        /// The dead letters refused.
        ids: Vec<uuid::Uuid>,
    },
    /// A publisher could not be set up (connecting to the broker, declaring topology).
    #[error("publisher setup failed")]
    Publisher(#[source] crate::publisher::PublishError),
}

impl Error {
    /// Whether retrying the operation (or the caller's whole transaction) may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Conflict(_) | Self::Unavailable(_))
    }

    pub(crate) fn invalid_config(reason: impl Into<String>) -> Self {
        Self::InvalidConfig {
            reason: reason.into(),
        }
    }

    pub(crate) fn invalid_event(reason: impl Into<String>) -> Self {
        Self::InvalidEvent {
            reason: reason.into(),
        }
    }
}

/// One difference between a live table and the canonical schema.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SchemaProblem {
    /// The table does not exist.
    MissingTable {
        /// The table.
        table: String,
    },
    /// A column is missing.
    MissingColumn {
        /// The table.
        table: String,
        /// The column.
        column: &'static str,
    },
    /// A column has another type.
    WrongType {
        /// The table.
        table: String,
        /// The column.
        column: &'static str,
        /// What the store needs.
        expected: &'static str,
        /// What the table has.
        found: String,
    },
    /// A column still has the type an older version of the schema gave it; `migration`
    /// converts it in place.
    OutdatedType {
        /// The table.
        table: String,
        /// The column.
        column: &'static str,
        /// What the store needs.
        expected: &'static str,
        /// What the table has.
        found: String,
        /// Why the old type does not do.
        reason: &'static str,
        /// The migration file (under `migrations/`) that converts it.
        migration: &'static str,
    },
    /// A column is `NOT NULL` where the store writes `NULL`, or the reverse.
    Nullability {
        /// The table.
        table: String,
        /// The column.
        column: &'static str,
        /// Whether the store needs it nullable.
        nullable: bool,
    },
    /// An index the store's queries rely on is missing (named by its leading columns).
    MissingIndex {
        /// The table.
        table: String,
        /// What the index is for.
        purpose: &'static str,
    },
    /// The table is laid out otherwise than configured: a plain table where a partitioned one
    /// is configured (`outbox.partitioning.enabled`), or the reverse, or partitioned by
    /// another key.
    Layout {
        /// The table.
        table: String,
        /// What the configuration needs, e.g. `partitioned by RANGE (created_at)`.
        expected: &'static str,
        /// What the table is.
        found: String,
    },
}

impl fmt::Display for SchemaProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::MissingTable { table } => write!(f, "table {table} does not exist"),
            Self::MissingColumn { table, column } => {
                write!(f, "column {table}.{column} is missing")
            }
            Self::WrongType {
                table,
                column,
                expected,
                found,
            } => write!(f, "column {table}.{column} is {found}, expected {expected}"),
            Self::OutdatedType {
                table,
                column,
                expected,
                found,
                reason,
                migration,
            } => write!(
                f,
                "column {table}.{column} is {found}, the type of an older schema, expected \
                 {expected} ({reason}); run migrations/{migration} (or its statements with your \
                 table name) to convert it"
            ),
            Self::Nullability {
                table,
                column,
                nullable,
            } => {
                let want = if *nullable { "nullable" } else { "NOT NULL" };
                write!(f, "column {table}.{column} must be {want}")
            }
            Self::MissingIndex { table, purpose } => {
                write!(f, "table {table} lacks the index {purpose}")
            }
            Self::Layout {
                table,
                expected,
                found,
            } => write!(
                f,
                "table {table} is {found}, but the configuration needs it {expected} \
                 (outbox.partitioning.enabled)"
            ),
        }
    }
}

struct Problems<'a>(&'a [SchemaProblem]);

impl fmt::Display for Problems<'_> {
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
