//! [`ProblemPath`]: path parameters whose rejections are problem responses.

use axum::extract::path::ErrorKind;
use axum::extract::rejection::PathRejection;
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
/// idempotency-key-reused`). A route whose parameters cannot make `T` whatever the request
/// (a mistake of the application: a field `T` names that the route does not capture, a
/// parameter the route captures that a `deny_unknown_fields` `T` does not name, a wrong
/// number of parameters, a type a path cannot hold) is a `500 internal-error`, logged at
/// `error`.
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
            Err(rejection) if rejection.status().is_client_error() && !routes_fault(&rejection) => {
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

/// Whether axum's 400 is the route's fault, not the request's: serde's "missing field" (a
/// field of `T` the route does not capture) or "unknown field" (a parameter the route
/// captures that a `deny_unknown_fields` `T` does not name), which every request to the route
/// meets. (A `Deserialize` of your own whose error message starts so is taken for one.)
fn routes_fault(rejection: &PathRejection) -> bool {
    match rejection {
        PathRejection::FailedToDeserializePathParams(failed) => matches!(
            failed.kind(),
            ErrorKind::Message(message)
                if message.starts_with("missing field") || message.starts_with("unknown field")
        ),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use axum::routing::get;
    use axum::{Router, response::IntoResponse};
    use tower::ServiceExt;

    use super::ProblemPath;

    #[derive(serde::Deserialize)]
    struct Account {
        account: String,
    }

    async fn named(ProblemPath(path): ProblemPath<Account>) -> impl IntoResponse {
        path.account
    }

    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Strict {
        account: String,
    }

    async fn strict(ProblemPath(path): ProblemPath<Strict>) -> impl IntoResponse {
        path.account
    }

    async fn status(app: Router, uri: &str) -> StatusCode {
        let request = Request::get(uri).body(Body::empty()).unwrap_or_default();
        match app.oneshot(request).await {
            Ok(response) => response.status(),
            Err(never) => match never {},
        }
    }

    #[tokio::test]
    async fn a_field_the_route_does_not_capture_or_name_is_the_applications_fault() {
        let wrong = Router::new().route("/accounts/{account_id}", get(named));
        assert_eq!(
            status(wrong, "/accounts/A").await,
            StatusCode::INTERNAL_SERVER_ERROR
        );
        let right = Router::new().route("/accounts/{account}", get(named));
        assert_eq!(status(right.clone(), "/accounts/A").await, StatusCode::OK);
        assert_eq!(
            status(right, "/accounts/%FF").await,
            StatusCode::BAD_REQUEST
        );
        // A parameter the route captures that a strict type does not name.
        let extra = Router::new().route("/tenants/{tenant}/accounts/{account}", get(strict));
        assert_eq!(
            status(extra, "/tenants/t/accounts/A").await,
            StatusCode::INTERNAL_SERVER_ERROR
        );
    }
}
