//! [`ServiceBuilder`]: assembles an [`IdempotencyService`] from its parts.

use std::fmt;
use std::sync::Arc;

use super::{IdempotencyService, Inner, ServiceOptions};
use crate::cache::{DistributedCache, LocalCache, NoCache};
use crate::fingerprint::{FingerprintStrategy, JcsFingerprint};
use crate::metrics::{IdempotencyMetrics, NoopMetrics};
use crate::serializer::{JsonSerializer, ResultSerializer};
use crate::store::IdempotencyStore;

/// Builds an [`IdempotencyService`]; every part but the store is optional.
///
/// ```no_run
/// # fn demo<S: idempotency_core::IdempotencyStore + Clone>(store: S) {
/// use idempotency_core::config::CoreConfig;
/// use idempotency_core::{HashAlgorithm, IdempotencyService, JcsFingerprint, ServiceOptions};
///
/// let config = CoreConfig::default();
/// // Settings and fingerprint from the configuration:
/// let service = IdempotencyService::builder(store.clone()).configure(&config).build();
/// // Or part by part:
/// let service = IdempotencyService::builder(store)
///     .config(ServiceOptions::from(&config))
///     .fingerprint(JcsFingerprint::new(HashAlgorithm::Sha512))
///     .build();
/// # }
/// ```
pub struct ServiceBuilder<S, L = NoCache, D = NoCache, M = NoopMetrics, Z = JsonSerializer> {
    store: S,
    local: L,
    distributed: D,
    metrics: M,
    serializer: Z,
    fingerprint: Box<dyn FingerprintStrategy>,
    config: ServiceOptions,
}

impl<S: IdempotencyStore> ServiceBuilder<S> {
    /// A builder with defaults: no caches, no metrics, JSON results, JCS + SHA-256 fingerprints.
    pub fn new(store: S) -> Self {
        Self {
            store,
            local: NoCache,
            distributed: NoCache,
            metrics: NoopMetrics,
            serializer: JsonSerializer,
            fingerprint: Box::new(JcsFingerprint::default()),
            config: ServiceOptions::default(),
        }
    }
}

impl<S, L, D, M, Z> ServiceBuilder<S, L, D, M, Z>
where
    S: IdempotencyStore,
    L: LocalCache,
    D: DistributedCache,
    M: IdempotencyMetrics,
    Z: ResultSerializer,
{
    /// Sets the runtime settings.
    pub fn config(mut self, config: ServiceOptions) -> Self {
        self.config = config;
        self
    }

    /// Applies the `idempotency` section: the runtime settings ([`ServiceOptions::from`]) and
    /// the fingerprint strategy of `fingerprint.*` ([`FingerprintConfig::strategy`]).
    ///
    /// [`FingerprintConfig::strategy`]: crate::config::FingerprintConfig::strategy
    pub fn configure(self, config: &crate::config::CoreConfig) -> Self {
        self.config(ServiceOptions::from(config))
            .fingerprint(config.fingerprint.strategy())
    }

    /// Replaces the fingerprint strategy.
    pub fn fingerprint(mut self, strategy: impl FingerprintStrategy) -> Self {
        self.fingerprint = Box::new(strategy);
        self
    }

    /// Adds the L1 cache.
    pub fn local_cache<L2: LocalCache>(self, local: L2) -> ServiceBuilder<S, L2, D, M, Z> {
        ServiceBuilder {
            store: self.store,
            local,
            distributed: self.distributed,
            metrics: self.metrics,
            serializer: self.serializer,
            fingerprint: self.fingerprint,
            config: self.config,
        }
    }

    /// Adds the L2 cache.
    pub fn distributed_cache<D2: DistributedCache>(
        self,
        distributed: D2,
    ) -> ServiceBuilder<S, L, D2, M, Z> {
        ServiceBuilder {
            store: self.store,
            local: self.local,
            distributed,
            metrics: self.metrics,
            serializer: self.serializer,
            fingerprint: self.fingerprint,
            config: self.config,
        }
    }

    /// Sets the metrics sink.
    pub fn metrics<M2: IdempotencyMetrics>(self, metrics: M2) -> ServiceBuilder<S, L, D, M2, Z> {
        ServiceBuilder {
            store: self.store,
            local: self.local,
            distributed: self.distributed,
            metrics,
            serializer: self.serializer,
            fingerprint: self.fingerprint,
            config: self.config,
        }
    }

    /// Replaces the result serializer.
    pub fn serializer<Z2: ResultSerializer>(
        self,
        serializer: Z2,
    ) -> ServiceBuilder<S, L, D, M, Z2> {
        ServiceBuilder {
            store: self.store,
            local: self.local,
            distributed: self.distributed,
            metrics: self.metrics,
            serializer,
            fingerprint: self.fingerprint,
            config: self.config,
        }
    }

    /// Builds the service.
    pub fn build(self) -> IdempotencyService<S, L, D, M, Z> {
        IdempotencyService {
            inner: Arc::new(Inner {
                store: self.store,
                local: self.local,
                distributed: self.distributed,
                metrics: self.metrics,
                serializer: self.serializer,
                fingerprint: self.fingerprint,
                config: self.config,
            }),
        }
    }
}

impl<S, L, D, M, Z> fmt::Debug for ServiceBuilder<S, L, D, M, Z> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServiceBuilder")
            .field("fingerprint", &self.fingerprint)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}
