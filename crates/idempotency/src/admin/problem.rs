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
            "a change must come from the admin page's own origin (Sec-Fetch-Site or Origin \
             says otherwise); nothing changed",
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
            OpsError::ShuttingDown { .. } => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "admin-shutting-down",
                "Service shutting down",
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
            OpsError::Cache { evicted: true, .. } => Self::new(
                StatusCode::BAD_GATEWAY,
                "admin-cache-entry-left",
                "Record evicted, cache entry left",
                error.to_string(),
            ),
            OpsError::Cache { evicted: false, .. } => Self::new(
                StatusCode::BAD_GATEWAY,
                "admin-cache-entry-unknown",
                "No record, cache entry unknown",
                error.to_string(),
            ),
            OpsError::Unconfirmed { .. } => {
                tracing::warn!(error = %error, "admin change unconfirmed");
                Self::new(
                    StatusCode::BAD_GATEWAY,
                    "admin-change-unconfirmed",
                    "Change unconfirmed",
                    error.to_string(),
                )
            }
            OpsError::Partial { done, source } => {
                let unconfirmed = matches!(*source, OpsError::Unconfirmed { .. });
                let mut problem = Self::from(*source);
                problem.kind = format!(
                    "{}admin-partially-applied",
                    idempotency_axum::PROBLEM_TYPE_BASE
                );
                problem.title = "Partly done";
                problem.detail = format!(
                    "{done} row(s) were changed before a later batch failed; {}: {}",
                    if unconfirmed {
                        "that batch may or may not have been, the rest were not"
                    } else {
                        "that batch and the rest were not"
                    },
                    problem.detail
                );
                problem
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

/// Refuses a change that another site's page sent, as browsers tell it:
///
/// 1. `Sec-Fetch-Site` (every current browser, on HTTPS and localhost pages): `same-origin`
///    and `none` (typed by the user) pass, anything else (`cross-site`, `same-site`: a
///    sibling subdomain) is refused.
/// 2. Without it (a page on plain HTTP, an older browser), `Origin`: the request's own
///    (`scheme://` + its `Host`, or the URI's authority on HTTP/2) or one of `trusted` (the
///    public origin when a reverse proxy rewrites `Host`) passes; any other, `null` (an
///    opaque origin) included, is refused.
/// 3. Without either (command-line clients, scripts): passes; the host's authentication
///    decides about them.
pub(crate) fn same_origin(
    headers: &HeaderMap,
    authority: Option<&str>,
    trusted: &[String],
) -> Result<(), Problem> {
    match headers.get("sec-fetch-site").map(|v| v.as_bytes()) {
        Some(b"same-origin" | b"none") => return Ok(()),
        Some(_) => return Err(Problem::cross_site()),
        None => {}
    }
    let Some(origin) = headers.get(header::ORIGIN) else {
        return Ok(());
    };
    let origin = origin.to_str().map_err(|_| Problem::cross_site())?;
    let origin_of = origin_parts(origin);
    if origin_of.is_some() && trusted.iter().any(|t| origin_parts(t) == origin_of) {
        return Ok(());
    }
    let own = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or(authority);
    match own {
        Some(own) if is_own(origin, own) => Ok(()),
        _ => Err(Problem::cross_site()),
    }
}

/// Whether `origin` (`scheme://host[:port]`) names the server that `own` (a `Host`,
/// `host[:port]`) does: the same host, and the same port once a port left out is read as the
/// origin's scheme's default (`http`: 80, `https`: 443). The request's own scheme is not
/// known here (TLS may end in a proxy): an origin whose port is its scheme's default passes a
/// `Host` without a port, whichever scheme the listener serves.
fn is_own(origin: &str, own: &str) -> bool {
    let (Some((scheme, host, port)), Ok(own)) = (
        origin_parts(origin),
        own.parse::<axum::http::uri::Authority>(),
    ) else {
        return false;
    };
    host.eq_ignore_ascii_case(own.host())
        && own
            .port_u16()
            .map_or(Some(port) == default_port(&scheme), |own| own == port)
}

/// An origin's scheme and host (lowercase) and its port (its scheme's default when left
/// out); `None` for what is not an origin (a path, user information, no port for an unknown
/// scheme).
fn origin_parts(origin: &str) -> Option<(String, String, u16)> {
    let (scheme, authority) = origin.split_once("://")?;
    if authority.contains(['/', '@', '?', '#']) {
        return None;
    }
    let authority = authority.parse::<axum::http::uri::Authority>().ok()?;
    let scheme = scheme.to_ascii_lowercase();
    let port = authority.port_u16().or(default_port(&scheme))?;
    Some((scheme, authority.host().to_ascii_lowercase(), port))
}

fn default_port(scheme: &str) -> Option<u16> {
    match scheme {
        "http" => Some(80),
        "https" => Some(443),
        _ => None,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn check(pairs: &[(&'static str, &'static str)], trusted: &[&str]) -> bool {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.insert(*name, value.parse().unwrap());
        }
        let trusted: Vec<String> = trusted.iter().map(|t| (*t).to_owned()).collect();
        same_origin(&headers, Some("uri-authority:1"), &trusted).is_ok()
    }

    #[test]
    fn a_change_that_may_have_been_applied_says_so() {
        let lost = || -> idempotency_core::BoxError {
            Box::new(std::io::Error::from(std::io::ErrorKind::UnexpectedEof))
        };
        let unconfirmed =
            OpsError::from(idempotency_core::StoreError::Unavailable(lost())).of_change();
        let problem = Problem::from(unconfirmed);
        assert_eq!(problem.status, 502);
        assert!(
            problem.kind.ends_with("admin-change-unconfirmed"),
            "{}",
            problem.kind
        );
        assert!(
            problem.detail.contains("may or may not"),
            "{}",
            problem.detail
        );
        let partial = OpsError::from(idempotency_outbox::Error::Unavailable(lost()))
            .of_change()
            .after(500);
        let problem = Problem::from(partial);
        assert!(
            problem.kind.ends_with("admin-partially-applied"),
            "{}",
            problem.kind
        );
        assert!(
            problem
                .detail
                .contains("500 row(s) were changed before a later batch failed; that batch may"),
            "{}",
            problem.detail
        );
        let refused = OpsError::from(idempotency_outbox::Error::Database(lost())).after(500);
        let problem = Problem::from(refused);
        assert!(
            problem.detail.contains("that batch and the rest were not"),
            "{}",
            problem.detail
        );
    }

    #[test]
    fn sec_fetch_site_decides_when_present() {
        assert!(check(&[("sec-fetch-site", "same-origin")], &[]));
        assert!(check(&[("sec-fetch-site", "none")], &[]));
        for site in ["cross-site", "same-site", "something-new"] {
            let pairs = [
                ("sec-fetch-site", site),
                ("host", "ops"),
                ("origin", "http://ops"),
            ];
            assert!(!check(&pairs, &[]), "{site}");
        }
    }

    #[test]
    fn without_it_the_origin_must_be_the_requests_own_or_trusted() {
        assert!(
            check(&[], &[]),
            "no browser: the host's authentication decides"
        );
        assert!(check(
            &[("host", "ops:9000"), ("origin", "http://Ops:9000")],
            &[]
        ));
        assert!(
            check(&[("origin", "https://uri-authority:1")], &[]),
            "HTTP/2"
        );
        for origin in [
            "http://evil",
            "null",
            "http://ops:9001",
            "http://ops.evil",
            "ops",
        ] {
            assert!(
                !check(&[("host", "ops"), ("origin", origin)], &[]),
                "{origin}"
            );
        }
        // A port left out is the scheme's default; the request's own scheme is not known.
        assert!(check(&[("host", "ops:80"), ("origin", "http://ops")], &[]));
        assert!(check(
            &[("host", "ops:443"), ("origin", "https://ops")],
            &[]
        ));
        assert!(check(&[("host", "ops"), ("origin", "http://ops:80")], &[]));
        assert!(check(
            &[("host", "[::1]:8080"), ("origin", "http://[::1]:8080")],
            &[]
        ));
        for (host, origin) in [
            ("ops:443", "http://ops"),
            ("ops:80", "https://ops"),
            ("ops", "http://ops:8080"),
            ("ops:8080", "http://ops"),
            ("ops", "ftp://ops"),
            ("ops", "http://ops/path"),
            ("ops", "http://user@ops"),
        ] {
            assert!(
                !check(&[("host", host), ("origin", origin)], &[]),
                "{host} {origin}"
            );
        }
        let behind_a_proxy = [
            ("host", "127.0.0.1:9000"),
            ("origin", "https://ops.example"),
        ];
        assert!(!check(&behind_a_proxy, &[]));
        assert!(check(&behind_a_proxy, &["https://ops.example"]));
        assert!(
            check(&behind_a_proxy, &["HTTPS://OPS.example:443"]),
            "a trusted origin is compared as an origin"
        );
        assert!(
            !check(&behind_a_proxy, &["http://ops.example"]),
            "another scheme"
        );
    }
}
