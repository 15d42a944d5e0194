//! The demo's own problem responses (RFC 9457), next to the ones `idempotency-axum` answers:
//! invalid fields, malformed or oversized bodies, unknown resources.

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Request};
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use idempotency_axum::problem_details::ProblemDetails;
use idempotency_axum::{PROBLEM_TYPE_BASE, ProblemExtensions};
use serde::de::DeserializeOwned;

/// A problem response of the demo.
#[derive(Debug, Clone)]
pub struct ApiProblem {
    details: Box<ProblemDetails<ProblemExtensions>>,
}

impl ApiProblem {
    /// A problem with a slug under the shared type base, a status, a title and a detail.
    pub fn new(slug: &str, status: StatusCode, title: &str, detail: impl Into<String>) -> Self {
        let uri: Uri = format!("{PROBLEM_TYPE_BASE}{slug}")
            .parse()
            .unwrap_or_else(|_| Uri::from_static("about:blank"));
        Self {
            details: Box::new(
                ProblemDetails::new()
                    .with_type(uri)
                    .with_status(status)
                    .with_title(title)
                    .with_detail(detail)
                    .with_extensions(ProblemExtensions::new()),
            ),
        }
    }

    fn with_extension(mut self, name: &str, value: &str) -> Self {
        self.details
            .extensions
            .insert(name.to_owned(), value.into());
        self
    }
}

/// A field that failed validation: 422 `invalid-request` with the field named.
pub fn invalid(field: &'static str, reason: &str) -> ApiProblem {
    ApiProblem::new(
        "invalid-request",
        StatusCode::UNPROCESSABLE_ENTITY,
        "The request is invalid",
        format!("{field} {reason}"),
    )
    .with_extension("field", field)
}

/// An unknown resource: 404 `not-found`.
pub fn not_found(what: &str) -> ApiProblem {
    ApiProblem::new(
        "not-found",
        StatusCode::NOT_FOUND,
        "Not found",
        format!("no such {what}"),
    )
}

impl IntoResponse for ApiProblem {
    fn into_response(self) -> Response {
        self.details.into_response()
    }
}

/// `axum::Json` whose rejections are problems: malformed JSON 400, wrong shape 422, wrong
/// content type 415, too large 413. Nothing runs and nothing is stored for them.
#[derive(Debug, Clone)]
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiProblem;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        match axum::Json::<T>::from_request(request, state).await {
            Ok(axum::Json(value)) => Ok(Self(value)),
            Err(rejection) => Err(body_problem(&rejection)),
        }
    }
}

fn body_problem(rejection: &JsonRejection) -> ApiProblem {
    let status = rejection.status();
    let (slug, title) = match status {
        StatusCode::PAYLOAD_TOO_LARGE => ("payload-too-large", "The request body is too large"),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => (
            "unsupported-media-type",
            "The request body must be application/json",
        ),
        StatusCode::UNPROCESSABLE_ENTITY => ("invalid-request", "The request is invalid"),
        _ => ("malformed-body", "The request body is not valid JSON"),
    };
    ApiProblem::new(slug, status, title, rejection.body_text())
}
