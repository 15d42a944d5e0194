//! [`ProblemQuery`]: a query string whose rejections are problem responses.

use axum::extract::{FromRequestParts, Query};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use crate::problem::{Problem, ProblemKind};

/// A query string, extracted by [`axum::extract::Query`], whose rejection is an
/// `application/problem+json` answer instead of axum's plain-text one: `400
/// invalid-request-query`, with serde's description of what is wrong in `detail` (an unknown
/// parameter the type refuses, a parameter given twice, a value of the wrong type).
///
/// Like the refusals of [`ProblemJson`](crate::ProblemJson), this one is made before the
/// handler executes: [`IdempotencyLayer`](crate::IdempotencyLayer) stores nothing under the
/// key, so the corrected retry runs. (axum's own `Query` rejection is a plain 400 the layer
/// cannot tell from the handler's, so it is stored like any 4xx the handler returns.)
///
/// ```
/// use axum::body::Body;
/// use axum::http::Request;
/// use axum::{Router, routing::post};
/// use idempotency_axum::ProblemQuery;
/// use tower::ServiceExt;
///
/// #[derive(serde::Deserialize)]
/// #[serde(deny_unknown_fields)]
/// struct Note { note: Option<String> }
///
/// async fn deposit(ProblemQuery(query): ProblemQuery<Note>) -> String {
///     query.note.unwrap_or_default()
/// }
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let app: Router = Router::new().route("/deposits", post(deposit));
/// let request = Request::post("/deposits?memo=rent").body(Body::empty()).unwrap();
/// let response = app.oneshot(request).await.unwrap();
/// assert_eq!(response.status(), 400);
/// assert_eq!(response.headers()["content-type"], "application/problem+json");
/// # });
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct ProblemQuery<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ProblemQuery<T> {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match Query::<T>::from_request_parts(parts, state).await {
            Ok(Query(value)) => Ok(Self(value)),
            Err(rejection) => {
                Err(Problem::new(ProblemKind::InvalidRequestQuery)
                    .with_detail(rejection.body_text()))
            }
        }
    }
}
