//! The errors `execute` can return besides the action's own.

use crate::cache::CacheError;
use crate::fingerprint::FingerprintError;
use crate::key::KeyError;
use crate::serializer::SerializationError;
use crate::store::StoreError;

/// Why `execute` could not run or replay a request.
///
/// Each variant says what the caller should do; the HTTP edge maps them to problem responses.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The operation name, scope or key is invalid. Nothing was sent to any backend.
    #[error("invalid input: {0}")]
    InvalidInput(#[from] KeyError),
    /// The record lifetime is longer than [`MAX_TTL`](crate::MAX_TTL), which backends cannot
    /// store as an expiry time (PostgreSQL would refuse every acquire). Nothing was sent to any
    /// backend. To keep records forever, set no TTL ([`Call::no_expiry`](crate::Call::no_expiry),
    /// `ttl: null` in the configuration).
    #[error(
        "record TTL of {ttl:?} exceeds the maximum of {max:?}; set no TTL to keep records forever"
    )]
    InvalidTtl {
        /// The TTL asked for.
        ttl: std::time::Duration,
        /// [`MAX_TTL`](crate::MAX_TTL).
        max: std::time::Duration,
    },
    /// The key was already used for this operation with a different request payload.
    /// The client must pick a new key for a new request.
    #[error("the idempotency key was already used with a different request payload")]
    PayloadConflict,
    /// A request with the same key is still being processed (reject policy, or the wait budget
    /// ran out). The client may retry later with the same key.
    #[error("a request with the same idempotency key is still in flight")]
    InFlight,
    /// The key kept disappearing between insert and lookup (concurrent cleanup); gave up after
    /// the configured number of attempts. Retrying is safe.
    #[error("could not acquire or replay the key after {attempts} attempts")]
    AcquireExhausted {
        /// How many attempts were made.
        attempts: u32,
    },
    /// The request could not be fingerprinted.
    #[error(transparent)]
    Fingerprint(#[from] FingerprintError),
    /// A result could not be stored, or a stored result could not be read back.
    #[error(transparent)]
    Serialization(#[from] SerializationError),
    /// The distributed cache failed and its policy is `fail-fast`; the action did not run.
    #[error("the distributed cache is unavailable (fail-fast)")]
    Cache(#[source] CacheError),
    /// The store failed.
    #[error("the idempotency store failed")]
    Store(#[from] StoreError),
}

impl Error {
    /// Whether retrying the same request with the same key may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::InFlight | Self::AcquireExhausted { .. } | Self::Cache(_) => true,
            Self::Store(store) => store.is_retryable(),
            _ => false,
        }
    }
}

/// `error` and its sources, `: `-separated: the whole story of an error in one line, for a log
/// field, a stored `last_error` or a health report.
///
/// ```
/// let io = std::io::Error::other("connection reset");
/// let error = idempotency_core::StoreError::Unavailable(Box::new(io));
/// assert!(idempotency_core::error_chain(&error).ends_with(": connection reset"));
/// ```
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
