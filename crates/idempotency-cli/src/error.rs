//! [`CliError`]: what went wrong, and the exit code that says so.

use std::process::ExitCode;

use idempotency::ops::OpsError;

/// A command failed; [`code`](Self::code) is its documented exit code.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CliError {
    /// Bad input or configuration: exit 2.
    #[error("{0}")]
    Usage(String),
    /// What was asked for does not exist: exit 3.
    #[error("{0}")]
    NotFound(String),
    /// Refused, nothing changed: exit 4.
    #[error("{0}")]
    Refused(String),
    /// `schema validate` found problems: exit 5.
    #[error("{0} schema problem(s) found")]
    SchemaProblems(usize),
    /// The database cannot be reached: exit 6.
    #[error("cannot connect to the database {url}: {reason}")]
    Unreachable {
        /// The URL without its password.
        url: String,
        /// Why.
        reason: String,
    },
    /// The report could not be written to standard output (what the command did, it did):
    /// exit 1.
    #[error("cannot write the report to standard output (the command itself ran): {0}")]
    Output(std::io::Error),
    /// An operation failed: exit 1, or 2 / 6 when the cause says so.
    #[error(transparent)]
    Ops(#[from] OpsError),
}

impl CliError {
    pub(crate) fn code(&self) -> ExitCode {
        ExitCode::from(match self {
            Self::Usage(_) => 2,
            Self::NotFound(_) => 3,
            Self::Refused(_) => 4,
            Self::SchemaProblems(_) => 5,
            Self::Unreachable { .. } => 6,
            Self::Output(_) => 1,
            Self::Ops(error) => ops_code(error),
        })
    }
}

fn ops_code(error: &OpsError) -> u8 {
    match error {
        OpsError::Unsupported { .. } | OpsError::NoOutbox | OpsError::Setup(_) => 2,
        OpsError::Schema { source, .. } if invalid_name(source) => 2,
        OpsError::Store(idempotency::core::StoreError::Unavailable(_)) => 6,
        OpsError::Outbox(idempotency::outbox::Error::Unavailable(_)) => 6,
        // A change whose connection failed: unreachable, and its message says it may have
        // been applied.
        OpsError::Unconfirmed { .. } => 6,
        // A service shutting down (the CLI's own runtime never does while a command runs):
        // nothing changed, try again where it runs.
        OpsError::ShuttingDown { .. } => 6,
        OpsError::Outbox(idempotency::outbox::Error::RequeueOutOfOrder { .. }) => 4,
        _ => 1,
    }
}

/// Whether a schema error is an invalid table name (bad configuration) rather than a failed
/// statement.
fn invalid_name(source: &idempotency::core::BoxError) -> bool {
    matches!(
        source.downcast_ref::<idempotency::postgres::Error>(),
        Some(idempotency::postgres::Error::InvalidTableName { .. })
    ) || matches!(
        source.downcast_ref::<idempotency::sqlite::Error>(),
        Some(idempotency::sqlite::Error::InvalidTableName { .. })
    ) || matches!(
        source.downcast_ref::<idempotency::mysql::Error>(),
        Some(idempotency::mysql::Error::InvalidTableName { .. })
    )
}

/// The message of `error` with its causes, `: `-separated.
pub(crate) fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        let more = e.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = e.source();
    }
    text
}
