//! [`Call`]: one request to run idempotently.

use std::time::Duration;

use crate::key::{IdempotencyKey, Scope};

/// The longest record lifetime `execute` accepts: 1,000 years.
///
/// Far beyond any retention policy, and within every backend's timestamp range (PostgreSQL's
/// `timestamptz` ends in 294276 AD, so `now() + Duration::MAX` overflows it). A longer TTL is
/// refused with [`Error::InvalidTtl`](crate::Error::InvalidTtl) before any I/O rather than
/// clamped: "keep forever" is spelled as no TTL ([`Call::no_expiry`], `ttl: null`).
///
/// ```
/// use std::time::Duration;
/// assert!(idempotency_core::MAX_TTL > Duration::from_secs(999 * 365 * 24 * 3600));
/// ```
pub const MAX_TTL: Duration = Duration::from_secs(1000 * 365 * 24 * 60 * 60);

/// One request to run idempotently: operation, key, optional scope, the request payload that is
/// fingerprinted, and an optional record lifetime.
///
/// ```
/// use std::time::Duration;
/// use idempotency_core::{Call, IdempotencyKey, Scope};
///
/// let key = IdempotencyKey::new("demo-1")?;
/// let body = serde_json::json!({"orderId": "o-1", "amount": "100.00"});
/// // The authenticated caller's tenant, never a value the request chose.
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
    ///
    /// **The call is in the shared, empty scope until [`scoped`](Self::scoped) says otherwise.**
    /// In the shared scope, any caller who sends another caller's key (and payload) receives
    /// that caller's stored outcome, and learns from a payload conflict that the key exists: a
    /// replay answers before the action, and so before its own authorization checks, runs.
    /// Wherever more than one client sends keys, call `.scoped(scope)` with a scope taken from
    /// the authenticated principal (never from the request), at least as fine-grained as who
    /// may read the outcome. The shared scope suits a service with a single client, or keys
    /// that the service makes itself. (`idempotency-axum`'s `ScopedKey::call` builds a scoped
    /// call from the request's principal.)
    pub fn new(operation: &'a str, key: IdempotencyKey, request: &'a R) -> Self {
        Self {
            operation,
            key,
            scope: Scope::default(),
            request,
            ttl: None,
        }
    }

    /// Scopes the key to a tenant or principal: the authenticated caller's, at least as
    /// fine-grained as who may read the outcome (see [`new`](Self::new)).
    pub fn scoped(mut self, scope: Scope) -> Self {
        self.scope = scope;
        self
    }

    /// Overrides the record lifetime for this call; at most [`MAX_TTL`], or `execute` answers
    /// [`Error::InvalidTtl`](crate::Error::InvalidTtl) before any I/O.
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
