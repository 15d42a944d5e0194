//! [`Tx`]: a store transaction that runs hooks after, and only after, a successful commit.

use std::fmt;
use std::future::Future;
use std::ops::{Deref, DerefMut};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::store::{IdempotencyStore, StoreError};

type Hook = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// A [`Tx`]'s hooks, unfinished claims and failed-statement flag when [`Tx::savepoint`] took
/// the store's savepoint, restored by [`Tx::rollback_to_savepoint`], and which savepoint it
/// was: each has a number of its own in its transaction, so a rollback to one returns to it,
/// not to a later one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxMark {
    /// The [`Tx`] it was taken in.
    tx: u64,
    savepoint: u32,
    hooks: usize,
    first_hooks: usize,
    unfinished: usize,
    poisoned: bool,
}

/// An open transaction of store `S`, with after-commit hooks.
///
/// `execute_in` takes `&mut Tx<S>`, so calling it outside a transaction does not compile. The
/// service registers its cache writes as hooks: they run after [`commit`](Self::commit) succeeds,
/// and are dropped on rollback or when the `Tx` is dropped uncommitted (which rolls back).
///
/// A `Tx` also remembers the keys [`execute_in`](crate::IdempotencyService::execute_in) acquired
/// and has not completed yet (the action returned an error after the acquire, or the
/// `execute_in` future was dropped once its claim was under way, sent or about to be):
/// committing then would leave a
/// `PROCESSING` record that answers every retry with "in flight" until its TTL, so
/// [`commit`](Self::commit) rolls back instead and returns [`StoreError::UnfinishedClaim`].
///
/// A store statement that failed inside `execute_in` (a lock timeout, a lost connection, a
/// constraint) *poisons* the `Tx`: PostgreSQL has aborted the transaction and would answer a
/// `COMMIT` with a silent rollback, which sqlx reports as success, and the after-commit hooks
/// would then cache outcomes that were never stored. [`commit`](Self::commit) of a poisoned `Tx`
/// rolls back, runs no hook, and returns [`StoreError::Poisoned`], on every backend alike.
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
    /// The hooks of [`after_commit_first`](Self::after_commit_first), run before `hooks`.
    first_hooks: Vec<Hook>,
    unfinished: usize,
    poisoned: bool,
    /// How many savepoints [`savepoint`](Self::savepoint) took: the last one's number.
    savepoints: u32,
    /// The numbers of the savepoints that still exist, oldest first: a rollback to one
    /// destroys those taken after it.
    live: Vec<u32>,
    /// Tells this `Tx` apart from others, for the marks taken in it.
    id: u64,
}

/// The next [`Tx`]'s `id`.
static NEXT_TX: AtomicU64 = AtomicU64::new(0);

impl<S: IdempotencyStore> Tx<S> {
    /// Wraps a transaction that the application began itself.
    pub fn new(inner: S::Transaction) -> Self {
        Self {
            inner,
            hooks: Vec::new(),
            first_hooks: Vec::new(),
            unfinished: 0,
            poisoned: false,
            savepoints: 0,
            live: Vec::new(),
            id: NEXT_TX.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// Begins a transaction on `store`.
    pub async fn begin(store: &S) -> Result<Self, StoreError> {
        // On the heap: a pool's `begin` may open a connection, and its future is large (sqlx's
        // PostgreSQL pool: about 8.5 KiB). Inline, it would make every future that may begin a
        // transaction that much larger, including a replay's, which never does.
        Ok(Self::new(Box::pin(store.begin()).await?))
    }

    /// The connection, for the application's own statements.
    pub fn connection(&mut self) -> &mut S::Connection {
        &mut self.inner
    }

    /// Registers `hook` to run after a successful commit.
    pub fn after_commit(&mut self, hook: impl Future<Output = ()> + Send + 'static) {
        self.hooks.push(Box::pin(hook));
    }

    /// Registers `hook` to run after a successful commit, before every hook registered with
    /// [`after_commit`](Self::after_commit) (those of `after_commit_first` run in their own
    /// registration order).
    ///
    /// For bookkeeping that the application's hooks must not hold back: [`commit`](Self::commit)
    /// awaits its hooks one after the other, so a slow hook registered earlier (a notifier
    /// that hangs) would delay a later one, and a future dropped meanwhile (a client gone, a
    /// timeout) would never run it. `IdempotencyLayer` counts a stored record and fills the
    /// caches this way, after the handler registered its own hooks.
    ///
    /// ```
    /// # use idempotency_core::*;
    /// # async fn f<S: IdempotencyStore>(service: &IdempotencyService<S>) -> Result<(), StoreError> {
    /// let mut tx = service.begin().await?;
    /// tx.after_commit(async { /* the application's notifier */ });
    /// tx.after_commit_first(async { /* runs first */ });
    /// assert_eq!(tx.pending_hooks(), 2);
    /// tx.commit().await
    /// # }
    /// ```
    pub fn after_commit_first(&mut self, hook: impl Future<Output = ()> + Send + 'static) {
        self.first_hooks.push(Box::pin(hook));
    }

    /// Number of hooks waiting for the commit.
    pub fn pending_hooks(&self) -> usize {
        self.hooks.len() + self.first_hooks.len()
    }

    /// Takes the store's savepoint ([`IdempotencyStore::savepoint`]; nothing on a store that
    /// keeps none) and returns what the transaction holds now besides its statements (its
    /// hooks, its unfinished claims, whether a store statement failed), for
    /// [`rollback_to_savepoint`](Self::rollback_to_savepoint).
    ///
    /// Each call takes a savepoint of its own (numbered in this transaction), so that a
    /// rollback to an earlier one returns there even when a later one was taken since. A
    /// savepoint that could not be taken poisons the `Tx`, as any failed store statement does.
    pub async fn savepoint(&mut self, store: &S) -> Result<TxMark, StoreError> {
        let savepoint = self.savepoints.checked_add(1).ok_or_else(|| {
            StoreError::Database("more than u32::MAX savepoints in one transaction".into())
        })?;
        let taken = store.savepoint(self.connection(), savepoint).await;
        self.watch(taken)?;
        self.savepoints = savepoint;
        self.live.push(savepoint);
        Ok(TxMark {
            tx: self.id,
            savepoint,
            hooks: self.hooks.len(),
            first_hooks: self.first_hooks.len(),
            unfinished: self.unfinished,
            poisoned: self.poisoned,
        })
    }

    /// [`IdempotencyStore::rollback_to_savepoint`] on this transaction, for `failed`. When it
    /// returned to the savepoint taken at `mark` (`true`), what came with the statements it
    /// undid goes with them: the hooks registered since are dropped (they must not run after
    /// the commit), the keys acquired since are no longer unfinished (their claims are
    /// undone), and a store statement that failed since no longer refuses the commit (the
    /// savepoint undid the failure).
    ///
    /// `false`, without a statement, for a mark of another `Tx` or of a savepoint that a
    /// rollback to an earlier one destroyed; a rollback that fails poisons the `Tx`.
    ///
    /// ```no_run
    /// # use idempotency_core::*;
    /// # async fn f<S: IdempotencyStore>(service: &IdempotencyService<S>, failed: StoreError) -> Result<(), StoreError> {
    /// let store = service.store();
    /// let mut tx = service.begin().await?;
    /// let mark = tx.savepoint(store).await?;
    /// // a statement and its hook...
    /// tx.after_commit(async { /* notify about the row */ });
    /// // ...then a statement fails and aborts the transaction (`failed`)
    /// if tx.rollback_to_savepoint(store, mark, &failed).await? {
    ///     assert_eq!(tx.pending_hooks(), 0, "the hook went with its statement");
    /// }
    /// tx.commit().await
    /// # }
    /// ```
    pub async fn rollback_to_savepoint(
        &mut self,
        store: &S,
        mark: TxMark,
        failed: &StoreError,
    ) -> Result<bool, StoreError> {
        let Some(at) = self.live.iter().position(|&live| live == mark.savepoint) else {
            return Ok(false);
        };
        if mark.tx != self.id {
            return Ok(false);
        }
        // Poisoned until the store answers: a future dropped in between leaves a transaction
        // this `Tx` cannot know (back at the savepoint, or still aborted), which must not
        // commit, and hooks that may belong to undone statements, which must not run.
        let before = self.poisoned;
        self.poisoned = true;
        let back = store
            .rollback_to_savepoint(self.connection(), mark.savepoint, failed)
            .await?;
        if back {
            self.live.truncate(at + 1);
            self.hooks.truncate(mark.hooks);
            self.first_hooks.truncate(mark.first_hooks);
            self.unfinished = mark.unfinished;
            self.poisoned = mark.poisoned;
        } else {
            self.poisoned = before;
        }
        Ok(back)
    }

    /// Number of keys acquired in this transaction whose outcome is not stored yet, counting
    /// the claim of an `execute_in` dropped while its insert was on its way (sent, or about to
    /// be) before the store answered.
    pub fn unfinished_claims(&self) -> usize {
        self.unfinished
    }

    /// Whether a store statement failed in this transaction: [`commit`](Self::commit) will roll
    /// back and return [`StoreError::Poisoned`].
    pub fn is_poisoned(&self) -> bool {
        self.poisoned
    }

    /// The transaction must not commit (a store statement failed, or wrote what it should not).
    pub(crate) fn poison(&mut self) {
        self.poisoned = true;
    }

    /// Passes a store statement's result through, poisoning the transaction when it failed.
    pub(crate) fn watch<T>(&mut self, result: Result<T, StoreError>) -> Result<T, StoreError> {
        if result.is_err() {
            self.poison();
        }
        result
    }

    /// A key was acquired, or its insert is about to be sent (the store's answer is not known
    /// yet): it holds a `PROCESSING` record until its outcome is stored.
    pub(crate) fn claim_started(&mut self) {
        self.unfinished += 1;
    }

    /// The outcome of an acquired key is stored, or the store answered that the insert
    /// [`claim_started`](Self::claim_started) counted took nothing.
    pub(crate) fn claim_completed(&mut self) {
        self.unfinished = self.unfinished.saturating_sub(1);
    }

    /// Commits, then runs the after-commit hooks: those of
    /// [`after_commit_first`](Self::after_commit_first), then those of
    /// [`after_commit`](Self::after_commit), each in registration order.
    ///
    /// Hooks only speed up later replays (cache writes, metrics); they cannot fail the commit.
    ///
    /// Never commit after one of the transaction's statements failed: PostgreSQL answers the
    /// `COMMIT` of such an aborted transaction with a rollback and no error, so the commit
    /// would look successful, and the hooks would cache outcomes that were never stored.
    ///
    /// # Errors
    ///
    /// The backend's commit error; after a rollback, [`StoreError::Poisoned`] when a store
    /// statement failed in this transaction, or [`StoreError::UnfinishedClaim`] when a key
    /// acquired in it has no stored outcome.
    pub async fn commit(self) -> Result<(), StoreError> {
        let refused = if self.poisoned {
            Some(StoreError::Poisoned)
        } else if self.unfinished > 0 {
            Some(StoreError::UnfinishedClaim {
                count: self.unfinished,
            })
        } else {
            None
        };
        if let Some(refused) = refused {
            if let Err(error) = S::rollback(self.inner).await {
                tracing::warn!(%error, reason = %refused, "rollback of a refused commit failed");
            }
            return Err(refused);
        }
        S::commit(self.inner).await?;
        for hook in self.first_hooks.into_iter().chain(self.hooks) {
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
    /// The unfinished-claim guard of [`commit`](Self::commit) goes too: check
    /// [`unfinished_claims`](Self::unfinished_claims) first.
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
            .field(
                "pending_hooks",
                &(self.hooks.len() + self.first_hooks.len()),
            )
            .field("unfinished_claims", &self.unfinished)
            .field("poisoned", &self.poisoned)
            .finish_non_exhaustive()
    }
}
