//! Where a key's scope (tenant or principal) comes from, and the extractor that pairs it with
//! the key.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use idempotency_core::{Call, IdempotencyKey, KeyError, Scope};

use crate::error::Error;
use crate::extract::IdempotencyKeyHeader;

/// Derives the [`Scope`] of a request: the tenant or principal that owns its idempotency key.
///
/// Implement it for a marker type of your own when the scope comes from somewhere else (the
/// state, a verified token). Two implementations come with the crate: [`TenantHeader`] and
/// [`PrincipalScope`]. Derive the scope from an authenticated identity only: a scope the client
/// can choose freely lets it read another client's stored responses.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a ScopeSource: choose the scope of the layer's keys with `.scope::<...>()`",
    note = "the scope must come from the authenticated principal (`PrincipalScope<P>`, `TenantHeader` behind a gateway, or your own ScopeSource); `SharedScope` puts every client's keys together"
)]
pub trait ScopeSource<S>: 'static {
    /// The response when no scope can be derived.
    type Rejection: IntoResponse;

    /// The scope of the request.
    fn scope(
        parts: &mut Parts,
        state: &S,
    ) -> impl Future<Output = Result<Scope, Self::Rejection>> + Send;
}

/// The name of a trusted tenant header, for [`TenantHeader`].
pub trait TenantHeaderName: 'static {
    /// The header name, in lower case.
    const NAME: &'static str;
}

/// The `X-Tenant-Id` header, [`TenantHeader`]'s default.
#[derive(Debug, Clone, Copy, Default)]
pub struct XTenantId;

impl TenantHeaderName for XTenantId {
    const NAME: &'static str = "x-tenant-id";
}

/// The scope is the value of a tenant header set by a trusted gateway after authentication
/// (`X-Tenant-Id` by default; name another with [`TenantHeaderName`]).
///
/// The gateway must strip the header from client requests. Missing or empty: `403
/// scope-missing`; given twice or not a valid scope (1 to 255 visible ASCII characters):
/// `400 scope-invalid`. An empty value never falls back to the shared default scope.
pub struct TenantHeader<H = XTenantId>(PhantomData<fn() -> H>);

impl<H> fmt::Debug for TenantHeader<H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TenantHeader")
    }
}

impl<S: Sync, H: TenantHeaderName> ScopeSource<S> for TenantHeader<H> {
    type Rejection = Error;

    async fn scope(parts: &mut Parts, _state: &S) -> Result<Scope, Error> {
        let mut values = parts.headers.get_all(H::NAME).iter();
        let value = values.next().filter(|value| !value.is_empty());
        let Some(value) = value else {
            return Err(Error::ScopeMissing { from: H::NAME });
        };
        if values.next().is_some() {
            return Err(Error::ScopeInvalid {
                from: H::NAME,
                error: None,
            });
        }
        let text = String::from_utf8_lossy(value.as_bytes());
        Scope::new(text).map_err(|error| Error::ScopeInvalid {
            from: H::NAME,
            error: Some(error),
        })
    }
}

/// An authenticated identity that owns idempotency keys, put in the request extensions by an
/// authentication layer and read by [`PrincipalScope`].
pub trait Principal: Clone + Send + Sync + 'static {
    /// The scope of this principal's keys (a tenant id, a user id, ...).
    fn idempotency_scope(&self) -> Result<Scope, KeyError>;
}

impl Principal for Scope {
    fn idempotency_scope(&self) -> Result<Scope, KeyError> {
        Ok(self.clone())
    }
}

/// The scope is derived from a [`Principal`] of type `P` in the request extensions.
///
/// Missing (the authentication layer did not run or let an anonymous request through), or
/// yielding the empty default scope: `403 scope-missing`; an invalid scope: `400 scope-invalid`.
pub struct PrincipalScope<P>(PhantomData<fn() -> P>);

impl<P> fmt::Debug for PrincipalScope<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PrincipalScope<{}>", std::any::type_name::<P>())
    }
}

impl<S: Sync, P: Principal> ScopeSource<S> for PrincipalScope<P> {
    type Rejection = Error;

    async fn scope(parts: &mut Parts, _state: &S) -> Result<Scope, Error> {
        let principal = parts
            .extensions
            .get::<P>()
            .ok_or(Error::ScopeMissing { from: "principal" })?;
        match principal.idempotency_scope() {
            Ok(scope) if scope.is_empty() => Err(Error::ScopeMissing { from: "principal" }),
            Ok(scope) => Ok(scope),
            Err(error) => Err(Error::ScopeInvalid {
                from: "principal",
                error: Some(error),
            }),
        }
    }
}

/// Extracts the key (with `K`, [`IdempotencyKeyHeader`] by default, or
/// [`UuidKeyHeader`](crate::UuidKeyHeader)) and the scope (with `Src`).
///
/// The key is checked first, then the scope; the rejection is the first one's response.
///
/// ```
/// use idempotency_axum::{ScopedKey, TenantHeader};
///
/// async fn handler(ScopedKey { key, scope, .. }: ScopedKey<TenantHeader>) {
///     // key.0: the IdempotencyKey; scope: the tenant
///     # let _ = (key, scope);
/// }
/// # let _: axum::Router = axum::Router::new().route("/", axum::routing::post(handler));
/// ```
pub struct ScopedKey<Src, K = IdempotencyKeyHeader> {
    /// The key extractor's output.
    pub key: K,
    /// The scope.
    pub scope: Scope,
    source: PhantomData<fn() -> Src>,
}

impl<Src, K: Into<IdempotencyKey>> ScopedKey<Src, K> {
    /// A scoped [`Call`] of `operation` with this key, fingerprinting `request`.
    pub fn call<'a, R: ?Sized>(self, operation: &'a str, request: &'a R) -> Call<'a, R> {
        Call::new(operation, self.key.into(), request).scoped(self.scope)
    }

    /// The key and the scope.
    pub fn into_parts(self) -> (IdempotencyKey, Scope) {
        (self.key.into(), self.scope)
    }
}

impl<Src, K: fmt::Debug> fmt::Debug for ScopedKey<Src, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScopedKey")
            .field("key", &self.key)
            .field("scope", &self.scope)
            .finish()
    }
}

impl<Src, K: Clone> Clone for ScopedKey<Src, K> {
    fn clone(&self) -> Self {
        Self {
            key: self.key.clone(),
            scope: self.scope.clone(),
            source: PhantomData,
        }
    }
}

impl<S, Src, K> FromRequestParts<S> for ScopedKey<Src, K>
where
    S: Send + Sync,
    Src: ScopeSource<S>,
    K: FromRequestParts<S> + Send,
{
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Response> {
        let key = K::from_request_parts(parts, state)
            .await
            .map_err(IntoResponse::into_response)?;
        let scope = Src::scope(parts, state)
            .await
            .map_err(IntoResponse::into_response)?;
        Ok(Self {
            key,
            scope,
            source: PhantomData,
        })
    }
}
