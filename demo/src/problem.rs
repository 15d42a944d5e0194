//! The demo's own problem responses (RFC 9457), next to the ones `idempotency-axum` answers
//! (among them the body rejections of its `ProblemJson` extractor): invalid fields, unknown
//! resources.

use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use idempotency_axum::problem_details::ProblemDetails;
use idempotency_axum::{PROBLEM_TYPE_BASE, ProblemExtensions};

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

/// A method the route does not serve: 405 `method-not-allowed` (the `Allow` header names the
/// ones it does).
pub fn method_not_allowed() -> ApiProblem {
    ApiProblem::new(
        "method-not-allowed",
        StatusCode::METHOD_NOT_ALLOWED,
        "Method not allowed",
        "this route does not serve the method; its Allow header names the ones it does",
    )
}

impl IntoResponse for ApiProblem {
    fn into_response(self) -> Response {
        self.details.into_response()
    }
}
