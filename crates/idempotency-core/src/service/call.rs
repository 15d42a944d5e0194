//! [`Call`]: one request to run idempotently.

use std::time::Duration;

use crate::key::{IdempotencyKey, Scope};

/// One request to run idempotently: operation, key, optional scope, the request payload that is
/// fingerprinted, and an optional record lifetime.
///
/// ```
/// use std::time::Duration;
/// use idempotency_core::{Call, IdempotencyKey, Scope};
///
/// let key = IdempotencyKey::new("demo-1")?;
/// let body = serde_json::json!({"orderId": "o-1", "amount": "100.00"});
/// let call = Call::new("CREATE_PAYMENT", key, &body)
///     .scoped(Scope::new("tenant-7")?)
///     .ttl(Duration::from_secs(24 * 3600));
/// assert_eq!(call.operation(), "CREATE_PAYMENT");
/// # Ok::<(), idempotency_core::KeyError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Call<'a, R: ?Sized> {
    pub(crate) operation: &'a str,
    pub(crate) key: IdempotencyKey,
    pub(crate) scope: Scope,
    pub(crate) request: &'a R,
    pub(crate) ttl: Option<Option<Duration>>,
}

impl<'a, R: ?Sized> Call<'a, R> {
    /// A call of `operation` with `key`, fingerprinting `request`. The operation name is
    /// validated by `execute` (1 to 128 visible ASCII characters).
    pub fn new(operation: &'a str, key: IdempotencyKey, request: &'a R) -> Self {
        Self {
            operation,
            key,
            scope: Scope::default(),
            request,
            ttl: None,
        }
    }

    /// Scopes the key to a tenant or principal.
    pub fn scoped(mut self, scope: Scope) -> Self {
        self.scope = scope;
        self
    }

    /// Overrides the record lifetime for this call.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(Some(ttl));
        self
    }

    /// Keeps this call's record until it is deleted by hand (`expires_at` is `NULL`).
    pub fn no_expiry(mut self) -> Self {
        self.ttl = Some(None);
        self
    }

    /// The operation name.
    pub fn operation(&self) -> &str {
        self.operation
    }

    /// The key.
    pub fn key(&self) -> &IdempotencyKey {
        &self.key
    }

    /// The scope.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }
}
