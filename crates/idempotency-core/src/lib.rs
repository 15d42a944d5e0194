#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod admin;
pub mod cache;
pub mod cleanup;
pub mod config;
mod depth;
mod error;
pub mod fingerprint;
mod key;
pub mod lease;
pub mod metrics;
mod record;
mod redact;
mod result;
mod serializer;
mod service;
pub mod store;
pub mod trace;
mod tx;

#[cfg(feature = "test-utils")]
#[cfg_attr(docsrs, doc(cfg(feature = "test-utils")))]
pub mod testing;

pub use cache::{CacheError, DistributedCache, FailurePolicy, LocalCache, NoCache};
pub use depth::{JsonTooDeep, MAX_JSON_DEPTH, check_json_depth, json_depth};
pub use error::{Error, error_chain};
pub use fingerprint::{
    Fingerprint, FingerprintError, FingerprintStrategy, HashAlgorithm, JcsFingerprint,
};
pub use key::{
    IdempotencyKey, KeyError, MAX_KEY_LEN, MAX_OPERATION_LEN, MAX_SCOPE_LEN, Operation, RecordId,
    Scope,
};
pub use lease::{FencingToken, LeaseClaim, LeasedClaims};
pub use metrics::{IdempotencyMetrics, NoopMetrics};
pub use record::{IdempotencyRecord, RecordStatus, StoredOutcome, UnknownStatus};
pub use redact::redact_url;
pub use result::{ExecutionResult, Level, Origin, Outcome, Rejection};
pub use serializer::{
    JsonSerializer, MAX_REJECTION_CODE_LEN, ResultSerializer, SerializationError,
};
pub use service::{
    Call, IdempotencyService, InFlightPolicy, MAX_TTL, ServiceBuilder, ServiceOptions,
};
pub use store::{Acquire, BoxError, Claim, ExpiredCleanup, IdempotencyStore, LockWait, StoreError};
pub use tx::{Tx, TxMark};
