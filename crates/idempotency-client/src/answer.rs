//! Reading an answer: the [`Delivery`] of a returned one, whether a `400` or `422` refuses the
//! request itself ([`Error::Refused`]) or is its outcome, the `Retry-After` of a retried one.

use std::time::{Duration, SystemTime};

use reqwest::header::{CONTENT_TYPE, HeaderMap, RETRY_AFTER};
use reqwest::{Response, ResponseBuilderExt};

use crate::{Delivery, Error};

/// The most of a refused answer's body kept in [`Error::Refused`].
const REFUSED_BODY_LIMIT: usize = 64 * 1024;

/// `response` with its [`Delivery`].
pub(crate) fn delivered(
    mut response: Response,
    key: String,
    attempts: u32,
    replayed: bool,
) -> Response {
    response.extensions_mut().insert(Delivery {
        key,
        attempts,
        replayed,
    });
    response
}

/// The last segments of the problem `type`s that refuse the request itself, before anything
/// ran, in the server contract of `idempotency-axum`: a server stores none of them, so the
/// request must change (a reused key excepted, when this is a retry of the request the key
/// was used for: that request's body goes again with it). Every other `400` or `422` may
/// be the request's stored outcome (a business rejection), replayed to a retry: it is returned
/// as a response, first time and replay alike.
const REFUSING_TYPES: &[&str] = &[
    "idempotency-key-missing",
    "idempotency-key-invalid",
    "idempotency-key-reused",
    "invalid-request-body",
    "invalid-request-query",
    "invalid-request-path",
    "scope-invalid",
];

/// The problem `type`s of a `400` that says nothing of the request: the server could not read
/// its body to the end (the connection slowed or broke), so nothing ran and nothing was
/// stored. Sent again with the same key, like a connection failure.
const TRANSIENT_TYPES: &[&str] = &["body-unreadable"];

/// Whether `headers` say the body is a problem document (`application/problem+json`).
fn is_problem(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .is_some_and(|essence| {
            essence
                .trim()
                .eq_ignore_ascii_case("application/problem+json")
        })
}

/// The problem document `body`'s `type`, by its last path or URN segment without a query or
/// fragment: in [`REFUSING_TYPES`] or [`TRANSIENT_TYPES`], or neither.
fn slug_in(body: &[u8], types: &[&str]) -> bool {
    #[derive(serde::Deserialize)]
    struct Problem {
        #[serde(rename = "type")]
        kind: Option<String>,
    }
    serde_json::from_slice::<Problem>(body)
        .ok()
        .and_then(|problem| problem.kind)
        .is_some_and(|kind| {
            let path = kind.split(['?', '#']).next().unwrap_or_default();
            let slug = path
                .trim_end_matches('/')
                .rsplit(['/', ':'])
                .next()
                .unwrap_or_default();
            types.contains(&slug)
        })
}

/// Whether the problem document `body` refuses the request itself ([`REFUSING_TYPES`]).
fn refuses(body: &[u8]) -> bool {
    slug_in(body, REFUSING_TYPES)
}

/// What a `400` or `422` that is not a replay is.
pub(crate) enum Judged {
    /// The request's outcome, returned with its [`Delivery`] as its replay would be.
    Outcome(Response),
    /// A refusal of the request itself ([`REFUSING_TYPES`]).
    Refused(Error),
    /// A `400` that says nothing of the request ([`TRANSIENT_TYPES`]): to send again.
    Transient,
    /// The problem document could not be read to its end (the connection failed or timed out,
    /// or the body cannot be decoded): whether it refuses is unknown.
    Unread(reqwest::Error),
}

/// The most of a problem document read for its `type`: the contract's refusals are a few
/// hundred bytes, so a longer one is an outcome, handed back whole (the part read, then the
/// rest as it comes).
const PROBLEM_LIMIT: usize = 1024 * 1024;

/// Judges a `400` or `422` that is not a replay. A problem document is read (at most
/// [`PROBLEM_LIMIT`]) for its `type` and put back when it is no refusal; any other body is
/// left unread and returned as it comes.
pub(crate) async fn judged(mut response: Response, key: String, attempt: u32) -> Judged {
    if !is_problem(response.headers()) {
        return Judged::Outcome(delivered(response, key, attempt, false));
    }
    let status = response.status();
    let headers = response.headers().clone();
    let mut body = Vec::new();
    let mut whole = false;
    while body.len() <= PROBLEM_LIMIT {
        match response.chunk().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            Ok(None) => {
                whole = true;
                break;
            }
            Err(error) => return Judged::Unread(error),
        }
    }
    if whole && slug_in(&body, TRANSIENT_TYPES) {
        return Judged::Transient;
    }
    if whole && refuses(&body) {
        body.truncate(REFUSED_BODY_LIMIT);
        return Judged::Refused(Error::Refused {
            key,
            status,
            attempt,
            headers,
            body,
        });
    }
    let version = response.version();
    let url = response.url().clone();
    let extensions = std::mem::take(response.extensions_mut());
    let (mut parts, ()) = http::Response::builder()
        .url(url)
        .body(())
        .unwrap_or_default()
        .into_parts();
    parts.status = status;
    parts.version = version;
    parts.headers = headers;
    parts.extensions.extend(extensions);
    let body = if whole {
        reqwest::Body::from(body)
    } else {
        let read =
            futures_util::stream::once(
                async move { Ok::<_, reqwest::Error>(bytes::Bytes::from(body)) },
            );
        reqwest::Body::wrap_stream(futures_util::StreamExt::chain(
            read,
            response.bytes_stream(),
        ))
    };
    let rebuilt = Response::from(http::Response::from_parts(parts, body));
    Judged::Outcome(delivered(rebuilt, key, attempt, false))
}

/// `Retry-After` as delta-seconds (beyond `u64` seconds: [`Duration::MAX`], longer than any
/// bound) or an HTTP date.
pub(crate) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let text = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return Some(
            text.parse::<u64>()
                .map_or(Duration::MAX, Duration::from_secs),
        );
    }
    let at = httpdate::parse_http_date(text).ok()?;
    Some(
        at.duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO),
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    #[test]
    fn refusing_types_are_known_by_their_last_segment() {
        let body = |kind: &str| format!(r#"{{"type": "{kind}", "status": 422}}"#).into_bytes();
        for refusing in [
            "https://idempotency-rs.github.io/problems/idempotency-key-reused",
            "https://api.example.com/problems/invalid-request-body/",
            "https://api.example.com/problems/idempotency-key-missing?lang=en",
            "https://api.example.com/problems/scope-invalid#why",
            "urn:problem:invalid-request-path",
        ] {
            assert!(refuses(&body(refusing)), "{refusing}");
        }
        for outcome in [
            "https://idempotency-rs.github.io/problems/request-rejected",
            "https://api.example.com/problems/insufficient-funds",
            "about:blank",
        ] {
            assert!(!refuses(&body(outcome)), "{outcome}");
        }
        assert!(!refuses(b"not json"));
        assert!(!refuses(br#"{"title": "no type"}"#));
    }

    #[test]
    fn retry_after_reads_seconds_and_dates() {
        let mut headers = HeaderMap::new();
        assert_eq!(retry_after(&headers), None);
        headers.insert(RETRY_AFTER, HeaderValue::from_static("3"));
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(3)));
        let later = SystemTime::now() + Duration::from_secs(20);
        headers.insert(
            RETRY_AFTER,
            HeaderValue::from_str(&httpdate::fmt_http_date(later)).unwrap(),
        );
        let wait = retry_after(&headers).unwrap();
        assert!((18..=20).contains(&wait.as_secs()), "{wait:?}");
        headers.insert(
            RETRY_AFTER,
            HeaderValue::from_static("Mon, 01 Jan 2001 00:00:00 GMT"),
        );
        assert_eq!(retry_after(&headers), Some(Duration::ZERO));
        headers.insert(RETRY_AFTER, HeaderValue::from_static("soon"));
        assert_eq!(retry_after(&headers), None);
        headers.insert(RETRY_AFTER, HeaderValue::from_static("-5"));
        assert_eq!(retry_after(&headers), None);
        // More seconds than a u64 holds: longer than any bound, not "no Retry-After".
        headers.insert(
            RETRY_AFTER,
            HeaderValue::from_static("99999999999999999999"),
        );
        assert_eq!(retry_after(&headers), Some(Duration::MAX));
    }
}
