//! Reading an answer: the [`Delivery`] of a returned one, the [`Error::Refused`] of a `400` or
//! `422`, the `Retry-After` of a retried one.

use std::time::{Duration, SystemTime};

use reqwest::Response;
use reqwest::header::{HeaderMap, RETRY_AFTER};

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

/// A `400` or `422` as an error, with the start of its body.
pub(crate) async fn refused(
    mut response: Response,
    key: String,
    attempt: u32,
) -> reqwest_middleware::Error {
    let status = response.status();
    let headers = response.headers().clone();
    let mut body = Vec::new();
    while body.len() < REFUSED_BODY_LIMIT {
        match response.chunk().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            Ok(None) | Err(_) => break,
        }
    }
    body.truncate(REFUSED_BODY_LIMIT);
    reqwest_middleware::Error::middleware(Error::Refused {
        key,
        status,
        attempt,
        headers,
        body,
    })
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
