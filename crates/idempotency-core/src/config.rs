//! Configuration types mirroring the `idempotency.*` properties the service and the stores read,
//! with the same names and defaults. The cache sections live with their caches:
//! `idempotency.local-cache` is `idempotency_cache_moka::LocalCacheConfig`,
//! `idempotency.distributed-cache` is `idempotency_cache_redis::DistributedCacheConfig`; an
//! application (or the facade) composes the whole `idempotency` tree from them.
//!
//! They deserialize from any serde format (the `config` crate, YAML, TOML, environment) with
//! kebab-case keys and human-readable durations (`50ms`, `10m`, `365d`, via `humantime`).
//!
//! ```
//! use idempotency_core::config::CoreConfig;
//!
//! let config: CoreConfig = serde_json::from_value(serde_json::json!({
//!     "persistence": { "ttl": "30d", "table-name": "billing.idempotency_records" },
//!     "in-flight": { "policy": "reject" },
//!     "operations": { "CREATE_PAYMENT": { "ttl": "7d" } }
//! }))?;
//! assert!(config.enabled);
//! assert_eq!(config.persistence.table_name, "billing.idempotency_records");
//! # Ok::<(), serde_json::Error>(())
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::fingerprint::HashAlgorithm;

const DAY: u64 = 24 * 60 * 60;

/// The `idempotency` section without the cache sections (`local-cache`, `distributed-cache`),
/// which belong to the cache crates.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct CoreConfig {
    /// Master switch. When `false`, `execute` runs the action without recording anything.
    pub enabled: bool,
    /// Request fingerprinting.
    pub fingerprint: FingerprintConfig,
    /// The database store.
    pub persistence: PersistenceConfig,
    /// What a request does when the same key is being processed by another one.
    pub in_flight: InFlightConfig,
    /// The acquire loop.
    pub acquire: AcquireConfig,
    /// Per-operation overrides, by operation name.
    pub operations: BTreeMap<String, OperationConfig>,
}

impl Default for CoreConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            fingerprint: FingerprintConfig::default(),
            persistence: PersistenceConfig::default(),
            in_flight: InFlightConfig::default(),
            acquire: AcquireConfig::default(),
            operations: BTreeMap::new(),
        }
    }
}

/// `idempotency.fingerprint`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct FingerprintConfig {
    /// Digest of the canonical JSON: `SHA-256` (default), `SHA-384` or `SHA-512`.
    pub algorithm: HashAlgorithm,
    /// While changing `algorithm`: the one used before, still accepted when a retry of an
    /// existing key is compared with its record (new records get `algorithm`). Keep it for the
    /// longest record TTL, then remove it. Default `null`.
    pub previous_algorithm: Option<HashAlgorithm>,
}

impl FingerprintConfig {
    /// The fingerprint strategy this section describes.
    pub fn strategy(&self) -> crate::JcsFingerprint {
        let strategy = crate::JcsFingerprint::new(self.algorithm);
        match self.previous_algorithm {
            Some(previous) => strategy.accepting(previous),
            None => strategy,
        }
    }
}

/// `idempotency.persistence`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct PersistenceConfig {
    /// Whether the application wires the built-in database store. Default `true`.
    pub enabled: bool,
    /// Table name, optionally schema-qualified (`billing.idempotency_records`).
    /// Default `idempotency_records`.
    pub table_name: String,
    /// Default record lifetime: sets `expires_at`, the cleanup marker. `null` keeps records
    /// forever; `0` (every record born expired) is refused by the `idempotency` facade.
    /// Default `24h`: longer than any client's retry window, short enough that the table holds
    /// one day of keys (the reference starter's `365d` keeps a year; set it to keep that).
    #[serde(with = "humantime_serde")]
    pub ttl: Option<Duration>,
    /// Look the key up before inserting it. Default `false` (insert first).
    pub lookup_before_acquire: bool,
    /// Schema management at startup.
    pub schema: SchemaConfig,
    /// The expired-record cleanup job.
    pub cleanup: CleanupConfig,
    /// What stands between the pool and the database: `none` (default: direct connections,
    /// or a pooler in session mode) or `transaction` (PgBouncer's `pool_mode = transaction`;
    /// PostgreSQL only). See [`Pooler`].
    pub pooler: Pooler,
}

impl Default for PersistenceConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            table_name: "idempotency_records".to_owned(),
            ttl: Some(Duration::from_secs(DAY)),
            lookup_before_acquire: false,
            schema: SchemaConfig::default(),
            cleanup: CleanupConfig::default(),
            pooler: Pooler::None,
        }
    }
}

/// `idempotency.persistence.pooler`: what stands between the pool's connections and the
/// database server.
///
/// A pooler in transaction mode (PgBouncer's `pool_mode = transaction`) hands each
/// transaction, and each statement outside one, to whichever server connection is free: a
/// client's session is not kept from one transaction to the next. What a store keeps in a
/// session then breaks: named prepared statements (sqlx prepares and caches every statement
/// by name per connection: `prepared statement "sqlx_s_1" already exists`, or does not exist),
/// an unnamed statement outside a transaction (sqlx parses it and binds it in two exchanges,
/// which the pooler may send to two server connections), `LISTEN`, session `SET`s and advisory
/// locks. `transaction` makes the PostgreSQL stores use unnamed statements, run every
/// statement inside a transaction, and never `LISTEN` through the pool.
///
/// ```
/// use idempotency_core::config::{PersistenceConfig, Pooler};
///
/// let config: PersistenceConfig = serde_json::from_value(serde_json::json!({ "pooler": "transaction" }))?;
/// assert_eq!(config.pooler, Pooler::Transaction);
/// assert_eq!(PersistenceConfig::default().pooler, Pooler::None);
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Pooler {
    /// Direct connections, or a pooler that keeps a server connection per client connection
    /// (PgBouncer's `pool_mode = session`). Prepared statements are named and cached.
    #[default]
    None,
    /// A pooler in transaction mode (PgBouncer's `pool_mode = transaction`). PostgreSQL
    /// only: the SQLite and MySQL stores refuse it.
    Transaction,
}

/// `idempotency.persistence.schema`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct SchemaConfig {
    /// `create`, `validate` (default) or `none`.
    pub mode: SchemaMode,
}

/// What a store does with its schema at startup.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SchemaMode {
    /// Run the canonical DDL (idempotent). Convenient for development and demos.
    Create,
    /// Check that the table matches what the store needs, and fail naming what differs.
    /// Recommended in production, with the DDL applied by migrations.
    #[default]
    Validate,
    /// Do nothing.
    None,
}

/// `idempotency.persistence.cleanup`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct CleanupConfig {
    /// Run the cleanup job. Default `true`, so the table stays bounded by the TTL times the rate
    /// of new keys; the job deletes in short batches with `SKIP LOCKED`, so every instance may
    /// run it.
    pub enabled: bool,
    /// When to run: a cron expression, with optional seconds; a day must match both the
    /// day-of-month and the day-of-week fields, as in Spring. Default `0 0 * * * *` (hourly;
    /// the reference starter's `0 0 3 * * SAT,SUN` lets a week of expired keys pile up).
    pub cron: String,
    /// Rows per delete batch (one short transaction each). Default `1000`.
    pub batch_size: u32,
    /// The time zone `cron` is evaluated in: an IANA name (`Europe/Berlin`) or `UTC`.
    /// Default `UTC` (the reference starter uses the server's zone; name it here to match).
    pub zone: String,
}

impl Default for CleanupConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            cron: "0 0 * * * *".to_owned(),
            batch_size: 1000,
            zone: "UTC".to_owned(),
        }
    }
}

/// `idempotency.in-flight`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct InFlightConfig {
    /// `wait` (default) or `reject`. A store without a per-key wait (SQLite, where a duplicate
    /// waits for the one write lock up to the busy timeout) cannot honour it: the `idempotency`
    /// facade refuses it there when set.
    pub policy: InFlightPolicyKind,
    /// With `wait`: how long to wait for the holder before answering `InFlight`; `null` waits
    /// until the holder finishes, each waiter holding a pooled connection. Default `10s`.
    /// Nothing reads it under `reject`, nor on SQLite: the `idempotency` facade refuses it
    /// there when set.
    #[serde(with = "humantime_serde")]
    pub timeout: Option<Duration>,
}

impl Default for InFlightConfig {
    fn default() -> Self {
        Self {
            policy: InFlightPolicyKind::Wait,
            timeout: Some(Duration::from_secs(10)),
        }
    }
}

/// The in-flight policy, as configured.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InFlightPolicyKind {
    /// Wait for the holder to finish, then replay its outcome.
    #[default]
    Wait,
    /// Answer `InFlight` at once.
    Reject,
}

/// `idempotency.acquire`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct AcquireConfig {
    /// Insert-then-find rounds before giving up with `AcquireExhausted`. Default `3`.
    pub max_attempts: u32,
}

impl Default for AcquireConfig {
    fn default() -> Self {
        Self { max_attempts: 3 }
    }
}

/// `idempotency.operations.<NAME>`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct OperationConfig {
    /// Record lifetime for this operation, overriding `persistence.ttl`: absent (`None`) keeps
    /// `persistence.ttl`, `null` (`Some(None)`) keeps this operation's records forever, a
    /// duration (`Some(Some(_))`) sets it.
    #[serde(with = "nullable_duration", skip_serializing_if = "Option::is_none")]
    pub ttl: Option<Option<Duration>>,
}

/// A duration that may be absent (`None`), `null` (`Some(None)`) or set.
mod nullable_duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub(super) fn serialize<S: Serializer>(
        value: &Option<Option<Duration>>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        value
            .flatten()
            .map(humantime_serde::Serde::from)
            .serialize(serializer)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Option<Duration>>, D::Error> {
        Option::<humantime_serde::Serde<Duration>>::deserialize(deserializer)
            .map(|value| Some(value.map(humantime_serde::Serde::into_inner)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_production_safe_and_otherwise_match_the_reference() {
        let config: CoreConfig = serde_json::from_str("{}").unwrap();
        assert_eq!(config, CoreConfig::default());
        assert!(config.enabled);
        assert_eq!(config.fingerprint.algorithm, HashAlgorithm::Sha256);
        assert_eq!(config.persistence.table_name, "idempotency_records");
        // Not the reference starter's `365d` with cleanup off: a table that only grows.
        assert_eq!(config.persistence.ttl, Some(Duration::from_secs(DAY)));
        assert!(!config.persistence.lookup_before_acquire);
        assert_eq!(config.persistence.schema.mode, SchemaMode::Validate);
        assert!(config.persistence.cleanup.enabled);
        assert_eq!(config.persistence.cleanup.cron, "0 0 * * * *");
        assert_eq!(config.persistence.cleanup.batch_size, 1000);
    }

    #[test]
    fn reference_yaml_names_parse() {
        let config: CoreConfig = serde_json::from_value(serde_json::json!({
            "enabled": false,
            "fingerprint": {"algorithm": "SHA-512"},
            "persistence": {"ttl": null, "lookup-before-acquire": true, "schema": {"mode": "create"},
                            "cleanup": {"enabled": true, "cron": "*/5 * * * * *", "batch-size": 10}},
            "in-flight": {"policy": "reject", "timeout": "200ms"},
            "acquire": {"max-attempts": 7},
            "operations": {"OP": {"ttl": "365d"}}
        }))
        .unwrap();
        assert!(!config.enabled);
        assert_eq!(config.fingerprint.algorithm, HashAlgorithm::Sha512);
        assert_eq!(config.persistence.ttl, None);
        assert_eq!(config.persistence.schema.mode, SchemaMode::Create);
        assert_eq!(config.in_flight.policy, InFlightPolicyKind::Reject);
        assert_eq!(config.acquire.max_attempts, 7);
        assert_eq!(
            config.operations["OP"].ttl,
            Some(Some(Duration::from_secs(365 * DAY)))
        );
    }

    #[test]
    fn an_operation_ttl_is_absent_null_or_set() {
        let config: CoreConfig = serde_json::from_value(serde_json::json!({
            "operations": {"KEEP": {}, "FOREVER": {"ttl": null}, "WEEK": {"ttl": "7d"}}
        }))
        .unwrap();
        assert_eq!(config.operations["KEEP"].ttl, None);
        assert_eq!(config.operations["FOREVER"].ttl, Some(None));
        assert_eq!(
            config.operations["WEEK"].ttl,
            Some(Some(Duration::from_secs(7 * DAY)))
        );
        let round_trip: CoreConfig =
            serde_json::from_value(serde_json::to_value(&config).unwrap()).unwrap();
        assert_eq!(round_trip, config);
    }

    #[test]
    fn unknown_keys_and_bad_durations_are_errors() {
        assert!(serde_json::from_str::<CoreConfig>(r#"{"enabeld": true}"#).is_err());
        assert!(
            serde_json::from_str::<CoreConfig>(r#"{"persistence": {"ttl": "ten days"}}"#).is_err()
        );
    }
}
