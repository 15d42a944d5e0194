//! The demo's configuration: a YAML file plus environment overrides.

use std::path::{Path, PathBuf};

use idempotency_core::config::IdempotencyConfig;
use idempotency_outbox::config::OutboxConfig;
use rust_decimal::Decimal;
use serde::Deserialize;

/// The whole configuration.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "kebab-case")]
pub struct DemoConfig {
    /// The HTTP server.
    pub server: ServerConfig,
    /// The business rules of the demo.
    pub demo: BusinessConfig,
    /// The `idempotency.*` properties, named as in the reference starter.
    pub idempotency: IdempotencyConfig,
    /// The outbox and its relay.
    pub outbox: OutboxConfig,
}

/// `server.*`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct ServerConfig {
    /// Listening port. Default 8080.
    pub port: u16,
    /// Larger request bodies get 413. Default 16 KiB.
    pub max_body_bytes: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            port: 8080,
            max_body_bytes: 16 * 1024,
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
    /// The SQLite file used when `DATABASE_URL` is not set. Default `data/demo.db`.
    pub sqlite_path: PathBuf,
}

impl Default for BusinessConfig {
    fn default() -> Self {
        Self {
            available_balance: Decimal::new(100_000, 2),
            refund_limit: Decimal::new(50_000, 2),
            sqlite_path: PathBuf::from("data/demo.db"),
        }
    }
}

/// The configuration could not be read.
#[derive(Debug, thiserror::Error)]
#[error("invalid demo configuration")]
pub struct ConfigError(#[from] config::ConfigError);

impl DemoConfig {
    /// Reads `file` (YAML) when it exists, then the environment: `SECTION__KEY__SUB_KEY=value`,
    /// where `_` inside a key stands for `-` (`IDEMPOTENCY__PERSISTENCE__LOOKUP_BEFORE_ACQUIRE`).
    pub fn load(file: &Path) -> Result<Self, ConfigError> {
        let mut builder =
            config::Config::builder().add_source(config::File::from(file).required(false));
        // Only variables of the four sections are read, never the whole environment.
        for section in ["SERVER", "DEMO", "IDEMPOTENCY", "OUTBOX"] {
            builder = builder.add_source(
                config::Environment::with_prefix(section)
                    .prefix_separator("__")
                    .separator("__")
                    .keep_prefix(true)
                    .convert_case(config::Case::Kebab),
            );
        }
        let settings = builder.build()?;
        Ok(settings.try_deserialize()?)
    }
}
