//! Helpers shared by the conformance cases.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::cache::LocalCache;
use crate::store::{Acquire, Claim, IdempotencyStore, StoreError};
use crate::{IdempotencyKey, IdempotencyRecord, Operation, RecordId, StoredOutcome};

/// The error type of the suite's actions: ours, or a technical failure.
#[derive(Debug, thiserror::Error)]
pub enum SuiteError {
    /// The service failed.
    #[error(transparent)]
    Idempotency(#[from] crate::Error),
    /// The action failed on purpose.
    #[error("technical failure injected by the test")]
    Boom,
}

impl SuiteError {
    /// The service error, if it is one.
    pub fn idempotency(&self) -> Option<&crate::Error> {
        match self {
            Self::Idempotency(error) => Some(error),
            Self::Boom => None,
        }
    }
}

/// A unique key for this test run (so suites can run again without cleanup).
pub fn key(label: &str) -> IdempotencyKey {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    IdempotencyKey::new(format!("{label}-{nanos:x}-{n}")).expect("valid test key")
}

/// An operation name.
pub fn op(name: &str) -> Operation {
    Operation::new(name).expect("valid operation")
}

/// Counts how often the business action ran.
#[derive(Debug, Clone, Default)]
pub struct CountingAction(Arc<AtomicUsize>);

impl CountingAction {
    /// Records one run and returns the new count.
    pub fn hit(&self) -> usize {
        self.0.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// How many times the action ran.
    pub fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// An in-memory local cache that records every write, to check when the service writes.
#[derive(Debug, Clone, Default)]
pub struct RecordingCache {
    entries: Arc<Mutex<HashMap<RecordId, Arc<IdempotencyRecord>>>>,
}

impl RecordingCache {
    /// Number of cached records.
    pub fn len(&self) -> usize {
        self.entries.lock().map(|e| e.len()).unwrap_or_default()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl LocalCache for RecordingCache {
    fn get(&self, id: &RecordId) -> Option<Arc<IdempotencyRecord>> {
        self.entries.lock().ok()?.get(id).cloned()
    }

    fn put(&self, id: &RecordId, record: Arc<IdempotencyRecord>) {
        assert!(
            record.is_terminal(),
            "a PROCESSING record reached the cache"
        );
        if let Ok(mut entries) = self.entries.lock() {
            entries.insert(id.clone(), record);
        }
    }
}

/// A store whose `find` never finds anything, as if every record were deleted between the insert
/// and the lookup: drives the acquire loop to exhaustion.
#[derive(Debug, Clone)]
pub struct VanishingStore<S>(pub S);

impl<S: IdempotencyStore> IdempotencyStore for VanishingStore<S> {
    type Connection = S::Connection;
    type Transaction = S::Transaction;

    async fn begin(&self) -> Result<Self::Transaction, StoreError> {
        self.0.begin().await
    }
    async fn commit(tx: Self::Transaction) -> Result<(), StoreError> {
        S::commit(tx).await
    }
    async fn rollback(tx: Self::Transaction) -> Result<(), StoreError> {
        S::rollback(tx).await
    }
    async fn acquire(
        &self,
        conn: &mut Self::Connection,
        claim: &Claim<'_>,
    ) -> Result<Acquire, StoreError> {
        self.0.acquire(conn, claim).await
    }
    async fn find(
        &self,
        _conn: &mut Self::Connection,
        _id: &RecordId,
    ) -> Result<Option<IdempotencyRecord>, StoreError> {
        Ok(None)
    }
    async fn complete(
        &self,
        conn: &mut Self::Connection,
        id: &RecordId,
        outcome: &StoredOutcome,
        execution_span: Option<crate::trace::SpanRef>,
    ) -> Result<IdempotencyRecord, StoreError> {
        self.0.complete(conn, id, outcome, execution_span).await
    }
}

/// A store whose `acquire` fails with a database error for keys starting with `fail-`, as a
/// store statement that errors in the middle of a caller's transaction.
#[derive(Debug, Clone)]
pub struct FailingAcquireStore<S>(pub S);

impl<S: IdempotencyStore> IdempotencyStore for FailingAcquireStore<S> {
    type Connection = S::Connection;
    type Transaction = S::Transaction;

    async fn begin(&self) -> Result<Self::Transaction, StoreError> {
        self.0.begin().await
    }
    async fn commit(tx: Self::Transaction) -> Result<(), StoreError> {
        S::commit(tx).await
    }
    async fn rollback(tx: Self::Transaction) -> Result<(), StoreError> {
        S::rollback(tx).await
    }
    async fn acquire(
        &self,
        conn: &mut Self::Connection,
        claim: &Claim<'_>,
    ) -> Result<Acquire, StoreError> {
        if claim.id.key.as_str().starts_with("fail-") {
            return Err(StoreError::Database("acquire failed on purpose".into()));
        }
        self.0.acquire(conn, claim).await
    }
    async fn find(
        &self,
        conn: &mut Self::Connection,
        id: &RecordId,
    ) -> Result<Option<IdempotencyRecord>, StoreError> {
        self.0.find(conn, id).await
    }
    async fn complete(
        &self,
        conn: &mut Self::Connection,
        id: &RecordId,
        outcome: &StoredOutcome,
        execution_span: Option<crate::trace::SpanRef>,
    ) -> Result<IdempotencyRecord, StoreError> {
        self.0.complete(conn, id, outcome, execution_span).await
    }
}
