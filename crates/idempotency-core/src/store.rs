//! The persistence SPI: what a database backend implements.
//!
//! A store writes records through the caller's connection, inside the caller's transaction, so
//! the record commits or rolls back with the business change. Core never sees a driver: the
//! backend names its own connection and transaction types.

use std::future::Future;
use std::ops::DerefMut;
use std::time::Duration;

use crate::fingerprint::Fingerprint;
use crate::key::RecordId;
use crate::record::{IdempotencyRecord, RecordStatus, StoredOutcome};
use crate::trace::SpanRef;

/// A boxed error from a backend, kept as the `source` of a typed error.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A store operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// A concurrent transaction holds the key and did not finish within the wait budget.
    #[error("a concurrent transaction holds the key and did not finish in time")]
    LockTimeout(#[source] BoxError),
    /// `complete` found no `PROCESSING` record for the key (it is missing or already terminal).
    #[error("no PROCESSING record to complete (found {found:?})")]
    NotProcessing {
        /// The status found, or `None` when the record is missing.
        found: Option<RecordStatus>,
    },
    /// A stored record could not be read (unknown status, missing outcome, ...).
    #[error("stored record is corrupt: {reason}")]
    Corrupt {
        /// What is wrong with it.
        reason: String,
    },
    /// The transaction conflicted with another one (serialization failure, deadlock); retrying
    /// the whole request is safe.
    #[error("the transaction conflicted with a concurrent one; retry it")]
    Conflict(#[source] BoxError),
    /// The database could not be reached (connection refused, pool timeout, connection lost).
    #[error("the database is unavailable")]
    Unavailable(#[source] BoxError),
    /// Any other database error.
    #[error("database error")]
    Database(#[source] BoxError),
    /// [`Tx::commit`](crate::Tx::commit) was called on a transaction holding a `PROCESSING`
    /// record whose outcome was never stored (the action or `complete` failed, or the
    /// `execute_in` that claimed it was dropped once its claim was under way). Committing it
    /// would leave the key in flight until its TTL, so the transaction was rolled back instead.
    #[error(
        "{count} key(s) acquired in this transaction have no stored outcome; rolled back instead of committing"
    )]
    UnfinishedClaim {
        /// How many keys were acquired and not completed.
        count: usize,
    },
    /// [`Tx::commit`](crate::Tx::commit) was called on a transaction in which a store statement
    /// had failed. PostgreSQL aborts such a transaction and answers its `COMMIT` with a silent
    /// rollback; the commit is refused on every backend instead, after a rollback, and no
    /// after-commit hook runs. Retry the whole request in a new transaction.
    #[error("a store statement failed in this transaction; rolled back instead of committing")]
    Poisoned,
}

impl StoreError {
    /// Whether a retry of the whole request may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Self::LockTimeout(_) | Self::Conflict(_) | Self::Unavailable(_)
        )
    }
}

/// How long `acquire` may wait for a concurrent transaction that holds the same key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockWait {
    /// Wait until the other transaction ends.
    Unbounded,
    /// Wait at most this long, then fail with [`StoreError::LockTimeout`].
    Timeout(Duration),
    /// Do not wait: fail with [`StoreError::LockTimeout`] at once.
    NoWait,
}

/// An attempt to take a key.
#[derive(Debug, Clone, Copy)]
pub struct Claim<'a> {
    /// The record to create.
    pub id: &'a RecordId,
    /// Fingerprint of the request.
    pub fingerprint: &'a Fingerprint,
    /// How long the record lives before cleanup may delete it; `None` keeps it forever.
    /// Stores compute `expires_at` from the database clock.
    pub ttl: Option<Duration>,
    /// How long to wait for a concurrent holder of the key.
    pub wait: LockWait,
}

/// The result of [`IdempotencyStore::acquire`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquire {
    /// A `PROCESSING` record was inserted in the caller's transaction: run the action.
    Acquired,
    /// A committed record already exists for the key: find it and replay.
    Exists,
}

/// The persistence SPI.
///
/// Every method that touches records takes the caller's connection, which is inside the
/// transaction begun by [`begin`](Self::begin). Implementations must guarantee:
///
/// - `acquire` inserts a `PROCESSING` record unless one exists for `(operation, scope, key)`;
///   when another *uncommitted* transaction holds the key it waits (bounded by
///   [`Claim::wait`]) until that transaction ends, then reports `Acquired` (it rolled back) or
///   `Exists` (it committed);
/// - `find` sees committed records and the caller's own;
/// - `complete` turns the caller's `PROCESSING` record terminal, failing with
///   [`StoreError::NotProcessing`] otherwise.
///
/// The conformance suite in the `testing` module (feature `test-utils`) checks all of this.
pub trait IdempotencyStore: Send + Sync + 'static {
    /// The connection a business action runs its statements on.
    type Connection: Send;
    /// An open transaction; it dereferences to the connection.
    type Transaction: Send + DerefMut<Target = Self::Connection>;

    /// The database, as OpenTelemetry's `db.system` names it (`postgresql`, `sqlite`,
    /// `mysql`...), for the spans of the store's statements. Defaults to `other_sql`.
    const DB_SYSTEM: &'static str = "other_sql";

    /// Begins a transaction on a connection from the store's pool.
    fn begin(&self) -> impl Future<Output = Result<Self::Transaction, StoreError>> + Send;

    /// Commits `tx`.
    fn commit(tx: Self::Transaction) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Rolls `tx` back.
    fn rollback(tx: Self::Transaction) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Inserts a `PROCESSING` record for the claim, or reports that one exists.
    fn acquire(
        &self,
        conn: &mut Self::Connection,
        claim: &Claim<'_>,
    ) -> impl Future<Output = Result<Acquire, StoreError>> + Send;

    /// Reads the record for `id`.
    fn find(
        &self,
        conn: &mut Self::Connection,
        id: &RecordId,
    ) -> impl Future<Output = Result<Option<IdempotencyRecord>, StoreError>> + Send;

    /// Reads the committed record for `id` outside any transaction.
    ///
    /// `execute` calls it before beginning a transaction when `lookup_before_acquire` is on, so a
    /// replay costs one read. The default begins, finds and rolls back; backends with a pool
    /// override it with a single statement.
    fn lookup(
        &self,
        id: &RecordId,
    ) -> impl Future<Output = Result<Option<IdempotencyRecord>, StoreError>> + Send {
        async move {
            let mut tx = self.begin().await?;
            let found = self.find(&mut tx, id).await;
            Self::rollback(tx).await?;
            found
        }
    }

    /// Stores the outcome on the caller's `PROCESSING` record and returns the terminal record.
    ///
    /// `execution_span` is the span that ran the action ([`SpanRef::current`] in it: `None`
    /// without the `otel` feature); the store keeps it on the record and returns it in
    /// [`IdempotencyRecord::execution_span`], from `find` and `lookup` too.
    ///
    /// The service hands it outcomes at most [`MAX_JSON_DEPTH`](crate::MAX_JSON_DEPTH) deep; a
    /// store whose database refuses deeper JSON (MariaDB) refuses it before its statement.
    fn complete(
        &self,
        conn: &mut Self::Connection,
        id: &RecordId,
        outcome: &StoredOutcome,
        execution_span: Option<SpanRef>,
    ) -> impl Future<Output = Result<IdempotencyRecord, StoreError>> + Send;

    /// Marks where the action starts in the caller's transaction (after `acquire`), for a
    /// backend on which one failed statement aborts the whole transaction (PostgreSQL): see
    /// [`rollback_to_savepoint`](Self::rollback_to_savepoint). The default does nothing: on
    /// SQLite and MySQL a failed statement leaves the transaction usable.
    ///
    /// `number` tells the savepoints of one transaction apart (1, 2, ... as
    /// [`Tx::savepoint`](crate::Tx::savepoint) takes them): a store names each by it, so that
    /// [`rollback_to_savepoint`](Self::rollback_to_savepoint) of an earlier one returns to it
    /// even when a later one (a handler's own) was taken since.
    fn savepoint(
        &self,
        conn: &mut Self::Connection,
        number: u32,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let _ = (conn, number);
        async { Ok(()) }
    }

    /// When `failed` (the error of [`complete`](Self::complete)) says the transaction had
    /// already been aborted by an earlier statement, returns it to the
    /// [`savepoint`](Self::savepoint) numbered `number`, undoing the action's statements, so that an action which
    /// caught a failed statement (a unique violation answered as a 422) can still have its
    /// outcome stored: the caller then completes the record again. `false` for any other
    /// failure (the transaction is left as it is) and when the store keeps no savepoint (the
    /// default).
    fn rollback_to_savepoint(
        &self,
        conn: &mut Self::Connection,
        number: u32,
        failed: &StoreError,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        let _ = (conn, number, failed);
        async { Ok(false) }
    }

    /// Whether `failed` (the error of a store statement) says the transaction had already been
    /// aborted by an earlier statement of the caller's (PostgreSQL's `25P02`), so that the same
    /// statement would succeed in a new transaction. `false` by default: on SQLite, and on
    /// MySQL for most errors, a failed statement leaves the transaction usable (a MySQL
    /// deadlock ends it, which the MySQL store reports as a retryable conflict instead). The
    /// optimistic mode of `idempotency-axum`'s `IdempotencyLayer` stores the handler's `4xx` in
    /// a new transaction when its insert fails this way. A store that wraps another must
    /// forward it.
    fn aborted_before(&self, failed: &StoreError) -> bool {
        let _ = failed;
        false
    }
}

/// Optional capability: delete expired records in bounded batches.
pub trait ExpiredCleanup: Send + Sync + 'static {
    /// Deletes at most `batch_size` records whose `expires_at` has passed (database clock), in
    /// one short transaction, skipping rows locked by others. Returns how many were deleted.
    fn delete_expired_batch(
        &self,
        batch_size: u32,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;
}

/// Optional capability: insert a terminal record in one statement, for
/// [`IdempotencyService::execute_optimistic`](crate::IdempotencyService::execute_optimistic).
pub trait InsertCompleted: IdempotencyStore {
    /// Inserts a terminal record for the claim with `outcome`, unless a record exists for the key.
    ///
    /// Returns the inserted record, or `None` when the key is already taken. Like
    /// [`acquire`](IdempotencyStore::acquire), it waits (within [`Claim::wait`]) for a concurrent
    /// uncommitted holder of the key, failing with [`StoreError::LockTimeout`] past the budget.
    /// `execution_span` is kept on the record as by [`complete`](IdempotencyStore::complete).
    fn insert_completed(
        &self,
        conn: &mut Self::Connection,
        claim: &Claim<'_>,
        outcome: &StoredOutcome,
        execution_span: Option<SpanRef>,
    ) -> impl Future<Output = Result<Option<IdempotencyRecord>, StoreError>> + Send;
}
