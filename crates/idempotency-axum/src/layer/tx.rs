//! [`IdempotentTx`]: the middleware's transaction, handed to the handler.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use idempotency_core::{IdempotencyStore, Tx};
use tokio::sync::{Mutex, OwnedMutexGuard};

use crate::error::Error;

/// The request extension through which the transaction reaches the handler and comes back.
pub(crate) struct TxSlot<S: IdempotencyStore>(Arc<Mutex<Tx<S>>>);

impl<S: IdempotencyStore> Clone for TxSlot<S> {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

impl<S: IdempotencyStore> TxSlot<S> {
    pub(crate) fn new(tx: Tx<S>) -> Self {
        Self(Arc::new(Mutex::new(tx)))
    }

    /// The transaction back, once the handler and its request are gone; `None` when something
    /// still holds it (a task the handler spawned with it).
    pub(crate) fn reclaim(self) -> Option<Tx<S>> {
        Arc::try_unwrap(self.0).ok().map(Mutex::into_inner)
    }
}

/// The transaction of [`IdempotencyLayer`](crate::IdempotencyLayer), as a handler argument.
///
/// It dereferences to the store's connection (with sqlx, `&mut *tx` is a `&mut PgConnection`
/// or `&mut SqliteConnection`), so the handler's statements run in the transaction that holds
/// the idempotency key and will store the response. The handler does not commit: the
/// middleware commits after storing the response, or rolls back when the status is not stored.
///
/// ```no_run
/// use axum::{Json, http::StatusCode};
/// use idempotency_axum::IdempotentTx;
/// use idempotency_pg::PgStore;
///
/// async fn create(mut tx: IdempotentTx<PgStore>, Json(order): Json<serde_json::Value>) -> StatusCode {
///     let inserted = idempotency_pg::sqlx::query("INSERT INTO orders (body) VALUES ($1)")
///         .bind(order.to_string())
///         .execute(&mut *tx)
///         .await;
///     match inserted {
///         Ok(_) => StatusCode::CREATED,
///         Err(_) => StatusCode::INTERNAL_SERVER_ERROR, // not stored: rolled back
///     }
/// }
/// ```
///
/// Extracted on a route without the layer, or twice in one handler, it answers `500
/// internal-error` and logs why.
pub struct IdempotentTx<S: IdempotencyStore> {
    guard: OwnedMutexGuard<Tx<S>>,
}

impl<S: IdempotencyStore> IdempotentTx<S> {
    /// The [`Tx`], for [`Tx::after_commit`] hooks. Do not commit or roll it back: the middleware
    /// does.
    pub fn tx(&mut self) -> &mut Tx<S> {
        &mut self.guard
    }
}

impl<S: IdempotencyStore> Deref for IdempotentTx<S> {
    type Target = S::Connection;
    fn deref(&self) -> &S::Connection {
        &self.guard
    }
}

impl<S: IdempotencyStore> DerefMut for IdempotentTx<S> {
    fn deref_mut(&mut self) -> &mut S::Connection {
        &mut self.guard
    }
}

impl<S: IdempotencyStore> fmt::Debug for IdempotentTx<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotentTx").finish_non_exhaustive()
    }
}

/// `IdempotentTx` was extracted where there is no transaction to give.
#[derive(Debug, thiserror::Error)]
#[error(
    "IdempotentTx needs IdempotencyLayer on the route (with the same store type), and can be extracted once per request"
)]
struct NoTransaction;

impl<St: Send + Sync, S: IdempotencyStore> FromRequestParts<St> for IdempotentTx<S> {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, _state: &St) -> Result<Self, Error> {
        // Removed, not cloned: a second extraction in the same handler would wait forever on
        // the lock the first one holds.
        let slot = parts
            .extensions
            .remove::<TxSlot<S>>()
            .ok_or_else(|| Error::internal(NoTransaction))?;
        Ok(Self {
            guard: slot.0.lock_owned().await,
        })
    }
}
