#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod error;
mod extract;
mod header;
mod json;
mod layer;
mod outcome;
mod path;
mod problem;
mod query;
mod scope;
mod stored;

pub use error::{Error, RETRY_AFTER_CONFLICT, RETRY_AFTER_IN_FLIGHT, RETRY_AFTER_UNAVAILABLE};
pub use extract::{IdempotencyKeyHeader, UuidKeyHeader};
pub use header::{IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED, InvalidKey, parse_key, parse_uuid_key};
pub use json::{ProblemJson, json_rejection_problem};
pub use layer::{
    ClaimFirst, DEFAULT_MAX_REQUEST_BODY, DEFAULT_MAX_RESPONSE_BODY, DEFAULT_MAX_WAITERS_PER_KEY,
    DEFAULT_METHODS, IdempotencyLayer, IdempotencyMiddleware, IdempotentTx, LeasedIdempotencyLayer,
    LeasedMiddleware, Mode, Optimistic, ScopeRequired, SharedScope, StoredStatuses,
};
pub use outcome::{IdempotentJson, IdempotentResponse, OutcomeExt, rejection_problem};
pub use path::ProblemPath;
pub use problem::{
    KEY_CONFLICT_CODE, PROBLEM_JSON, PROBLEM_TYPE_BASE, Problem, ProblemExtensions, ProblemKind,
};
pub use query::ProblemQuery;
pub use scope::{
    Principal, PrincipalScope, ScopeSource, ScopedKey, TenantHeader, TenantHeaderName, XTenantId,
};
pub use stored::{
    DEFAULT_STORED_HEADERS, HeaderFilter, SensitiveHeader, StoredResponse, is_sensitive,
};

/// The RFC 9457 crate the problem responses are built on.
pub use problem_details;
