//! [`ProblemJson`]: a JSON request body whose rejections are problem responses.

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use crate::problem::{Problem, ProblemKind};

/// A JSON request body, extracted by [`axum::Json`], whose rejections are
/// `application/problem+json` answers instead of axum's plain-text ones:
///
/// | the body | status | `type` slug |
/// |---|---|---|
/// | not JSON (a syntax error, or cut short) | 400 | `invalid-request-body` |
/// | JSON that does not match `T` (a missing field, a wrong type, an unknown field `T` refuses) | 422 | `invalid-request-body` |
/// | no `Content-Type`, or one that is not `application/json` / `application/*+json` | 415 | `unsupported-media-type` |
/// | above the body limit (axum's `DefaultBodyLimit`) | 413 | `payload-too-large` |
/// | not readable to its end | 400 | `body-unreadable` |
///
/// `detail` is axum's description of what is wrong with the body (serde's message, with line
/// and column); it says nothing about the server. These are distinct from
/// `422 idempotency-key-reused`: a body refused here never reaches `execute`, so nothing is
/// stored and the key stays free.
///
/// ```
/// use axum::{Router, routing::post};
/// use idempotency_axum::ProblemJson;
///
/// #[derive(serde::Deserialize)]
/// struct CreatePayment { amount: u64 }
///
/// async fn create(ProblemJson(body): ProblemJson<CreatePayment>) -> String {
///     body.amount.to_string()
/// }
/// let app: Router = Router::new().route("/payments", post(create));
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct ProblemJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ProblemJson<T> {
    type Rejection = Problem;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        match axum::Json::<T>::from_request(request, state).await {
            Ok(axum::Json(value)) => Ok(Self(value)),
            Err(rejection) => Err(json_rejection_problem(&rejection)),
        }
    }
}

/// The problem for a rejection of [`axum::Json`], as [`ProblemJson`] answers it.
pub fn json_rejection_problem(rejection: &JsonRejection) -> Problem {
    let kind = match rejection {
        JsonRejection::JsonDataError(_) | JsonRejection::JsonSyntaxError(_) => {
            ProblemKind::InvalidRequestBody
        }
        JsonRejection::MissingJsonContentType(_) => ProblemKind::UnsupportedMediaType,
        _ if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => ProblemKind::PayloadTooLarge,
        _ => ProblemKind::BodyUnreadable,
    };
    let problem = Problem::new(kind).with_detail(rejection.body_text());
    if let JsonRejection::JsonDataError(_) = rejection {
        problem.with_status(StatusCode::UNPROCESSABLE_ENTITY)
    } else {
        problem
    }
}
