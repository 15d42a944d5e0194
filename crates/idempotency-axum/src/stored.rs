//! [`StoredResponse`]: a whole HTTP response as the stored value of `execute`, with a header
//! allow-list that never stores credentials.

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde::{Deserialize, Serialize};

use crate::error::Error;

/// Header names, or parts of names, that are never stored, even when allowed explicitly.
const SENSITIVE_PARTS: &[&str] = &[
    "auth", // authorization, proxy-authorization, www-authenticate, x-auth-token
    "cookie",
    "token",
    "secret",
    "key", // x-api-key, api-key, idempotency-key
    "password",
    "passwd",
    "credential",
    "session",
    "signature",
    "jwt",
    "csrf",
    "xsrf",
];

/// Headers stored by [`HeaderFilter::default`]: they describe the representation and are
/// safe to show any client holding the key.
pub const DEFAULT_STORED_HEADERS: &[&str] = &[
    "content-type",
    "content-encoding",
    "content-language",
    "content-disposition",
    "content-location",
    "location",
    "etag",
    "last-modified",
    "link",
];

/// Whether a header name is treated as a credential and never stored: `Authorization`,
/// `Proxy-Authorization`, `Cookie`, `Set-Cookie`, and any name containing `auth`, `cookie`,
/// `token`, `secret`, `key`, `password`, `passwd`, `credential`, `session`, `signature`,
/// `jwt`, `csrf` or `xsrf`.
pub fn is_sensitive(name: &HeaderName) -> bool {
    let name = name.as_str();
    SENSITIVE_PARTS.iter().any(|part| name.contains(part))
}

/// An allow-list of the response headers a [`StoredResponse`] keeps. Headers not on it are
/// dropped; sensitive ones ([`is_sensitive`]) can never be put on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderFilter {
    allowed: Vec<HeaderName>,
}

impl Default for HeaderFilter {
    /// [`DEFAULT_STORED_HEADERS`].
    fn default() -> Self {
        Self {
            allowed: DEFAULT_STORED_HEADERS
                .iter()
                .map(|name| HeaderName::from_static(name))
                .collect(),
        }
    }
}

/// A header name that [`HeaderFilter::allow`] refused because it may carry a credential.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("header {0} may carry a credential and is never stored")]
pub struct SensitiveHeader(pub HeaderName);

impl HeaderFilter {
    /// A filter that stores no header at all.
    pub fn none() -> Self {
        Self {
            allowed: Vec::new(),
        }
    }

    /// Also stores `name`; refused for a sensitive name.
    pub fn allow(mut self, name: HeaderName) -> Result<Self, SensitiveHeader> {
        if is_sensitive(&name) {
            return Err(SensitiveHeader(name));
        }
        if !self.allowed.contains(&name) {
            self.allowed.push(name);
        }
        Ok(self)
    }

    /// Whether `name` is stored.
    pub fn allows(&self, name: &HeaderName) -> bool {
        self.allowed.contains(name) && !is_sensitive(name)
    }

    fn filter(&self, headers: &HeaderMap) -> Vec<(HeaderName, HeaderValue)> {
        headers
            .iter()
            .filter(|(name, _)| self.allows(name))
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect()
    }
}

/// A whole HTTP response (status, allowed headers, body), to use as the `T` of `execute` when
/// an application stores responses rather than values. Serialized as JSON: the body as text
/// when it is UTF-8, base64 otherwise.
///
/// ```
/// use axum::http::{HeaderMap, StatusCode, header};
/// use idempotency_axum::{HeaderFilter, StoredResponse};
///
/// let mut headers = HeaderMap::new();
/// headers.insert(header::CONTENT_TYPE, "text/plain".parse()?);
/// headers.insert(header::SET_COOKIE, "session=abc".parse()?);
/// let stored = StoredResponse::from_parts(StatusCode::CREATED, &headers, "done", &HeaderFilter::default());
/// assert_eq!(stored.headers().len(), 1); // Set-Cookie was dropped
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(into = "Repr", try_from = "Repr")]
pub struct StoredResponse {
    status: StatusCode,
    headers: Vec<(HeaderName, HeaderValue)>,
    body: Bytes,
}

impl StoredResponse {
    /// A response from its parts, keeping the headers `filter` allows.
    pub fn from_parts(
        status: StatusCode,
        headers: &HeaderMap,
        body: impl Into<Bytes>,
        filter: &HeaderFilter,
    ) -> Self {
        Self {
            status,
            headers: filter.filter(headers),
            body: body.into(),
        }
    }

    /// A JSON response: `value` serialized, `Content-Type: application/json`.
    pub fn json<T: Serialize + ?Sized>(status: StatusCode, value: &T) -> Result<Self, Error> {
        let body = serde_json::to_vec(value).map_err(Error::internal)?;
        Ok(Self {
            status,
            headers: vec![(
                axum::http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            body: body.into(),
        })
    }

    /// Buffers `response` (at most `max_body` bytes) and keeps the headers `filter` allows.
    /// A larger or failing body is an [`Error::Internal`].
    pub async fn capture(
        response: Response,
        filter: &HeaderFilter,
        max_body: usize,
    ) -> Result<Self, Error> {
        let (parts, body) = response.into_parts();
        let body = axum::body::to_bytes(body, max_body)
            .await
            .map_err(Error::internal)?;
        Ok(Self::from_parts(parts.status, &parts.headers, body, filter))
    }

    /// The status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The stored headers.
    pub fn headers(&self) -> &[(HeaderName, HeaderValue)] {
        &self.headers
    }

    /// The body.
    pub fn body(&self) -> &Bytes {
        &self.body
    }

    /// Keeps only the headers `filter` allows (the layer applies its allow-list again on
    /// every replay).
    pub(crate) fn retain_headers(mut self, filter: &HeaderFilter) -> Self {
        self.headers.retain(|(name, _)| filter.allows(name));
        self
    }
}

impl IntoResponse for StoredResponse {
    fn into_response(self) -> Response {
        let mut response = Response::new(Body::from(self.body));
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        for (name, value) in self.headers {
            headers.append(name, value);
        }
        response
    }
}

/// The stored JSON shape.
#[derive(Serialize, Deserialize)]
struct Repr {
    status: u16,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    headers: Vec<(String, HeaderRepr)>,
    #[serde(flatten)]
    body: BodyRepr,
}

/// A stored header value, byte for byte: its text when it is UTF-8 (the only form earlier
/// releases wrote, for visible ASCII), else `{"base64": ...}`.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum HeaderRepr {
    Text(String),
    Bytes { base64: String },
}

impl From<&HeaderValue> for HeaderRepr {
    fn from(value: &HeaderValue) -> Self {
        match std::str::from_utf8(value.as_bytes()) {
            Ok(text) => Self::Text(text.to_owned()),
            Err(_) => Self::Bytes {
                base64: STANDARD.encode(value.as_bytes()),
            },
        }
    }
}

impl TryFrom<HeaderRepr> for HeaderValue {
    type Error = InvalidStored;

    fn try_from(repr: HeaderRepr) -> Result<Self, InvalidStored> {
        let bytes = match repr {
            HeaderRepr::Text(text) => text.into_bytes(),
            HeaderRepr::Bytes { base64 } => STANDARD
                .decode(base64)
                .map_err(|_| InvalidStored("base64 header value"))?,
        };
        HeaderValue::from_bytes(&bytes).map_err(|_| InvalidStored("header value"))
    }
}

#[derive(Serialize, Deserialize)]
enum BodyRepr {
    #[serde(rename = "body")]
    Text(String),
    #[serde(rename = "body_base64")]
    Base64(String),
}

impl From<StoredResponse> for Repr {
    fn from(stored: StoredResponse) -> Self {
        let body = match String::from_utf8(stored.body.to_vec()) {
            Ok(text) => BodyRepr::Text(text),
            Err(_) => BodyRepr::Base64(STANDARD.encode(&stored.body)),
        };
        Self {
            status: stored.status.as_u16(),
            headers: stored
                .headers
                .iter()
                .map(|(n, v)| (n.as_str().to_owned(), HeaderRepr::from(v)))
                .collect(),
            body,
        }
    }
}

/// Why a stored response could not be read back.
#[derive(Debug, thiserror::Error)]
#[error("stored response is invalid: {0}")]
struct InvalidStored(&'static str);

impl TryFrom<Repr> for StoredResponse {
    type Error = InvalidStored;

    fn try_from(repr: Repr) -> Result<Self, InvalidStored> {
        let status = StatusCode::from_u16(repr.status).map_err(|_| InvalidStored("status"))?;
        let headers = repr
            .headers
            .into_iter()
            .map(|(name, value)| {
                let name = HeaderName::try_from(name).map_err(|_| InvalidStored("header name"))?;
                let value = HeaderValue::try_from(value)?;
                // Defence in depth: a tampered or old record never replays a credential.
                Ok((!is_sensitive(&name)).then_some((name, value)))
            })
            .filter_map(Result::transpose)
            .collect::<Result<_, _>>()?;
        let body = match repr.body {
            BodyRepr::Text(text) => Bytes::from(text),
            BodyRepr::Base64(data) => Bytes::from(
                STANDARD
                    .decode(data)
                    .map_err(|_| InvalidStored("base64 body"))?,
            ),
        };
        Ok(Self {
            status,
            headers,
            body,
        })
    }
}
