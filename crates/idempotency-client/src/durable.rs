//! Durable keys: the key of an operation kept across restarts of the caller ([`KeyStore`]).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

/// The caller's id for one logical operation (a job id, an order's payment), set on a request
/// with [`reqwest_middleware::RequestBuilder::with_extension`]. With a [`KeyStore`] configured,
/// the middleware sends the key stored for it, so that a caller restarted mid-operation sends
/// the same key again.
///
/// ```
/// use idempotency_client::Operation;
///
/// let operation = Operation::new("payout-2026-12-05-alice");
/// assert_eq!(operation.as_str(), "payout-2026-12-05-alice");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Operation(String);

impl Operation {
    /// The operation `id`.
    pub fn new(id: impl Into<String>) -> Self {
        Self(id.into())
    }

    /// The id.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A [`KeyStore`] failed.
#[derive(Debug, thiserror::Error)]
#[error("the key store failed: {0}")]
pub struct KeyStoreError(#[source] pub Box<dyn std::error::Error + Send + Sync>);

/// Keeps one key per [`Operation`].
///
/// ```
/// use idempotency_client::{KeyStore, MemoryKeyStore};
///
/// # tokio_test_block_on(async {
/// let store = MemoryKeyStore::default();
/// assert_eq!(store.key_for("job-7", "k-1").await.unwrap(), "k-1");
/// assert_eq!(store.key_for("job-7", "k-2").await.unwrap(), "k-1", "the first key stays");
/// store.forget("job-7").await.unwrap();
/// assert_eq!(store.key_for("job-7", "k-3").await.unwrap(), "k-3");
/// # });
/// # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
/// # }
/// ```
pub trait KeyStore: Send + Sync + 'static {
    /// The key stored for `operation`; when there is none, stores `fresh` and returns it.
    /// Two concurrent calls for one operation return the same key.
    fn key_for(
        &self,
        operation: &str,
        fresh: &str,
    ) -> impl Future<Output = Result<String, KeyStoreError>> + Send;

    /// Forgets the key of `operation`, once its outcome is final (the next call with that id
    /// is a new operation).
    fn forget(&self, operation: &str) -> impl Future<Output = Result<(), KeyStoreError>> + Send;
}

/// Keys in this process's memory: they survive a new client, not a restart of the process.
/// For tests, and for callers whose operations do not outlive the process.
#[derive(Debug, Clone, Default)]
pub struct MemoryKeyStore(Arc<Mutex<HashMap<String, String>>>);

impl KeyStore for MemoryKeyStore {
    async fn key_for(&self, operation: &str, fresh: &str) -> Result<String, KeyStoreError> {
        let mut keys = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        Ok(keys
            .entry(operation.to_owned())
            .or_insert_with(|| fresh.to_owned())
            .clone())
    }

    async fn forget(&self, operation: &str) -> Result<(), KeyStoreError> {
        let mut keys = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        keys.remove(operation);
        Ok(())
    }
}

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// [`KeyStore`] as a trait object, for the middleware.
pub(crate) trait DynKeyStore: Send + Sync {
    fn key_for<'a>(
        &'a self,
        operation: &'a str,
        fresh: &'a str,
    ) -> BoxFuture<'a, Result<String, KeyStoreError>>;
}

impl<K: KeyStore> DynKeyStore for K {
    fn key_for<'a>(
        &'a self,
        operation: &'a str,
        fresh: &'a str,
    ) -> BoxFuture<'a, Result<String, KeyStoreError>> {
        Box::pin(KeyStore::key_for(self, operation, fresh))
    }
}
