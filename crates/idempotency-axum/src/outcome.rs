//! Turning an executed or replayed [`Outcome`] into a response.

use std::fmt;

use axum::body::Bytes;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use idempotency_core::{ExecutionResult, Outcome, Rejection};
use serde::Serialize;

use crate::header::IDEMPOTENT_REPLAYED;
use crate::problem::{Problem, ProblemKind};
use crate::stored::StoredResponse;

/// How a business rejection's status is chosen. It must depend on the rejection only, so that
/// a replay answers exactly like the first run.
#[derive(Clone, Copy)]
enum RejectionStatus {
    Fixed(StatusCode),
    ByCode(fn(&Rejection) -> StatusCode),
}

impl RejectionStatus {
    fn of(self, rejection: &Rejection) -> StatusCode {
        match self {
            Self::Fixed(status) => status,
            Self::ByCode(f) => f(rejection),
        }
    }
}

impl fmt::Debug for RejectionStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Fixed(status) => write!(f, "{}", status.as_u16()),
            Self::ByCode(_) => f.write_str("fn(&Rejection) -> StatusCode"),
        }
    }
}

/// The problem for a business rejection: `type` `request-rejected`, the given status, and the
/// members `code` and, when present, `details`.
///
/// ```
/// use axum::http::StatusCode;
/// use idempotency_axum::rejection_problem;
/// use idempotency_core::Rejection;
///
/// let rejection = Rejection::with_details("INSUFFICIENT_FUNDS", &serde_json::json!({"available": "10.00"}))?;
/// let problem = rejection_problem(&rejection, StatusCode::UNPROCESSABLE_ENTITY);
/// let body = serde_json::to_value(problem.details())?;
/// assert_eq!(body["code"], "INSUFFICIENT_FUNDS");
/// assert_eq!(body["details"]["available"], "10.00");
/// # Ok::<(), serde_json::Error>(())
/// ```
pub fn rejection_problem(rejection: &Rejection, status: StatusCode) -> Problem {
    let problem = Problem::new(ProblemKind::Rejected)
        .with_status(status)
        .with_extension("code", rejection.code());
    match rejection.details() {
        Some(details) => problem.with_extension("details", details.clone()),
        None => problem,
    }
}

/// Builds the response of an outcome: `success` renders a success value, a rejection becomes
/// [`rejection_problem`], and a replay gets `Idempotent-Replayed: true`.
fn respond<T>(
    outcome: Outcome<T>,
    rejection: RejectionStatus,
    success: impl FnOnce(T) -> Response,
) -> Response {
    let replayed = outcome.is_replayed();
    let mut response = match outcome.into_result() {
        ExecutionResult::Success(value) => success(value),
        ExecutionResult::Rejected(r) => rejection_problem(&r, rejection.of(&r)).into_response(),
    };
    if replayed {
        response.headers_mut().insert(
            IDEMPOTENT_REPLAYED.clone(),
            HeaderValue::from_static("true"),
        );
    }
    response
}

/// An outcome answered as JSON: a success is `status` with the value as JSON, a business
/// rejection is a `request-rejected` problem (422 unless configured), and a replay carries
/// `Idempotent-Replayed: true` with the same status and body as the first answer.
///
/// ```no_run
/// # use axum::http::StatusCode;
/// # use idempotency_axum::IdempotentJson;
/// # async fn h(outcome: idempotency_core::Outcome<String>) -> IdempotentJson<String> {
/// IdempotentJson::new(StatusCode::CREATED, outcome)
///     .rejection_status_by(|r| match r.code() {
///         "NOT_FOUND" => StatusCode::NOT_FOUND,
///         _ => StatusCode::UNPROCESSABLE_ENTITY,
///     })
/// # }
/// ```
#[derive(Debug)]
pub struct IdempotentJson<T> {
    status: StatusCode,
    outcome: Outcome<T>,
    rejection: RejectionStatus,
}

impl<T> IdempotentJson<T> {
    /// Answers a success with `status`; a rejection with 422.
    pub fn new(status: StatusCode, outcome: Outcome<T>) -> Self {
        Self {
            status,
            outcome,
            rejection: RejectionStatus::Fixed(StatusCode::UNPROCESSABLE_ENTITY),
        }
    }

    /// Answers every business rejection with `status`.
    pub fn rejection_status(mut self, status: StatusCode) -> Self {
        self.rejection = RejectionStatus::Fixed(status);
        self
    }

    /// Chooses a rejection's status from the rejection (its code, usually). A plain function,
    /// so that the status depends on the stored rejection alone and replays identically.
    pub fn rejection_status_by(mut self, status: fn(&Rejection) -> StatusCode) -> Self {
        self.rejection = RejectionStatus::ByCode(status);
        self
    }

    /// The outcome.
    pub fn outcome(&self) -> &Outcome<T> {
        &self.outcome
    }
}

impl<T: Serialize> IntoResponse for IdempotentJson<T> {
    /// A replayed success answers its stored text as is when it is the value's `serde_json`
    /// text ([`Outcome::stored_json`]): the bytes the first answer sent, without serializing
    /// the value again.
    fn into_response(self) -> Response {
        let status = self.status;
        let stored = self
            .outcome
            .stored_json()
            .map(|text| Bytes::copy_from_slice(text.as_bytes()));
        respond(self.outcome, self.rejection, |value| {
            match stored.map_or_else(|| serde_json::to_vec(&value).map(Bytes::from), Ok) {
                Ok(body) => (
                    status,
                    [(
                        header::CONTENT_TYPE,
                        HeaderValue::from_static("application/json"),
                    )],
                    body,
                )
                    .into_response(),
                Err(error) => {
                    tracing::error!(
                        error = &error as &dyn std::error::Error,
                        "response serialization failed"
                    );
                    Problem::internal().into_response()
                }
            }
        })
    }
}

/// An outcome whose success value is a whole [`StoredResponse`]: replays it (status, the
/// allowed headers, body), with `Idempotent-Replayed: true` on replays. Rejections as in
/// [`IdempotentJson`].
#[derive(Debug)]
pub struct IdempotentResponse {
    outcome: Outcome<StoredResponse>,
    rejection: RejectionStatus,
}

impl IdempotentResponse {
    /// Wraps the outcome; rejections answer 422.
    pub fn new(outcome: Outcome<StoredResponse>) -> Self {
        Self {
            outcome,
            rejection: RejectionStatus::Fixed(StatusCode::UNPROCESSABLE_ENTITY),
        }
    }

    /// Answers every business rejection with `status`.
    pub fn rejection_status(mut self, status: StatusCode) -> Self {
        self.rejection = RejectionStatus::Fixed(status);
        self
    }
}

impl IntoResponse for IdempotentResponse {
    fn into_response(self) -> Response {
        respond(self.outcome, self.rejection, IntoResponse::into_response)
    }
}

/// Turns an [`Outcome`] into a response in one call: `outcome.into_json(StatusCode::CREATED)`.
pub trait OutcomeExt<T>: Sized {
    /// [`IdempotentJson::new`] with `status`.
    fn into_json(self, status: StatusCode) -> IdempotentJson<T>;
}

impl<T> OutcomeExt<T> for Outcome<T> {
    fn into_json(self, status: StatusCode) -> IdempotentJson<T> {
        IdempotentJson::new(status, self)
    }
}

impl From<Outcome<StoredResponse>> for IdempotentResponse {
    fn from(outcome: Outcome<StoredResponse>) -> Self {
        Self::new(outcome)
    }
}
