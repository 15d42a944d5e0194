//! RFC 9457 problem responses: one stable `type` URI per case.

use std::fmt;
use std::time::Duration;

use axum::http::{HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use problem_details::{JsonProblemDetails, ProblemDetails};
use serde_json::{Map, Value};

/// The prefix of every problem `type` URI this crate emits.
pub const PROBLEM_TYPE_BASE: &str = "https://idempotency-rs.github.io/problems/";

/// The media type of problem responses (RFC 9457).
pub const PROBLEM_JSON: &str = "application/problem+json";

/// The `code` member of the `idempotency-key-reused` problem: the body code the Spring Boot
/// idempotency starter answers a reused key with (`{"code": "IDEMPOTENCY_KEY_CONFLICT"}`, status
/// 409 there, 422 here), for clients that read it.
pub const KEY_CONFLICT_CODE: &str = "IDEMPOTENCY_KEY_CONFLICT";

/// The extension members of a [`Problem`], flattened into the JSON object.
pub type ProblemExtensions = Map<String, Value>;

macro_rules! kinds {
    ($($(#[$doc:meta])* $variant:ident => $slug:literal, $status:ident, $title:literal;)*) => {
        /// Every kind of problem this crate answers with. Each has a stable `type` URI
        /// ([`PROBLEM_TYPE_BASE`] + slug), a default status and a title.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum ProblemKind {
            $($(#[$doc])* $variant,)*
        }

        impl ProblemKind {
            /// Every kind, in documentation order.
            pub const ALL: &'static [ProblemKind] = &[$(ProblemKind::$variant),*];

            /// The last segment of the `type` URI, such as `idempotency-key-missing`.
            pub fn slug(self) -> &'static str {
                match self { $(Self::$variant => $slug,)* }
            }

            /// The full `type` URI.
            pub fn type_uri(self) -> &'static str {
                match self { $(Self::$variant => concat!("https://idempotency-rs.github.io/problems/", $slug),)* }
            }

            /// The status this kind answers with (a business rejection's may be changed).
            pub fn status(self) -> StatusCode {
                match self { $(Self::$variant => StatusCode::$status,)* }
            }

            /// The `title`: the same for every occurrence of the kind.
            pub fn title(self) -> &'static str {
                match self { $(Self::$variant => $title,)* }
            }
        }
    };
}

kinds! {
    /// The endpoint requires an `Idempotency-Key` header and the request has none.
    KeyMissing => "idempotency-key-missing", BAD_REQUEST, "Idempotency-Key header is missing";
    /// The `Idempotency-Key` header is malformed (see the `reason` member).
    KeyInvalid => "idempotency-key-invalid", BAD_REQUEST, "Idempotency-Key header is invalid";
    /// The key was already used with a different request payload.
    KeyReused => "idempotency-key-reused", UNPROCESSABLE_ENTITY, "Idempotency-Key reused with a different payload";
    /// A request with the same key is still being processed.
    InFlight => "request-in-flight", CONFLICT, "A request with this Idempotency-Key is in progress";
    /// The transaction conflicted with a concurrent one; retrying the same request is safe.
    TransactionConflict => "transaction-conflict", CONFLICT, "Concurrent update, retry the request";
    /// The distributed cache is down and its policy is fail-fast; nothing ran.
    CacheUnavailable => "cache-unavailable", SERVICE_UNAVAILABLE, "Idempotency cache unavailable";
    /// The idempotency store (the database) could not be reached; nothing ran.
    StoreUnavailable => "store-unavailable", SERVICE_UNAVAILABLE, "Idempotency store unavailable";
    /// The request carries no identity to scope the key with (no tenant, no principal).
    ScopeMissing => "scope-missing", FORBIDDEN, "No tenant or principal to scope the request";
    /// The tenant or principal does not make a valid scope.
    ScopeInvalid => "scope-invalid", BAD_REQUEST, "Invalid tenant or principal";
    /// The business operation refused the request; `code` and `details` say why. Stored and
    /// replayed like a success.
    Rejected => "request-rejected", UNPROCESSABLE_ENTITY, "The request was rejected";
    /// The request body is larger than [`IdempotencyLayer`](crate::IdempotencyLayer) buffers.
    PayloadTooLarge => "payload-too-large", PAYLOAD_TOO_LARGE, "The request body is too large";
    /// The request body could not be read to its end (the client went away mid-body).
    BodyUnreadable => "body-unreadable", BAD_REQUEST, "The request body could not be read";
    /// The request body is not JSON (400), or JSON that does not match the endpoint's type
    /// (422, set by [`ProblemJson`](crate::ProblemJson)); `detail` says where.
    InvalidRequestBody => "invalid-request-body", BAD_REQUEST, "The request body is invalid";
    /// The query string does not match the endpoint's type (set by
    /// [`ProblemQuery`](crate::ProblemQuery)); `detail` says why. Like the body's refusals,
    /// [`IdempotencyLayer`](crate::IdempotencyLayer) never stores it, whoever built it: a
    /// handler that did work before refusing must answer with another kind.
    InvalidRequestQuery => "invalid-request-query", BAD_REQUEST, "The request query is invalid";
    /// A path parameter does not match the endpoint's type, or is not UTF-8 once
    /// percent-decoded (set by [`ProblemPath`](crate::ProblemPath)); `detail` says why. Never
    /// stored by [`IdempotencyLayer`](crate::IdempotencyLayer), like the query's refusal.
    InvalidRequestPath => "invalid-request-path", BAD_REQUEST, "The request path is invalid";
    /// The request body is not `application/json` (or `application/*+json`), or has no
    /// `Content-Type`.
    UnsupportedMediaType => "unsupported-media-type", UNSUPPORTED_MEDIA_TYPE, "The request body must be application/json";
    /// Anything else. Nothing about the cause is disclosed; it is logged at `error`.
    Internal => "internal-error", INTERNAL_SERVER_ERROR, "Internal server error";
}

/// An `application/problem+json` response: a [`ProblemDetails`] object, plus `Retry-After`
/// when retrying later may succeed.
///
/// ```
/// use axum::response::IntoResponse;
/// use idempotency_axum::{Problem, ProblemKind};
///
/// let response = Problem::new(ProblemKind::InFlight).with_retry_after_secs(2).into_response();
/// assert_eq!(response.status(), 409);
/// assert_eq!(response.headers()["content-type"], "application/problem+json");
/// assert_eq!(response.headers()["retry-after"], "2");
/// ```
#[derive(Clone, PartialEq)]
pub struct Problem {
    kind: ProblemKind,
    details: ProblemDetails<ProblemExtensions>,
    retry_after: Option<u64>,
}

impl Problem {
    /// A problem of `kind`, with its type, status and title.
    pub fn new(kind: ProblemKind) -> Self {
        let details = ProblemDetails::new()
            .with_type(Uri::from_static(kind.type_uri()))
            .with_status(kind.status())
            .with_title(kind.title())
            .with_extensions(ProblemExtensions::new());
        Self {
            kind,
            details,
            retry_after: None,
        }
    }

    /// The 500 problem for a technical failure: no detail, nothing about the cause.
    pub fn internal() -> Self {
        Self::new(ProblemKind::Internal)
    }

    /// Sets the human-readable `detail`. Never put secrets or internal errors here.
    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.details.detail = Some(detail.into());
        self
    }

    /// Overrides the status (used for business rejections).
    pub fn with_status(mut self, status: StatusCode) -> Self {
        self.details.status = Some(status);
        self
    }

    /// Adds an extension member. `type`, `status`, `title`, `detail` and `instance` are
    /// reserved and ignored here.
    pub fn with_extension(mut self, name: impl Into<String>, value: impl Into<Value>) -> Self {
        let name = name.into();
        if !matches!(
            name.as_str(),
            "type" | "status" | "title" | "detail" | "instance"
        ) {
            self.details.extensions.insert(name, value.into());
        }
        self
    }

    /// Sets `Retry-After` to `seconds`.
    pub fn with_retry_after_secs(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds);
        self
    }

    /// Sets `Retry-After`, rounded up to whole seconds.
    pub fn with_retry_after(self, after: Duration) -> Self {
        let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
        self.with_retry_after_secs(secs)
    }

    /// The kind of problem.
    pub fn kind(&self) -> ProblemKind {
        self.kind
    }

    /// The status the response will carry.
    pub fn status(&self) -> StatusCode {
        self.details
            .status
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    /// The `Retry-After` value in seconds, if any.
    pub fn retry_after_secs(&self) -> Option<u64> {
        self.retry_after
    }

    /// The problem details object (serialized as the response body).
    pub fn details(&self) -> &ProblemDetails<ProblemExtensions> {
        &self.details
    }

    /// Consumes the problem and returns its details object.
    pub fn into_details(self) -> ProblemDetails<ProblemExtensions> {
        self.details
    }
}

impl fmt::Debug for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Problem")
            .field("type", &self.kind.type_uri())
            .field("status", &self.status().as_u16())
            .field("detail", &self.details.detail)
            .field("extensions", &self.details.extensions)
            .field("retry_after", &self.retry_after)
            .finish()
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.details, f)
    }
}

/// Marks the response of a request refused before its handler executed (its extractors
/// refused the body, the query or the path): [`IdempotencyLayer`](crate::IdempotencyLayer) never stores
/// it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RefusedRequest;

impl ProblemKind {
    /// Whether a problem of this kind refuses the request body, query or path, before anything
    /// executes.
    fn refuses_request(self) -> bool {
        matches!(
            self,
            Self::PayloadTooLarge
                | Self::BodyUnreadable
                | Self::InvalidRequestBody
                | Self::InvalidRequestQuery
                | Self::InvalidRequestPath
                | Self::UnsupportedMediaType
        )
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let refused = self.kind.refuses_request();
        let mut response = JsonProblemDetails::from(self.details).into_response();
        if refused {
            response.extensions_mut().insert(RefusedRequest);
        }
        if let Some(secs) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_uris_are_distinct_and_under_the_base() {
        let mut seen = std::collections::HashSet::new();
        for kind in ProblemKind::ALL {
            assert!(kind.type_uri().starts_with(PROBLEM_TYPE_BASE));
            assert!(kind.type_uri().ends_with(kind.slug()));
            assert!(seen.insert(kind.type_uri()), "{kind:?} repeats a type");
            Uri::try_from(kind.type_uri()).unwrap();
        }
    }

    #[test]
    fn reserved_members_cannot_be_overwritten() {
        let problem = Problem::new(ProblemKind::KeyInvalid)
            .with_extension("type", "x")
            .with_extension("reason", "empty");
        let body = serde_json::to_value(problem.details()).unwrap();
        assert_eq!(body["type"], ProblemKind::KeyInvalid.type_uri());
        assert_eq!(body["reason"], "empty");
        assert_eq!(body["status"], 400);
    }

    #[test]
    fn retry_after_rounds_up() {
        let p = Problem::internal().with_retry_after(Duration::from_millis(1500));
        assert_eq!(p.retry_after_secs(), Some(2));
    }
}
