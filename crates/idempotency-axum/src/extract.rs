//! The `Idempotency-Key` extractors: any key, a UUID key, and their optional forms.

use axum::extract::{FromRequestParts, OptionalFromRequestParts};
use axum::http::request::Parts;
use idempotency_core::{Call, IdempotencyKey};
use uuid::Uuid;

use crate::error::Error;
use crate::header::{parse_key, parse_uuid_key, single_value};

/// Extracts a validated key from the `Idempotency-Key` header (the grammar is in the crate
/// docs). Missing: `400 idempotency-key-missing`; invalid or repeated:
/// `400 idempotency-key-invalid`.
///
/// As `Option<IdempotencyKeyHeader>` it serves endpoints where the key is optional: absent is
/// `None`, present but invalid is still a 400.
///
/// ```
/// use axum::Json;
/// use idempotency_axum::IdempotencyKeyHeader;
///
/// async fn create(IdempotencyKeyHeader(key): IdempotencyKeyHeader, Json(body): Json<serde_json::Value>) {
///     // `key` is an `idempotency_core::IdempotencyKey`
///     # let _ = (key, body);
/// }
/// async fn maybe(key: Option<IdempotencyKeyHeader>) {
///     // None when the client sent no key
///     # let _ = key;
/// }
/// # let _: axum::Router = axum::Router::new()
/// #     .route("/a", axum::routing::post(create))
/// #     .route("/b", axum::routing::post(maybe));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKeyHeader(pub IdempotencyKey);

impl IdempotencyKeyHeader {
    /// The key.
    pub fn key(&self) -> &IdempotencyKey {
        &self.0
    }

    /// Consumes the extractor and returns the key.
    pub fn into_inner(self) -> IdempotencyKey {
        self.0
    }

    /// A [`Call`] of `operation` with this key, fingerprinting `request`.
    pub fn call<'a, R: ?Sized>(self, operation: &'a str, request: &'a R) -> Call<'a, R> {
        Call::new(operation, self.0, request)
    }

    fn from_parts(parts: &Parts) -> Result<Option<Self>, Error> {
        match single_value(&parts.headers)? {
            None => Ok(None),
            Some(value) => Ok(Some(Self(parse_key(value)?))),
        }
    }
}

impl From<IdempotencyKeyHeader> for IdempotencyKey {
    fn from(value: IdempotencyKeyHeader) -> Self {
        value.0
    }
}

impl<S: Send + Sync> FromRequestParts<S> for IdempotencyKeyHeader {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Error> {
        Self::from_parts(parts)?.ok_or(Error::KeyMissing)
    }
}

impl<S: Send + Sync> OptionalFromRequestParts<S> for IdempotencyKeyHeader {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Option<Self>, Error> {
        Self::from_parts(parts)
    }
}

/// Extracts an `Idempotency-Key` that must be a UUID, for endpoints that document UUID keys.
///
/// Accepted: the hyphenated form `8-4-4-4-12` in either case, bare or quoted, except the nil
/// and max UUIDs. The key is normalized to lower case, so `8E03...` and `8e03...` are the same
/// key. Anything else: `400 idempotency-key-invalid` with `reason: not-uuid`. Also works as
/// `Option<UuidKeyHeader>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct UuidKeyHeader {
    /// The normalized key (lower-case hyphenated UUID).
    pub key: IdempotencyKey,
    /// The UUID.
    pub uuid: Uuid,
}

impl UuidKeyHeader {
    /// Consumes the extractor and returns the key.
    pub fn into_inner(self) -> IdempotencyKey {
        self.key
    }

    /// A [`Call`] of `operation` with this key, fingerprinting `request`.
    pub fn call<'a, R: ?Sized>(self, operation: &'a str, request: &'a R) -> Call<'a, R> {
        Call::new(operation, self.key, request)
    }

    fn from_parts(parts: &Parts) -> Result<Option<Self>, Error> {
        match single_value(&parts.headers)? {
            None => Ok(None),
            Some(value) => {
                let (key, uuid) = parse_uuid_key(value)?;
                Ok(Some(Self { key, uuid }))
            }
        }
    }
}

impl From<UuidKeyHeader> for IdempotencyKey {
    fn from(value: UuidKeyHeader) -> Self {
        value.key
    }
}

impl<S: Send + Sync> FromRequestParts<S> for UuidKeyHeader {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Error> {
        Self::from_parts(parts)?.ok_or(Error::KeyMissing)
    }
}

impl<S: Send + Sync> OptionalFromRequestParts<S> for UuidKeyHeader {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Option<Self>, Error> {
        Self::from_parts(parts)
    }
}
