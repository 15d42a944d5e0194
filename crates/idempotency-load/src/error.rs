//! [`Error`]: what can stop a load run or a chaos step.

use std::path::PathBuf;

use idempotency_core::BoxError;

/// A load run or a chaos step could not proceed. Failed requests are not errors: they are
/// counted in the report.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The base URL or a request could not be built.
    #[error("invalid request to {url}")]
    Request {
        /// The URL.
        url: String,
        /// Why.
        #[source]
        source: http::Error,
    },
    /// A file could not be read or written.
    #[error("file {path}")]
    File {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A line of a key log has no `key` field.
    #[error("key log line without a \"key\" field: {0}")]
    KeyLogLine(String),
    /// A command-line argument is invalid.
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// JSON could not be read or written.
    #[error("JSON")]
    Json(#[from] serde_json::Error),
    /// A PostgreSQL call failed.
    #[error("database")]
    Database(#[from] sqlx::Error),
    /// The outbox or its relay failed.
    #[error("outbox")]
    Outbox(#[from] idempotency_outbox::Error),
    /// A NATS call failed.
    #[error("NATS: {what}")]
    Nats {
        /// The call.
        what: &'static str,
        /// Why.
        #[source]
        source: BoxError,
    },
    /// A client task panicked (a bug of this tool).
    #[error("a load client failed")]
    Client(#[from] tokio::task::JoinError),
    /// Standard output or a signal handler failed.
    #[error("I/O")]
    Io(#[from] std::io::Error),
}

impl Error {
    /// A failed NATS call.
    pub(crate) fn nats(what: &'static str, source: impl Into<BoxError>) -> Self {
        Self::Nats {
            what,
            source: source.into(),
        }
    }
}
