//! [`Tx`]: a store transaction that runs hooks after, and only after, a successful commit.

use std::fmt;
use std::future::Future;
use std::ops::{Deref, DerefMut};
use std::pin::Pin;

use crate::store::{IdempotencyStore, StoreError};

type Hook = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// An open transaction of store `S`, with after-commit hooks.
///
/// `execute_in` takes `&mut Tx<S>`, so calling it outside a transaction does not compile. The
/// service registers its cache writes as hooks: they run after [`commit`](Self::commit) succeeds,
/// and are dropped on rollback or when the `Tx` is dropped uncommitted (which rolls back).
///
/// `Tx` dereferences to the backend connection, so business statements run on it directly
/// (with sqlx: `sqlx::query(..).execute(&mut **tx)` or `tx.connection()`).
///
/// ```no_run
/// # use idempotency_core::*;
/// async fn in_tx<S: IdempotencyStore>(service: &IdempotencyService<S>, key: IdempotencyKey) -> Result<(), Error> {
///     let mut tx = service.begin().await?;
///     let call = Call::new("OP", key, &());
///     let _: Outcome<()> = service
///         .execute_in(&mut tx, call, async |_conn| Ok::<_, Error>(ExecutionResult::success(())))
///         .await?;
///     tx.commit().await?;
///     Ok(())
/// }
/// ```
///
/// The same call on a bare connection does not compile: a connection is not a transaction.
///
/// ```compile_fail
/// # use idempotency_core::*;
/// async fn no_tx<S: IdempotencyStore>(service: &IdempotencyService<S>, conn: &mut S::Connection, key: IdempotencyKey) -> Result<(), Error> {
///     let call = Call::new("OP", key, &());
///     let _: Outcome<()> = service
///         .execute_in(conn, call, async |_conn| Ok::<_, Error>(ExecutionResult::success(())))
///         .await?;
///     Ok(())
/// }
/// ```
pub struct Tx<S: IdempotencyStore> {
    inner: S::Transaction,
    hooks: Vec<Hook>,
}

impl<S: IdempotencyStore> Tx<S> {
    /// Wraps a transaction that the application began itself.
    pub fn new(inner: S::Transaction) -> Self {
        Self {
            inner,
            hooks: Vec::new(),
        }
    }

    /// Begins a transaction on `store`.
    pub async fn begin(store: &S) -> Result<Self, StoreError> {
        Ok(Self::new(store.begin().await?))
    }

    /// The connection, for the application's own statements.
    pub fn connection(&mut self) -> &mut S::Connection {
        &mut self.inner
    }

    /// Registers `hook` to run after a successful commit.
    pub fn after_commit(&mut self, hook: impl Future<Output = ()> + Send + 'static) {
        self.hooks.push(Box::pin(hook));
    }

    /// Number of hooks waiting for the commit.
    pub fn pending_hooks(&self) -> usize {
        self.hooks.len()
    }

    /// Commits, then runs the after-commit hooks in registration order.
    ///
    /// Hooks only speed up later replays (cache writes, metrics); they cannot fail the commit.
    pub async fn commit(self) -> Result<(), StoreError> {
        S::commit(self.inner).await?;
        for hook in self.hooks {
            hook.await;
        }
        Ok(())
    }

    /// Rolls back and drops the hooks.
    pub async fn rollback(self) -> Result<(), StoreError> {
        S::rollback(self.inner).await
    }

    /// Unwraps the backend transaction, dropping the hooks: caches will not be filled by this
    /// transaction, which is safe (they are only an optimization) but loses the speed-up.
    pub fn into_inner(self) -> S::Transaction {
        self.inner
    }
}

impl<S: IdempotencyStore> Deref for Tx<S> {
    type Target = S::Connection;
    fn deref(&self) -> &S::Connection {
        &self.inner
    }
}

impl<S: IdempotencyStore> DerefMut for Tx<S> {
    fn deref_mut(&mut self) -> &mut S::Connection {
        &mut self.inner
    }
}

impl<S: IdempotencyStore> fmt::Debug for Tx<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tx")
            .field("pending_hooks", &self.hooks.len())
            .finish_non_exhaustive()
    }
}
