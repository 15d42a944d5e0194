//! The demo's scope: the `X-Tenant-Id` header when present (set by a trusted gateway), the
//! shared default scope when absent. A present but empty or invalid value is a 400.

use axum::http::request::Parts;
use idempotency_axum::{Error, ScopeSource};
use idempotency_core::Scope;

/// `X-Tenant-Id` when the request has one, else the default scope.
///
/// The demo has no authentication; in a real service the tenant comes from a verified identity
/// and a missing one is an error (`idempotency_axum::TenantHeader` answers 403).
#[derive(Debug, Clone, Copy)]
pub struct OptionalTenant;

impl<S: Send + Sync> ScopeSource<S> for OptionalTenant {
    type Rejection = Error;

    async fn scope(parts: &mut Parts, _state: &S) -> Result<Scope, Error> {
        let mut values = parts.headers.get_all("x-tenant-id").iter();
        let Some(value) = values.next() else {
            return Ok(Scope::default());
        };
        if values.next().is_some() {
            return Err(Error::ScopeInvalid {
                from: "x-tenant-id header",
                error: None,
            });
        }
        let invalid = || Error::ScopeInvalid {
            from: "x-tenant-id header",
            error: None,
        };
        let text = value.to_str().map_err(|_| invalid())?;
        // Present means a tenant: an empty value is an error, never the shared default scope.
        if text.is_empty() {
            return Err(invalid());
        }
        Scope::new(text).map_err(|error| Error::ScopeInvalid {
            from: "x-tenant-id header",
            error: Some(error),
        })
    }
}
