//! [`Settings`]: the whole configuration the facade assembles from, `idempotency.*` and
//! `outbox.*`, with unknown keys refused at every level.

use std::collections::BTreeMap;
use std::path::Path;

use idempotency_core::config::{
    AcquireConfig, CoreConfig, FingerprintConfig, InFlightConfig, OperationConfig,
    PersistenceConfig,
};
use serde::{Deserialize, Serialize};

use crate::load::{LoadError, Loader};

/// The configuration of [`Idempotency`](crate::Idempotency): the `idempotency` section and,
/// with the `outbox` feature, the `outbox` section. Every key is listed in the crate's
/// `CONFIGURATION.md`, with its default and the reference starter's name.
///
/// ```
/// let settings: idempotency::Settings = serde_json::from_value(serde_json::json!({
///     "idempotency": {
///         "persistence": { "ttl": "30d", "schema": { "mode": "create" } },
///         "operations": { "CREATE_PAYMENT": { "ttl": "7d" } }
///     }
/// }))?;
/// assert_eq!(settings.idempotency.persistence.table_name, "idempotency_records");
/// assert!(serde_json::from_value::<idempotency::Settings>(
///     serde_json::json!({ "idempotency": { "persistance": {} } })
/// ).is_err());
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct Settings {
    /// `idempotency.*`.
    pub idempotency: IdempotencyConfig,
    /// `outbox.*`: present, the outbox table is set up and (with `relay.enabled`) its relay
    /// runs; absent, there is no outbox.
    #[cfg(feature = "outbox")]
    #[cfg_attr(docsrs, doc(cfg(feature = "outbox")))]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outbox: Option<idempotency_outbox::config::OutboxConfig>,
}

impl Settings {
    /// Reads `file` (YAML; a missing file is an error) and then the environment, with the
    /// rules of [`Loader`]: `IDEMPOTENCY__PERSISTENCE__TTL=30d`,
    /// `IDEMPOTENCY__OPERATIONS__CREATE_PAYMENT__TTL=null`.
    pub fn load(file: impl AsRef<Path>) -> Result<Self, LoadError> {
        Loader::new().file(file.as_ref()).load()
    }

    /// Reads `file` and the environment once, giving the application's own top-level section
    /// `section` as `A` and the settings ([`Loader::load_with`]): one file for the whole
    /// service, each part refusing its own unknown keys.
    ///
    /// ```no_run
    /// #[derive(serde::Deserialize)]
    /// #[serde(deny_unknown_fields, rename_all = "kebab-case")]
    /// struct App { listen: String, database_url: String }
    ///
    /// let (app, settings) = idempotency::Settings::load_with::<App>("config/orders.yaml", "app")?;
    /// # Ok::<(), idempotency::LoadError>(())
    /// ```
    pub fn load_with<A: serde::de::DeserializeOwned>(
        file: impl AsRef<Path>,
        section: &str,
    ) -> Result<(A, Self), LoadError> {
        Loader::new().file(file.as_ref()).load_with(section)
    }
}

/// `idempotency.*`: the core's sections ([`CoreConfig`]) and the cache sections, which
/// belong to the cache crates, as one tree.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct IdempotencyConfig {
    /// Master switch: `false` runs every action without recording anything. Default `true`.
    pub enabled: bool,
    /// Request fingerprinting.
    pub fingerprint: FingerprintConfig,
    /// The L1 in-process cache (feature `moka`).
    #[cfg(feature = "moka")]
    #[cfg_attr(docsrs, doc(cfg(feature = "moka")))]
    pub local_cache: idempotency_cache_moka::LocalCacheConfig,
    /// The L2 shared cache (feature `redis`).
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    pub distributed_cache: idempotency_cache_redis::DistributedCacheConfig,
    /// The database store.
    pub persistence: PersistenceConfig,
    /// What a request does when the same key is in flight.
    pub in_flight: InFlightConfig,
    /// The acquire loop.
    pub acquire: AcquireConfig,
    /// Per-operation overrides, by operation name (case kept).
    pub operations: BTreeMap<String, OperationConfig>,
}

impl Default for IdempotencyConfig {
    fn default() -> Self {
        let core = CoreConfig::default();
        Self {
            enabled: core.enabled,
            fingerprint: core.fingerprint,
            #[cfg(feature = "moka")]
            local_cache: Default::default(),
            #[cfg(feature = "redis")]
            distributed_cache: Default::default(),
            persistence: core.persistence,
            in_flight: core.in_flight,
            acquire: core.acquire,
            operations: core.operations,
        }
    }
}

impl IdempotencyConfig {
    /// The core's part of the tree, as [`IdempotencyService`](idempotency_core::IdempotencyService)
    /// and the stores read it.
    pub fn core(&self) -> CoreConfig {
        CoreConfig {
            enabled: self.enabled,
            fingerprint: self.fingerprint.clone(),
            persistence: self.persistence.clone(),
            in_flight: self.in_flight.clone(),
            acquire: self.acquire.clone(),
            operations: self.operations.clone(),
        }
    }
}
