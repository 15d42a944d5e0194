//! The admin router's errors: RFC 9457 problem documents (`application/problem+json`).

use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::ops::OpsError;

/// One failed admin request: its status, a stable type slug, a title and what to do.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Problem {
    #[serde(rename = "type")]
    pub(crate) kind: String,
    pub(crate) title: &'static str,
    pub(crate) status: u16,
    pub(crate) detail: String,
    /// The setting that enables what was refused (`admin-mutations-disabled`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) setting: Option<String>,
}

impl Problem {
    pub(crate) fn new(
        status: StatusCode,
        slug: &str,
        title: &'static str,
        detail: impl Into<String>,
    ) -> Self {
        Self {
            kind: format!("{}{slug}", idempotency_axum::PROBLEM_TYPE_BASE),
            title,
            status: status.as_u16(),
            detail: detail.into(),
            setting: None,
        }
    }

    /// 400: the request names something malformed.
    pub(crate) fn bad_request(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "admin-bad-request",
            "Bad request",
            detail,
        )
    }

    /// 404: what the request names does not exist.
    pub(crate) fn not_found(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "admin-not-found",
            "Not found",
            detail,
        )
    }

    /// 403: mutations are off; names the setting that turns them on.
    pub(crate) fn mutations_disabled(setting: &str) -> Self {
        let mut problem = Self::new(
            StatusCode::FORBIDDEN,
            "admin-mutations-disabled",
            "Mutations are disabled",
            format!(
                "this admin router only reads: changes (evict, requeue, discard, purge, \
                 partitions, cleanup) are enabled by `{setting}`; nothing changed"
            ),
        );
        problem.setting = Some(setting.to_owned());
        problem
    }

    /// 403: a change asked by another site (a form or script on a page of another origin).
    pub(crate) fn cross_site() -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "admin-cross-site",
            "Cross-site request refused",
            "a change must come from the admin page's own origin (Sec-Fetch-Site says \
             otherwise); nothing changed",
        )
    }

    pub(crate) fn status(&self) -> StatusCode {
        StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }
}

impl From<OpsError> for Problem {
    fn from(error: OpsError) -> Self {
        match error {
            OpsError::NoOutbox => Self::not_found(error.to_string()),
            OpsError::Unsupported { .. } => Self::new(
                StatusCode::BAD_REQUEST,
                "admin-unsupported",
                "Not supported here",
                error.to_string(),
            ),
            OpsError::Outbox(idempotency_outbox::Error::RequeueOutOfOrder { ref ids }) => {
                let ids: Vec<String> = ids.iter().map(ToString::to_string).collect();
                Self::new(
                    StatusCode::CONFLICT,
                    "admin-requeue-out-of-order",
                    "Requeue refused",
                    format!(
                        "the aggregates of these dead letters already published a later event, \
                         so they would be published out of order: {}",
                        ids.join(", ")
                    ),
                )
            }
            other => {
                tracing::warn!(error = %other, "admin request failed");
                Self::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "admin-operation-failed",
                    "Operation failed",
                    other.to_string(),
                )
            }
        }
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status = self.status();
        match serde_json::to_vec(&self) {
            Ok(body) => (
                status,
                [
                    (header::CONTENT_TYPE, idempotency_axum::PROBLEM_JSON),
                    (header::CACHE_CONTROL, "no-store"),
                ],
                body,
            )
                .into_response(),
            Err(_) => status.into_response(),
        }
    }
}

/// Refuses a change that another site's page sent: a browser's `Sec-Fetch-Site` of
/// `cross-site` or `same-site` (a sibling subdomain). Requests without it (command-line
/// clients, scripts) and the page's own forms (`same-origin`) pass: the host's authentication
/// decides about them. `Origin` is not compared with `Host`: a reverse proxy may rewrite the
/// latter.
pub(crate) fn same_origin(headers: &HeaderMap) -> Result<(), Problem> {
    match headers.get("sec-fetch-site").map(|v| v.as_bytes()) {
        Some(b"cross-site" | b"same-site") => Err(Problem::cross_site()),
        _ => Ok(()),
    }
}
