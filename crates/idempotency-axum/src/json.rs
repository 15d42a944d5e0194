//! [`ProblemJson`]: a JSON request body whose rejections are problem responses.

use axum::body::{Body, Bytes};
use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Request};
use axum::http::{HeaderMap, StatusCode, header};
use idempotency_core::{JsonTooDeep, MAX_JSON_DEPTH, check_json_depth};
use serde::de::DeserializeOwned;

use crate::problem::{Problem, ProblemKind};

/// A JSON request body, extracted by [`axum::Json`], whose rejections are
/// `application/problem+json` answers instead of axum's plain-text ones:
///
/// | the body | status | `type` slug |
/// |---|---|---|
/// | not JSON (a syntax error, or cut short) | 400 | `invalid-request-body` |
/// | JSON that does not match `T` (a missing field, a wrong type, an unknown field `T` refuses) | 422 | `invalid-request-body` |
/// | JSON nested deeper than [`MAX_JSON_DEPTH`] (31) levels | 422 | `invalid-request-body`, `reason: too-deep` |
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
        let (parts, body) = request.into_parts();
        let request = if declares_json(&parts.headers) {
            // Read once (within axum's body limit), checked for depth before parsing.
            let bytes = Bytes::from_request(Request::from_parts(parts.clone(), body), state)
                .await
                .map_err(|rejection| json_rejection_problem(&JsonRejection::from(rejection)))?;
            check_json_depth(&bytes).map_err(too_deep_problem)?;
            Request::from_parts(parts, Body::from(bytes))
        } else {
            Request::from_parts(parts, body)
        };
        match axum::Json::<T>::from_request(request, state).await {
            Ok(axum::Json(value)) => Ok(Self(value)),
            Err(rejection) => Err(json_rejection_problem(&rejection)),
        }
    }
}

/// The answer to a request body nested deeper than [`MAX_JSON_DEPTH`]: `422
/// invalid-request-body` with `reason: too-deep` and `maxDepth`. Such a body could not be
/// stored on every backend (an outcome or event built from it would fail after the handler
/// ran), so it is refused before.
pub(crate) fn too_deep_problem(too_deep: JsonTooDeep) -> Problem {
    Problem::new(ProblemKind::InvalidRequestBody)
        .with_status(StatusCode::UNPROCESSABLE_ENTITY)
        .with_detail(format!(
            "The JSON request body nests {} levels deep; at most {MAX_JSON_DEPTH} are accepted.",
            too_deep.depth
        ))
        .with_extension("reason", "too-deep")
        .with_extension("maxDepth", MAX_JSON_DEPTH)
}

/// Whether the request declares a JSON body: `application/json` or `application/*+json`, as
/// `axum::Json` accepts it.
pub(crate) fn declares_json(headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(header::CONTENT_TYPE) else {
        return false;
    };
    let Ok(value) = value.to_str() else {
        return false;
    };
    let essence = value
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
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
