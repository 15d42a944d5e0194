//! The service's configuration and the database it names, as the commands need them.

use std::path::Path;
use std::time::Duration;

use idempotency::core::redact_url;
use idempotency::outbox::config::OutboxConfig;
use idempotency::{IdempotencyConfig, Loader, Settings};
use serde::Deserialize;

use crate::error::CliError;

/// How long connecting may take before the database counts as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The sections of the service's configuration the tool reads. Unlike [`Settings`] it lets
/// other top-level sections be (`server`, `database`, the service's own): the tool reads the
/// service's file as it is. Inside the two sections unknown keys are refused, as the service
/// refuses them.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "kebab-case")]
struct ServiceOptions {
    idempotency: IdempotencyConfig,
    outbox: Option<OutboxConfig>,
}

/// Reads `file` (when given) and the environment with the service's rules.
pub(crate) fn settings(file: Option<&Path>) -> Result<Settings, CliError> {
    let mut loader = Loader::new();
    if let Some(file) = file {
        if !file.exists() {
            return Err(CliError::Usage(format!(
                "--config {}: no such file",
                file.display()
            )));
        }
        loader = loader.file(file);
    }
    let config: ServiceOptions = loader
        .load()
        .map_err(|e| CliError::Usage(crate::error::chain(&e)))?;
    Ok(Settings {
        idempotency: config.idempotency,
        outbox: config.outbox,
    })
}

/// Which database a URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backend {
    Postgres,
    Sqlite,
    Mysql,
}

impl Backend {
    pub(crate) fn of(url: &str) -> Result<Self, CliError> {
        let scheme = url.split(':').next().unwrap_or_default();
        match scheme {
            "postgres" | "postgresql" => Ok(Self::Postgres),
            "sqlite" => Ok(Self::Sqlite),
            "mysql" | "mariadb" => Ok(Self::Mysql),
            // The URL as `redact_url` shows it, and no scheme of our own: text before a `:` that
            // is not a scheme may be a secret (`secret@host:5432`).
            _ => Err(CliError::Usage(format!(
                "--database-url {}: unknown scheme; expected postgres://, sqlite:, mysql:// or \
                 mariadb://",
                redact_url(url)
            ))),
        }
    }
}

fn unreachable(url: &str, error: &dyn std::error::Error) -> CliError {
    CliError::Unreachable {
        url: redact_url(url),
        reason: crate::error::chain(error),
    }
}

pub(crate) async fn postgres(url: &str) -> Result<sqlx::PgPool, CliError> {
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(CONNECT_TIMEOUT)
        .connect(url)
        .await
        .map_err(|e| unreachable(url, &e))
}

pub(crate) async fn mysql(url: &str) -> Result<sqlx::MySqlPool, CliError> {
    let url_ = url.replacen("mariadb://", "mysql://", 1);
    sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(CONNECT_TIMEOUT)
        .connect(&url_)
        .await
        .map_err(|e| unreachable(url, &e))
}

/// A SQLite pool; the file must exist unless `create` (only `schema apply` creates it).
pub(crate) async fn sqlite(url: &str, create: bool) -> Result<sqlx::SqlitePool, CliError> {
    let options = idempotency::sqlite::connect_options(url)
        .map_err(|e| {
            CliError::Usage(format!(
                "--database-url {}: {}",
                redact_url(url),
                crate::error::chain(&e)
            ))
        })?
        .create_if_missing(create);
    idempotency::sqlite::open_pool(options)
        .await
        .map_err(|e| unreachable(url, &e))
}

use idempotency::sqlx;
