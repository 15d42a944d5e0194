//! Opening a SQLite database the way the stores need it.

use std::str::FromStr;
use std::time::{Duration, Instant};

use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};

use crate::error::{Error, SQLITE_BUSY};

/// How long a transaction waits for SQLite's single write lock before failing with
/// `SQLITE_BUSY` (mapped to the retryable [`StoreError::LockTimeout`]).
///
/// On SQLite this is the wait budget of a concurrent duplicate: it waits at `BEGIN IMMEDIATE`,
/// not in `acquire`. The default matches the default in-flight wait (`10s`).
///
/// [`StoreError::LockTimeout`]: idempotency_core::StoreError::LockTimeout
pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// Begins every store transaction: it takes the write lock at once (waiting up to the busy
/// timeout), so writers are serialized at `begin` and never fail later on a lock upgrade.
pub(crate) const BEGIN_IMMEDIATE: &str = "BEGIN IMMEDIATE";

/// The connect options the stores recommend for `path_or_url`.
///
/// `path_or_url` is either a `sqlite:` URL (`sqlite://data/app.db`, `sqlite::memory:`,
/// `sqlite:file:x?mode=memory&cache=shared`) or a plain file path. The options:
///
/// - `create_if_missing`: the file is created on first use;
/// - `journal_mode = WAL`: readers do not block the writer and the writer does not block readers;
/// - `busy_timeout =` [`DEFAULT_BUSY_TIMEOUT`]: a writer waits for the lock instead of failing;
/// - `synchronous = FULL`: a commit that returned is on disk, even after a power loss (`NORMAL`
///   is faster and loses at most the last transactions on power loss, never consistency);
/// - `foreign_keys = ON`.
///
/// Tune them before connecting:
///
/// ```
/// # async fn demo() -> Result<(), idempotency_sqlite::Error> {
/// use std::time::Duration;
/// use idempotency_sqlite::{SqliteStore, connect_options};
/// use idempotency_core::config::PersistenceConfig;
///
/// let options = connect_options("data/app.db")?.busy_timeout(Duration::from_secs(30));
/// let store = SqliteStore::connect_with(options, &PersistenceConfig::default()).await?;
/// # Ok(()) }
/// ```
pub fn connect_options(path_or_url: &str) -> Result<SqliteConnectOptions, Error> {
    let options = if path_or_url.starts_with("sqlite:") {
        SqliteConnectOptions::from_str(path_or_url)?
    } else {
        SqliteConnectOptions::new().filename(path_or_url)
    };
    Ok(options
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(DEFAULT_BUSY_TIMEOUT)
        .synchronous(SqliteSynchronous::Full)
        .foreign_keys(true))
}

/// Opens a pool with sqlx's default pool settings.
///
/// Switching a new database to WAL takes an exclusive lock that SQLite's busy handler does not
/// wait for: when several processes (or pools) open a fresh file at once, all but one get
/// `SQLITE_BUSY` from the `journal_mode` pragma. Opening therefore retries `SQLITE_BUSY` with a
/// short backoff for up to [`DEFAULT_BUSY_TIMEOUT`]. (Once the file is in WAL mode, which is
/// persistent, new connections do not need that lock.)
pub(crate) async fn open(options: SqliteConnectOptions) -> Result<SqlitePool, Error> {
    let started = Instant::now();
    let mut pause = Duration::from_millis(5);
    loop {
        match SqlitePoolOptions::new().connect_with(options.clone()).await {
            Err(error) if is_busy(&error) && started.elapsed() < DEFAULT_BUSY_TIMEOUT => {
                tracing::debug!(error = %error, "database busy while opening; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(100));
            }
            result => return Ok(result?),
        }
    }
}

fn is_busy(error: &sqlx::Error) -> bool {
    matches!(
        error.as_database_error().and_then(|db| db.code()),
        Some(code) if code.parse::<i32>().is_ok_and(|code| code & 0xff == SQLITE_BUSY)
    )
}
