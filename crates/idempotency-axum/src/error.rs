//! [`Error`]: everything that can go wrong at the HTTP edge, and its problem response.

use axum::response::{IntoResponse, Response};
use idempotency_core::{BoxError, KeyError, StoreError};

use crate::header::InvalidKey;
use crate::problem::{KEY_CONFLICT_CODE, Problem, ProblemKind};

/// `Retry-After` of a `409 request-in-flight`, in seconds.
pub const RETRY_AFTER_IN_FLIGHT: u64 = 1;
/// `Retry-After` of a `409 transaction-conflict`, in seconds.
pub const RETRY_AFTER_CONFLICT: u64 = 1;
/// `Retry-After` of a `503 cache-unavailable` or `503 store-unavailable`, in seconds.
pub const RETRY_AFTER_UNAVAILABLE: u64 = 5;

/// An error at the HTTP edge. Every variant becomes an `application/problem+json` response
/// through [`IntoResponse`] (see [`Error::problem`] and the table in the crate docs).
///
/// `From<idempotency_core::Error>` lets `?` and `execute` use it as the action's error type;
/// wrap the application's technical errors with [`Error::internal`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The endpoint requires an `Idempotency-Key` header and the request has none.
    #[error("the Idempotency-Key header is missing")]
    KeyMissing,
    /// The `Idempotency-Key` header is invalid.
    #[error(transparent)]
    KeyInvalid(#[from] InvalidKey),
    /// No tenant or principal to scope the key with.
    #[error("no {from} to scope the idempotency key with")]
    ScopeMissing {
        /// Where the scope was looked for: a header name, or `principal`.
        from: &'static str,
    },
    /// The tenant or principal does not make a valid scope (bad characters, too long, or the
    /// tenant header given twice).
    #[error("the {from} does not make a valid idempotency scope")]
    ScopeInvalid {
        /// Where the scope was looked for.
        from: &'static str,
        /// The validation error, when there is one (`None`: the header was repeated).
        #[source]
        error: Option<KeyError>,
    },
    /// `execute` failed.
    #[error(transparent)]
    Idempotency(#[from] idempotency_core::Error),
    /// A technical failure of the application. Answered with a bare 500; logged with its
    /// source chain.
    #[error("internal error")]
    Internal(#[source] BoxError),
}

impl Error {
    /// Wraps a technical error of the application (database, I/O, ...): a 500 whose body says
    /// nothing about it.
    pub fn internal(error: impl Into<BoxError>) -> Self {
        Self::Internal(error.into())
    }

    /// The problem this error answers with.
    ///
    /// | error | status | `type` slug |
    /// |---|---|---|
    /// | `KeyMissing` | 400 | `idempotency-key-missing` |
    /// | `KeyInvalid` | 400 | `idempotency-key-invalid` (+ `reason`) |
    /// | `ScopeMissing` | 403 | `scope-missing` |
    /// | `ScopeInvalid` | 400 | `scope-invalid` |
    /// | `PayloadConflict` | 422 | `idempotency-key-reused` (+ `code`: `IDEMPOTENCY_KEY_CONFLICT`) |
    /// | `InFlight` | 409 + `Retry-After` | `request-in-flight` |
    /// | `AcquireExhausted`, store `Conflict` / `LockTimeout` | 409 + `Retry-After` | `transaction-conflict` |
    /// | `Cache` (fail-fast) | 503 + `Retry-After` | `cache-unavailable` |
    /// | store `Unavailable` | 503 + `Retry-After` | `store-unavailable` |
    /// | anything else | 500 | `internal-error` |
    pub fn problem(&self) -> Problem {
        use idempotency_core::Error as Core;
        match self {
            Self::KeyMissing => Problem::new(ProblemKind::KeyMissing).with_detail(
                "This operation is idempotent: send an Idempotency-Key header with a unique key per request.",
            ),
            Self::KeyInvalid(reason) => Problem::new(ProblemKind::KeyInvalid)
                .with_detail(reason.to_string())
                .with_extension("reason", reason.code()),
            Self::ScopeMissing { .. } => Problem::new(ProblemKind::ScopeMissing),
            Self::ScopeInvalid { .. } => Problem::new(ProblemKind::ScopeInvalid),
            Self::Idempotency(error) => match error {
                Core::PayloadConflict => Problem::new(ProblemKind::KeyReused)
                    .with_detail(
                        "This Idempotency-Key was already used with a different request payload; use a new key for a new request.",
                    )
                    .with_extension("code", KEY_CONFLICT_CODE),
                Core::InFlight => Problem::new(ProblemKind::InFlight)
                    .with_detail("A request with this Idempotency-Key is still being processed; retry later with the same key.")
                    .with_retry_after_secs(RETRY_AFTER_IN_FLIGHT),
                Core::AcquireExhausted { .. }
                | Core::Store(StoreError::Conflict(_) | StoreError::LockTimeout(_)) => {
                    Problem::new(ProblemKind::TransactionConflict)
                        .with_retry_after_secs(RETRY_AFTER_CONFLICT)
                }
                Core::Cache(_) => Problem::new(ProblemKind::CacheUnavailable)
                    .with_retry_after_secs(RETRY_AFTER_UNAVAILABLE),
                Core::Store(StoreError::Unavailable(_)) => {
                    Problem::new(ProblemKind::StoreUnavailable)
                        .with_retry_after_secs(RETRY_AFTER_UNAVAILABLE)
                }
                // InvalidInput can only be the operation name here (keys and scopes are
                // validated when built): a server bug, like the rest.
                _ => Problem::internal(),
            },
            Self::Internal(_) => Problem::internal(),
        }
    }

    fn log(&self) {
        let status = self.problem().status();
        let error: &(dyn std::error::Error + 'static) = self;
        if status.is_server_error() {
            if status == axum::http::StatusCode::INTERNAL_SERVER_ERROR {
                tracing::error!(error, "request failed");
            } else {
                tracing::warn!(error, status = status.as_u16(), "request failed");
            }
        } else {
            tracing::debug!(error, status = status.as_u16(), "request refused");
        }
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        self.log();
        self.problem().into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idempotency_core::{CacheError, Error as Core};

    fn io() -> BoxError {
        Box::new(std::io::Error::other(
            "connection refused to db.internal:5432",
        ))
    }

    #[test]
    fn every_core_error_maps_to_a_problem() {
        let cases: Vec<(Core, ProblemKind, Option<u64>)> = vec![
            (Core::PayloadConflict, ProblemKind::KeyReused, None),
            (Core::InFlight, ProblemKind::InFlight, Some(1)),
            (
                Core::AcquireExhausted { attempts: 3 },
                ProblemKind::TransactionConflict,
                Some(1),
            ),
            (
                Core::Store(StoreError::Conflict(io())),
                ProblemKind::TransactionConflict,
                Some(1),
            ),
            (
                Core::Store(StoreError::LockTimeout(io())),
                ProblemKind::TransactionConflict,
                Some(1),
            ),
            (
                Core::Cache(CacheError::CircuitOpen),
                ProblemKind::CacheUnavailable,
                Some(5),
            ),
            (
                Core::Store(StoreError::Unavailable(io())),
                ProblemKind::StoreUnavailable,
                Some(5),
            ),
            (
                Core::Store(StoreError::Database(io())),
                ProblemKind::Internal,
                None,
            ),
            (
                Core::Store(StoreError::Corrupt {
                    reason: "secret detail".into(),
                }),
                ProblemKind::Internal,
                None,
            ),
            (
                Core::Store(StoreError::NotProcessing { found: None }),
                ProblemKind::Internal,
                None,
            ),
            (
                Core::InvalidInput(idempotency_core::Operation::new("").unwrap_err()),
                ProblemKind::Internal,
                None,
            ),
            (
                Core::Fingerprint(idempotency_core::FingerprintError::Strategy("x".into())),
                ProblemKind::Internal,
                None,
            ),
            (
                Core::Serialization(idempotency_core::SerializationError::Custom("x".into())),
                ProblemKind::Internal,
                None,
            ),
        ];
        for (error, kind, retry) in cases {
            let problem = Error::from(error).problem();
            assert_eq!(problem.kind(), kind);
            assert_eq!(problem.status(), kind.status());
            assert_eq!(problem.retry_after_secs(), retry, "{kind:?}");
            if kind == ProblemKind::Internal {
                assert_eq!(problem.details().detail, None);
                assert!(problem.details().extensions.is_empty());
            }
        }
    }
}
