//! `/admin`: the facade's admin router (`idempotency::admin`), behind a bearer token from the
//! configuration (`admin.token`, `ADMIN__TOKEN`). Without a token it is not mounted at all.

use axum::Router;
use axum::extract::Request;
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use idempotency::Idempotency;
use idempotency::ops::{Actor, AdminDatabase};

use crate::config::AdminConfig;

/// The shortest token `admin.token` takes.
pub const MIN_TOKEN_LENGTH: usize = 16;

/// `admin.token` is refused.
#[derive(Debug, thiserror::Error)]
#[error("admin.token (ADMIN__TOKEN) is refused: {reason}; leave it unset to serve no admin page")]
pub struct AdminTokenError {
    /// Why.
    pub reason: String,
}

/// The admin router, behind `config.token`: `None` (not mounted) without a token, an error
/// for a token shorter than [`MIN_TOKEN_LENGTH`] characters. Changes are on when
/// `admin.allow-mutations` says so; they are audited as `demo-admin`.
pub fn router<P: AdminDatabase>(
    idempotency: &Idempotency<P>,
    config: &AdminConfig,
) -> Result<Option<Router>, AdminTokenError> {
    let Some(token) = config.token.as_deref() else {
        return Ok(None);
    };
    if token.chars().count() < MIN_TOKEN_LENGTH || token.trim() != token {
        return Err(AdminTokenError {
            reason: format!(
                "it must be at least {MIN_TOKEN_LENGTH} characters, without surrounding spaces"
            ),
        });
    }
    let expected = format!("Bearer {token}").into_bytes();
    let admin = idempotency
        .admin_router()
        .allow_mutations(config.allow_mutations)
        .mutations_setting("admin.allow-mutations (ADMIN__ALLOW_MUTATIONS)")
        .into_router()
        .layer(middleware::from_fn(move |request: Request, next: Next| {
            let expected = expected.clone();
            async move { bearer(&expected, request, next).await }
        }));
    Ok(Some(admin))
}

/// 401 unless `Authorization` is the expected bearer token (compared in constant time); the
/// principal reaches the audit trail as an [`Actor`].
async fn bearer(expected: &[u8], mut request: Request, next: Next) -> Response {
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .map(|v| v.as_bytes())
        .unwrap_or_default();
    if !constant_time_eq(given, expected) {
        return (
            StatusCode::UNAUTHORIZED,
            [(
                header::WWW_AUTHENTICATE,
                "Bearer realm=\"idempotency-demo admin\"",
            )],
            "the admin page needs Authorization: Bearer <admin.token>\n",
        )
            .into_response();
    }
    request.extensions_mut().insert(Actor::new("demo-admin"));
    next.run(request).await
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::constant_time_eq;

    #[test]
    fn compares_whole_tokens() {
        assert!(constant_time_eq(b"Bearer abc", b"Bearer abc"));
        assert!(!constant_time_eq(b"Bearer abd", b"Bearer abc"));
        assert!(!constant_time_eq(b"Bearer ab", b"Bearer abc"));
    }
}
