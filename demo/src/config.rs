//! The demo's configuration: a YAML file plus environment overrides.

use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::time::Duration;

use idempotency::{IdempotencyConfig, Loader, Settings};
use idempotency_outbox::config::OutboxConfig;
use rust_decimal::Decimal;
use serde::Deserialize;

/// The whole configuration; unknown keys are refused at every level, the top one included.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct DemoConfig {
    /// The HTTP server.
    pub server: ServerConfig,
    /// The database pool (PostgreSQL or MySQL, when `DATABASE_URL` or `MYSQL_URL` is set).
    pub database: DatabaseConfig,
    /// The business rules of the demo.
    pub demo: BusinessConfig,
    /// The `idempotency.*` properties, named as in the reference starter.
    pub idempotency: IdempotencyConfig,
    /// The outbox and its relay.
    pub outbox: OutboxConfig,
    /// The admin page and API under `/admin`.
    pub admin: AdminConfig,
}

/// `admin.*`: the facade's admin router under `/admin` (`idempotency::admin`).
#[derive(Clone, Default, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct AdminConfig {
    /// The bearer token `/admin` asks for (`Authorization: Bearer <token>`), at least 16
    /// characters. Unset (the default): `/admin` is not mounted. Give it through
    /// `ADMIN__TOKEN`, never in a file in the repository.
    pub token: Option<String>,
    /// Whether the admin router changes anything (requeue, discard, evict, purge, partitions,
    /// cleanup). Default `false`: reads only.
    pub allow_mutations: bool,
}

impl std::fmt::Debug for AdminConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminConfig")
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("allow_mutations", &self.allow_mutations)
            .finish()
    }
}

/// `server.*`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct ServerConfig {
    /// The address to listen on. Default `127.0.0.1`: the demo trusts `X-Tenant-Id` from any
    /// client and serves `/metrics` and `/health` on the same port, so it is reachable from
    /// this machine only unless this says otherwise (`SERVER__HOST=0.0.0.0`, behind a gateway
    /// that strips `X-Tenant-Id`; see SECURITY.md).
    pub host: std::net::IpAddr,
    /// Listening port. Default 8080.
    pub port: u16,
    /// Larger request bodies get 413. Default 16 KiB.
    pub max_body_bytes: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            host: std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
            port: 8080,
            max_body_bytes: 16 * 1024,
        }
    }
}

/// `database.*`: the PostgreSQL connection pool.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct DatabaseConfig {
    /// Connections in the pool (at least 1). Default 20.
    pub max_connections: NonZeroU32,
    /// How long a request waits for a pooled connection before it fails with 503
    /// `store-unavailable`; also bounds how long requests hang while the database is down.
    /// Default 5 s.
    #[serde(with = "humantime_serde")]
    pub acquire_timeout: Duration,
    /// A pooled connection is tested (pinged) before a request gets it only when it sat idle
    /// this long; one in steady use is not, which spares a round trip per transaction
    /// (`idempotency::pool::TestWhenIdle`). `0s` tests every checkout. Default 10 s.
    #[serde(with = "humantime_serde")]
    pub test_after_idle: Duration,
}

impl Default for DatabaseConfig {
    fn default() -> Self {
        Self {
            max_connections: NonZeroU32::MIN.saturating_add(19),
            acquire_timeout: Duration::from_secs(5),
            test_after_idle: idempotency::pool::TEST_AFTER_IDLE,
        }
    }
}

/// `demo.*`: the business rules.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct BusinessConfig {
    /// Payments above it are rejected with `INSUFFICIENT_FUNDS`. Default 1000.00.
    pub available_balance: Decimal,
    /// Refunds above it are rejected with `REFUND_LIMIT_EXCEEDED`. Default 500.00.
    pub refund_limit: Decimal,
    /// The SQLite file used when neither `DATABASE_URL` nor `MYSQL_URL` is set. Default
    /// `data/demo.db`.
    pub sqlite_path: PathBuf,
    /// How often the reconciliation query counts charges without their `ChargeCreated` event
    /// (the `demo_charges_without_event` gauge). Default `1m`.
    #[serde(with = "humantime_serde")]
    pub reconcile_interval: Duration,
}

impl Default for BusinessConfig {
    fn default() -> Self {
        Self {
            available_balance: Decimal::new(100_000, 2),
            refund_limit: Decimal::new(50_000, 2),
            sqlite_path: PathBuf::from("data/demo.db"),
            reconcile_interval: Duration::from_secs(60),
        }
    }
}

/// The configuration could not be read, or holds a value the demo cannot run with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file or the environment could not be read.
    #[error("invalid demo configuration")]
    Load(#[from] idempotency::LoadError),
    /// A value the demo cannot run with, named.
    #[error("invalid demo configuration: {0}")]
    Invalid(String),
}

impl DemoConfig {
    /// Reads `file` (YAML) when it exists, then the environment with the facade's rules
    /// ([`Loader`]): `SECTION__KEY__SUB_KEY=value`, `_` inside a key standing for `-`
    /// (`IDEMPOTENCY__PERSISTENCE__LOOKUP_BEFORE_ACQUIRE`), operation names kept as written
    /// (`IDEMPOTENCY__OPERATIONS__CREATE_PAYMENT__TTL`), `null` for null. Only variables of the
    /// six sections are read (`DATABASE_URL` has no `__`, so it is no key of `database`).
    pub fn load(file: &Path) -> Result<Self, ConfigError> {
        Self::loader(file, false)
    }

    /// [`load`](Self::load) of a file that must exist (the one `DEMO_CONFIG` names: a path
    /// with a typo must not start the demo on the defaults).
    pub fn load_required(file: &Path) -> Result<Self, ConfigError> {
        Self::loader(file, true)
    }

    fn loader(file: &Path, required: bool) -> Result<Self, ConfigError> {
        let loader = if required {
            Loader::new().file(file)
        } else {
            Loader::new().optional_file(file)
        };
        let config: Self = loader
            .section("server")
            .section("database")
            .section("demo")
            .section("admin")
            .load()?;
        if config.demo.reconcile_interval.is_zero() {
            return Err(ConfigError::Invalid(
                "demo.reconcile-interval must be longer than 0s".to_owned(),
            ));
        }
        Ok(config)
    }

    /// What the facade assembles from: `idempotency` and `outbox`.
    pub fn settings(&self) -> Settings {
        Settings {
            idempotency: self.idempotency.clone(),
            outbox: Some(self.outbox.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn load(yaml: &str) -> Result<DemoConfig, ConfigError> {
        let dir = std::env::temp_dir().join(format!(
            "idempotency-demo-config-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("demo.yaml");
        std::fs::write(&file, yaml).unwrap();
        let loaded = DemoConfig::load(&file);
        std::fs::remove_dir_all(&dir).unwrap();
        loaded
    }

    #[test]
    fn the_shipped_file_loads() {
        let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/demo.yaml");
        let config = DemoConfig::load(&file).unwrap();
        assert_eq!(config.database.max_connections.get(), 20);
        assert_eq!(config.database.acquire_timeout, Duration::from_secs(5));
        assert_eq!(config.database.test_after_idle, Duration::from_secs(10));
        assert_eq!(config.demo.available_balance, Decimal::new(100_000, 2));
    }

    #[test]
    fn the_pool_is_configurable() {
        let config = load(
            "database:\n  max-connections: 7\n  acquire-timeout: 750ms\n  test-after-idle: 0s\n",
        )
        .unwrap();
        assert_eq!(config.database.max_connections.get(), 7);
        assert_eq!(config.database.acquire_timeout, Duration::from_millis(750));
        assert_eq!(config.database.test_after_idle, Duration::ZERO);
        assert_eq!(
            config.server.port, 8080,
            "other sections keep their defaults"
        );
    }

    /// Issue 53: the demo trusts `X-Tenant-Id` and serves `/metrics` on its API port, so it
    /// listens on loopback unless told otherwise (it bound `0.0.0.0`).
    #[test]
    fn the_demo_listens_on_loopback_unless_told_otherwise() {
        let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/demo.yaml");
        assert!(DemoConfig::load(&file).unwrap().server.host.is_loopback());
        let open = load("server:\n  host: 0.0.0.0\n").unwrap();
        assert!(open.server.host.is_unspecified());
    }

    #[test]
    fn unknown_keys_and_bad_durations_are_errors() {
        assert!(load("database:\n  max-conections: 7\n").is_err());
        assert!(load("database:\n  max-connections: 0\n").is_err());
        assert!(load("database:\n  acquire-timeout: soon\n").is_err());
        assert!(load("server:\n  prot: 1\n").is_err());
        assert!(
            load("sever:\n  port: 1\n").is_err(),
            "a misspelled section is refused"
        );
    }

    /// `demo.reconcile-interval: 0s` is refused at load, naming the key (before: taken, and
    /// the reconciliation task panicked at its first tick, so `demo_charges_without_event` was
    /// never exported).
    #[test]
    fn a_zero_reconcile_interval_is_refused() {
        let error = load("demo:\n  reconcile-interval: 0s\n").unwrap_err();
        assert!(
            error.to_string().contains("demo.reconcile-interval"),
            "{error}"
        );
        assert!(load("demo:\n  reconcile-interval: 1s\n").is_ok());
    }

    /// The file `DEMO_CONFIG` names must exist (before: a path with a typo started the demo
    /// on the library's defaults); the default file may be missing.
    #[test]
    fn a_required_file_that_is_missing_is_an_error() {
        let missing = std::env::temp_dir().join("idempotency-demo-no-such-config.yaml");
        assert!(DemoConfig::load_required(&missing).is_err());
        assert!(DemoConfig::load(&missing).is_ok());
    }
}
