//! The concrete target of a request, in a canonical spelling for its fingerprint: the path and
//! the query as the handler's extractors decode them, and the host.

use axum::extract::OriginalUri;
use axum::http::{header, request::Parts};
use percent_encoding::{AsciiSet, CONTROLS, NON_ALPHANUMERIC, percent_decode, percent_encode};

/// Every byte but the unreserved characters of RFC 3986 is percent-encoded: two spellings of
/// the same decoded bytes get one canonical form, and two different ones never do.
const COMPONENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Control characters, space, `%` and every non-ASCII byte are percent-encoded.
const HOST: &AsciiSet = &CONTROLS.add(b' ').add(b'%');

/// The request's URI before any `Router::nest` stripped a prefix from it.
fn uri(parts: &Parts) -> &axum::http::Uri {
    parts
        .extensions
        .get::<OriginalUri>()
        .map_or(&parts.uri, |original| &original.0)
}

fn canonical(raw: &[u8]) -> String {
    let decoded: Vec<u8> = percent_decode(raw).collect();
    percent_encode(&decoded, COMPONENT).to_string()
}

/// The path, each segment percent-decoded (as `Path` decodes it) and encoded again.
pub(super) fn path(parts: &Parts) -> String {
    uri(parts)
        .path()
        .split('/')
        .map(|segment| canonical(segment.as_bytes()))
        .collect::<Vec<_>>()
        .join("/")
}

/// The query as `name=value` pairs decoded as a form (`+` is a space) and encoded again,
/// ordered by name (the values of one name keep their order); `None` without any pair.
pub(super) fn query(parts: &Parts) -> Option<String> {
    let query = uri(parts).query()?;
    let mut pairs: Vec<(String, String)> = query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let form = |s: &str| canonical(s.replace('+', " ").as_bytes());
            (form(name), form(value))
        })
        .collect();
    if pairs.is_empty() {
        return None;
    }
    pairs.sort_by(|a, b| a.0.cmp(&b.0));
    let pairs: Vec<String> = pairs
        .into_iter()
        .map(|(name, value)| format!("{name}={value}"))
        .collect();
    Some(pairs.join("&"))
}

/// The host the request was sent to (the URI's authority, else the `Host` header), in lower
/// case; empty when the request names none.
pub(super) fn host(parts: &Parts) -> String {
    let host = match uri(parts).authority() {
        Some(authority) => authority.as_str().as_bytes().to_ascii_lowercase(),
        None => parts
            .headers
            .get(header::HOST)
            .map(|value| value.as_bytes().to_ascii_lowercase())
            .unwrap_or_default(),
    };
    percent_encode(&host, HOST).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::Request;

    fn parts(uri: &str) -> Parts {
        Request::builder()
            .uri(uri)
            .body(())
            .unwrap_or_default()
            .into_parts()
            .0
    }

    #[test]
    fn spellings_of_one_target_are_one_and_different_targets_are_not() {
        assert_eq!(path(&parts("/accounts/%41/x")), "/accounts/A/x");
        assert_eq!(path(&parts("/a%2Fb")), "/a%2Fb");
        assert_ne!(path(&parts("/a%2Fb")), path(&parts("/a/b")));
        assert_eq!(path(&parts("/my-route_1.x~")), "/my-route_1.x~");
        assert_eq!(query(&parts("/p")), None);
        assert_eq!(query(&parts("/p?")), None);
        assert_eq!(query(&parts("/p?&&")), None);
        assert_eq!(
            query(&parts("/p?to=bob&a=1+2&to=al%69ce")),
            query(&parts("/p?a=1%202&to=bob&to=alice"))
        );
        assert_ne!(
            query(&parts("/p?to=alice&to=bob")),
            query(&parts("/p?to=bob&to=alice"))
        );
        assert_ne!(query(&parts("/p?a=%2B")), query(&parts("/p?a=+")));
        assert_eq!(query(&parts("/p?flag")), query(&parts("/p?flag=")));
        assert_ne!(query(&parts("/p?a=%FC")), query(&parts("/p?a=%E4")));
        assert_eq!(
            host(&parts("http://API.example.com:8080/p")),
            "api.example.com:8080"
        );
        assert_eq!(host(&parts("/p")), "");
    }
}
