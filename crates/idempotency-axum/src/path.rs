//! [`ProblemPath`]: path parameters whose rejections are problem responses.

use axum::extract::{FromRequestParts, Path};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use crate::problem::{Problem, ProblemKind};

/// Path parameters, extracted by [`axum::extract::Path`], whose rejection is an
/// `application/problem+json` answer instead of axum's plain-text one: `400
/// invalid-request-path`, with axum's description of what is wrong in `detail` (a segment
/// that is not UTF-8 once percent-decoded, such as `%FF`; a value that does not parse as the
/// parameter's type).
///
/// Like the refusals of [`ProblemJson`](crate::ProblemJson) and
/// [`ProblemQuery`](crate::ProblemQuery), this one is made before the handler executes:
/// [`IdempotencyLayer`](crate::IdempotencyLayer) stores nothing under the key, so the retry to
/// the corrected path runs (axum's own `Path` rejection is a plain 400 the layer cannot tell
/// from the handler's, so it is stored, and the corrected retry is `422
/// idempotency-key-reused`). A route whose parameters cannot make `T` at all (a mistake of the
/// application, not of the request) is a `500 internal-error`, logged at `error`.
///
/// ```
/// use axum::body::Body;
/// use axum::http::Request;
/// use axum::{Router, routing::post};
/// use idempotency_axum::ProblemPath;
/// use tower::ServiceExt;
///
/// async fn deposit(ProblemPath(account): ProblemPath<u32>) -> String {
///     account.to_string()
/// }
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let app: Router = Router::new().route("/accounts/{account}/deposits", post(deposit));
/// let request = Request::post("/accounts/alice/deposits").body(Body::empty()).unwrap();
/// let response = app.oneshot(request).await.unwrap();
/// assert_eq!(response.status(), 400);
/// assert_eq!(response.headers()["content-type"], "application/problem+json");
/// # });
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct ProblemPath<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for ProblemPath<T> {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(value)) => Ok(Self(value)),
            Err(rejection) if rejection.status().is_client_error() => {
                Err(Problem::new(ProblemKind::InvalidRequestPath)
                    .with_detail(rejection.body_text()))
            }
            Err(rejection) => {
                tracing::error!(
                    error = %rejection.body_text(),
                    "the route's path parameters cannot be extracted as the handler's type"
                );
                Err(Problem::internal())
            }
        }
    }
}
