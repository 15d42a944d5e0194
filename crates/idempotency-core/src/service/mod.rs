//! [`IdempotencyService`]: runs business actions at most once per key.

mod builder;
mod call;
mod execute;
mod optimistic;

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

pub use builder::ServiceBuilder;
pub use call::{Call, MAX_TTL};

use crate::cache::NoCache;
use crate::config::{CoreConfig, InFlightPolicyKind};
use crate::fingerprint::FingerprintStrategy;
use crate::metrics::NoopMetrics;
use crate::serializer::JsonSerializer;
use crate::store::{IdempotencyStore, StoreError};
use crate::tx::Tx;

/// What a request does when another transaction holds the same key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InFlightPolicy {
    /// Wait for the holder to finish (at most `timeout`, when set), then replay its outcome
    /// (or run, if it rolled back). Past the timeout: [`Error::InFlight`](crate::Error::InFlight).
    Wait {
        /// The wait budget; `None` waits until the holder finishes.
        timeout: Option<Duration>,
    },
    /// Answer [`Error::InFlight`](crate::Error::InFlight) at once.
    Reject,
}

/// The service's runtime settings. Build it from [`CoreConfig`] with `From`, or by hand.
#[derive(Debug, Clone, PartialEq)]
pub struct ServiceOptions {
    /// Master switch: when `false`, actions run without any record.
    pub enabled: bool,
    /// Record lifetime when neither the call nor the operation sets one.
    pub default_ttl: Option<Duration>,
    /// Per-operation record lifetimes.
    pub operation_ttls: HashMap<String, Option<Duration>>,
    /// Look the key up in the store before inserting it.
    pub lookup_before_acquire: bool,
    /// What to do when the key is held by a concurrent request.
    pub in_flight: InFlightPolicy,
    /// Insert-then-find rounds before [`Error::AcquireExhausted`](crate::Error::AcquireExhausted).
    pub max_acquire_attempts: u32,
}

impl Default for ServiceOptions {
    fn default() -> Self {
        Self::from(&CoreConfig::default())
    }
}

/// The runtime settings of `idempotency.*`. The fingerprint strategy (`fingerprint.*`) is a
/// part of the service, not a setting: [`ServiceBuilder::configure`] applies both.
impl From<&CoreConfig> for ServiceOptions {
    fn from(config: &CoreConfig) -> Self {
        Self {
            enabled: config.enabled,
            default_ttl: config.persistence.ttl,
            operation_ttls: config
                .operations
                .iter()
                .filter_map(|(name, op)| op.ttl.map(|ttl| (name.clone(), ttl)))
                .collect(),
            lookup_before_acquire: config.persistence.lookup_before_acquire,
            in_flight: match config.in_flight.policy {
                InFlightPolicyKind::Wait => InFlightPolicy::Wait {
                    timeout: config.in_flight.timeout,
                },
                InFlightPolicyKind::Reject => InFlightPolicy::Reject,
            },
            max_acquire_attempts: config.acquire.max_attempts.max(1),
        }
    }
}

pub(crate) struct Inner<S, L, D, M, Z> {
    pub(crate) store: S,
    pub(crate) local: L,
    pub(crate) distributed: D,
    pub(crate) metrics: M,
    pub(crate) serializer: Z,
    pub(crate) fingerprint: Box<dyn FingerprintStrategy>,
    pub(crate) config: ServiceOptions,
}

/// Runs business actions idempotently, in the caller's database transaction.
///
/// A repeated call with the same `(operation, scope, key)` does not run the action again: it
/// replays the stored outcome of the first run (a success or a business rejection). The record is
/// written in the same transaction as the business change, so both commit or neither does.
///
/// Type parameters: the store `S`, the local cache `L`, the distributed cache `D`, the metrics
/// `M` and the result serializer `Z`; all but the store have no-op or JSON defaults. The service
/// is cheap to clone (one `Arc`).
///
/// ```no_run
/// # async fn demo<S: idempotency_core::IdempotencyStore>(store: S) -> Result<(), idempotency_core::Error> {
/// use idempotency_core::{Call, ExecutionResult, IdempotencyKey, IdempotencyService, Scope};
///
/// let service = IdempotencyService::new(store);
/// let key = IdempotencyKey::new("demo-1")?;
/// let tenant = Scope::new("tenant-7")?; // the authenticated caller's, never the request's
/// let request = serde_json::json!({"orderId": "o-1", "amount": "100.00"});
///
/// let call = Call::new("CREATE_PAYMENT", key, &request).scoped(tenant);
/// let outcome = service
///     .execute(call, async |_conn| {
///         // business statements run on `_conn`, in the same transaction as the record
///         Ok::<_, idempotency_core::Error>(ExecutionResult::success("p-1".to_owned()))
///     })
///     .await?;
/// println!("replayed: {}", outcome.is_replayed());
/// # Ok(()) }
/// ```
pub struct IdempotencyService<S, L = NoCache, D = NoCache, M = NoopMetrics, Z = JsonSerializer> {
    pub(crate) inner: Arc<Inner<S, L, D, M, Z>>,
}

impl<S: IdempotencyStore> IdempotencyService<S> {
    /// A service over `store` with default settings, no caches and no metrics.
    pub fn new(store: S) -> Self {
        ServiceBuilder::new(store).build()
    }

    /// Starts building a service over `store`.
    pub fn builder(store: S) -> ServiceBuilder<S> {
        ServiceBuilder::new(store)
    }
}

impl<S: IdempotencyStore, L, D, M, Z> IdempotencyService<S, L, D, M, Z> {
    /// The store.
    pub fn store(&self) -> &S {
        &self.inner.store
    }

    /// The local (L1) cache.
    pub fn local_cache(&self) -> &L {
        &self.inner.local
    }

    /// The distributed (L2) cache.
    pub fn distributed_cache(&self) -> &D {
        &self.inner.distributed
    }

    /// The metrics sink.
    pub fn metrics(&self) -> &M {
        &self.inner.metrics
    }

    /// The result serializer (the builder's, or [`JsonSerializer`]): how an outcome becomes the
    /// stored text and back, for integrations that store outcomes of their own (the axum
    /// layer stores responses with it).
    ///
    /// ```
    /// use idempotency_core::{IdempotencyService, IdempotencyStore, ResultSerializer};
    /// # fn demo<S: IdempotencyStore>(service: &IdempotencyService<S>) {
    /// let text = service.serializer().serialize(&[1, 2]).unwrap();
    /// assert_eq!(text, "[1,2]");
    /// assert_eq!(service.serializer().deserialize::<Vec<u8>>(&text).unwrap(), [1, 2]);
    /// # }
    /// ```
    pub fn serializer(&self) -> &Z {
        &self.inner.serializer
    }

    /// The fingerprint strategy (the builder's, or JCS + SHA-256).
    pub fn fingerprint_strategy(&self) -> &dyn FingerprintStrategy {
        &*self.inner.fingerprint
    }

    /// The runtime settings.
    pub fn config(&self) -> &ServiceOptions {
        &self.inner.config
    }

    /// Begins a transaction on the store, for [`execute_in`](Self::execute_in).
    pub async fn begin(&self) -> Result<Tx<S>, StoreError> {
        Tx::begin(&self.inner.store).await
    }
}

impl<S, L, D, M, Z> Clone for IdempotencyService<S, L, D, M, Z> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<S, L, D, M, Z> fmt::Debug for IdempotencyService<S, L, D, M, Z> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyService")
            .field("store", &std::any::type_name::<S>())
            .field("local_cache", &std::any::type_name::<L>())
            .field("distributed_cache", &std::any::type_name::<D>())
            .field("fingerprint", &self.inner.fingerprint)
            .field("config", &self.inner.config)
            .finish()
    }
}
