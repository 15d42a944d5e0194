//! Opening a SQLite database the way the stores need it.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::{Duration, Instant};

use sqlx::sqlite::SqliteTransactionManager;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{SqliteConnection, SqlitePool};
use sqlx_core::transaction::TransactionManager;

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
/// `sqlite:file:x?mode=memory&cache=shared`) or a plain file path. A plain path that SQLite
/// would not take as a file name is refused with [`Error::InvalidPath`]: one starting with
/// `file:` (SQLite reads it as a URI, so `file:x.db?mode=memory` would give every pooled
/// connection a database of its own) and `:memory:` (the same); write them as `sqlite:` URLs.
/// The options:
///
/// - `create_if_missing`: the file is created on first use;
/// - `journal_mode = WAL`: readers do not block the writer and the writer does not block readers;
/// - `busy_timeout =` [`DEFAULT_BUSY_TIMEOUT`]: a writer waits for the lock instead of failing;
/// - `synchronous = FULL`: a commit that returned is on disk, even after a power loss (`NORMAL`
///   is faster and loses at most the last transactions on power loss, never consistency);
/// - `foreign_keys = ON`;
/// - `journal_size_limit =` [`JOURNAL_SIZE_LIMIT`] (64 MiB): the WAL file grows while readers
///   keep a checkpoint from reaching its end (a cleanup purging millions of rows under load
///   can take it past a gigabyte); without a limit it keeps that size for good, with it each
///   checkpoint that restarts the WAL truncates the file to the limit. (SQLite's default
///   `wal_autocheckpoint` of 1000 pages stays.)
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
        check_plain_path(path_or_url)?;
        SqliteConnectOptions::new().filename(path_or_url)
    };
    Ok(options
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(DEFAULT_BUSY_TIMEOUT)
        .synchronous(SqliteSynchronous::Full)
        .foreign_keys(true)
        .pragma("journal_size_limit", JOURNAL_SIZE_LIMIT.to_string()))
}

/// The `journal_size_limit` [`connect_options`] sets, in bytes: what a WAL file is truncated
/// to whenever a checkpoint restarts it.
pub const JOURNAL_SIZE_LIMIT: u64 = 64 * 1024 * 1024;

/// Closes `pool` at shutdown: first a `wal_checkpoint(TRUNCATE)` (every committed page copied
/// into the database file, the WAL file emptied), then [`SqlitePool::close`], which waits for
/// the connections in use to come back. The next start then finds a small WAL to recover, and
/// a copy of the database file alone (a backup taken while stopped) is complete.
///
/// A checkpoint that cannot finish because another process still reads is not an error (the
/// WAL stays for that process to checkpoint); an I/O error is.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = std::env::temp_dir().join(format!("idempotency-sqlite-close-doc-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir)?;
/// # let path = dir.join("app.db");
/// let pool = idempotency_sqlite::open_pool(idempotency_sqlite::connect_options(
///     path.to_str().ok_or("path")?,
/// )?)
/// .await?;
/// sqlx::query("CREATE TABLE t (x INTEGER)").execute(&pool).await?;
/// idempotency_sqlite::close_pool(&pool).await?;
/// assert!(pool.is_closed());
/// # let _ = std::fs::remove_dir_all(&dir);
/// # Ok(()) }
/// ```
pub async fn close_pool(pool: &SqlitePool) -> Result<(), Error> {
    let (busy, log, checkpointed): (i64, i64, i64) =
        sqlx::query_as("PRAGMA wal_checkpoint(TRUNCATE)")
            .fetch_one(pool)
            .await?;
    if busy != 0 {
        tracing::info!(
            log,
            checkpointed,
            "the final checkpoint could not empty the WAL: another connection reads"
        );
    }
    pool.close().await;
    Ok(())
}

/// Refuses a plain path that SQLite would read as something else than a file name.
fn check_plain_path(path: &str) -> Result<(), Error> {
    let reason = if is_uri(path) {
        "SQLite reads a path starting with `file:` as a URI (with `?mode=memory`, every pooled \
         connection would get an empty database of its own); write a file path, or a `sqlite:` \
         URL such as `sqlite:file:x?mode=memory&cache=shared`"
    } else if path == ":memory:" {
        "`:memory:` would give every pooled connection an empty database of its own; write \
         `sqlite::memory:`"
    } else if path.is_empty() {
        "an empty path opens a temporary database per connection"
    } else {
        return Ok(());
    };
    Err(Error::InvalidPath {
        path: path.to_owned(),
        reason,
    })
}

fn is_uri(path: &str) -> bool {
    path.get(..5)
        .is_some_and(|prefix| prefix.eq_ignore_ascii_case("file:"))
}

/// Opens a pool on `options` (with sqlx's default pool settings) the way the stores need it.
///
/// - A connection released while sqlx still counts it in a transaction is closed, not handed
///   to the next user ([`reusable`], as the pool's `after_release`).
/// - Switching a new database to WAL takes an exclusive lock that SQLite's busy handler does
///   not wait for: when several processes (or pools) open a fresh file at once, all but one
///   get `SQLITE_BUSY` from the `journal_mode` pragma. Opening therefore retries `SQLITE_BUSY`
///   with a short backoff for up to [`DEFAULT_BUSY_TIMEOUT`]. (Once the file is in WAL mode,
///   which is persistent, new connections do not need that lock.)
/// - A database file this call creates (it did not exist before) is made readable and
///   writable by its owner only, with its `-wal` and `-shm` files (SQLite creates those, now
///   and later, with the main file's permissions), before any row is written: idempotency
///   records hold responses. An existing file keeps its permissions.
///
/// [`SqliteStore::connect_with`](crate::SqliteStore::connect_with) opens its pool with it;
/// use it for a pool of your own:
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = std::env::temp_dir().join(format!("idempotency-sqlite-open-doc-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir)?;
/// # let path = dir.join("app.db");
/// let options = idempotency_sqlite::connect_options(path.to_str().ok_or("path")?)?;
/// let pool = idempotency_sqlite::open_pool(options).await?;
/// #[cfg(unix)]
/// {
///     use std::os::unix::fs::PermissionsExt;
///     let mode = std::fs::metadata(&path)?.permissions().mode();
///     assert_eq!(mode & 0o077, 0, "created for its owner only");
/// }
/// pool.close().await;
/// # let _ = std::fs::remove_dir_all(&dir);
/// # Ok(()) }
/// ```
pub async fn open_pool(options: SqliteConnectOptions) -> Result<SqlitePool, Error> {
    let new_file = new_file(options.get_filename());
    let started = Instant::now();
    let mut pause = Duration::from_millis(5);
    let pool = loop {
        match SqlitePoolOptions::new()
            .after_release(|conn, _| Box::pin(reusable(conn)))
            .connect_with(options.clone())
            .await
        {
            Err(error) if is_busy(&error) && started.elapsed() < DEFAULT_BUSY_TIMEOUT => {
                tracing::debug!(error = %error, "database busy while opening; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(100));
            }
            result => break result?,
        }
    };
    if let Some(path) = new_file {
        owner_only(&path)?;
    }
    Ok(pool)
}

/// Whether a released connection may go back to the pool: not when sqlx still counts it in a
/// transaction once the rollbacks queued on it have run.
///
/// A statement that ends the transaction (`INSERT OR ROLLBACK`, `RAISE(ROLLBACK)`, a full
/// disk) leaves the connection in autocommit while sqlx counts the transaction open. The store
/// begins it again before each of its writes and before its own rollback, but sqlx's `COMMIT`
/// or `ROLLBACK` of it fails wherever no store call came after that statement: a transaction
/// dropped without a rollback (a cancelled request), committed with no store write after the
/// statement (idempotency off, a request without a key, the caller's statements after
/// `execute_in`), or nested (the savepoint sqlx's rollback names is gone). sqlx then counts
/// the transaction open for good: the next user's `BEGIN IMMEDIATE` would be refused, and its
/// `begin` would only take a savepoint.
///
/// [`open_pool`] sets it as the pool's `after_release`; set it on a pool of your own:
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = std::env::temp_dir().join(format!("idempotency-sqlite-reusable-doc-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir)?;
/// # let path = dir.join("app.db");
/// let options = idempotency_sqlite::connect_options(path.to_str().ok_or("path")?)?;
/// let pool = sqlx::sqlite::SqlitePoolOptions::new()
///     .max_connections(4)
///     .after_release(|conn, _| Box::pin(idempotency_sqlite::reusable(conn)))
///     .connect_with(options)
///     .await?;
/// # pool.close().await;
/// # let _ = std::fs::remove_dir_all(&dir);
/// # Ok(()) }
/// ```
pub async fn reusable(conn: &mut SqliteConnection) -> Result<bool, sqlx::Error> {
    // Commands queued on the connection cannot raise a depth of 0.
    if SqliteTransactionManager::get_transaction_depth(conn) == 0 {
        return Ok(true);
    }
    // The connection runs its commands in order: the ping answers after the queued rollbacks.
    sqlx::Connection::ping(&mut *conn).await?;
    let depth = SqliteTransactionManager::get_transaction_depth(conn);
    if depth != 0 {
        tracing::warn!(
            depth,
            "a pooled SQLite connection came back counted in a transaction; closing it"
        );
    }
    Ok(depth == 0)
}

/// `path` when it names a database file that does not exist yet (not an in-memory database).
fn new_file(path: &Path) -> Option<PathBuf> {
    let name = path.to_string_lossy();
    let memory = name.is_empty() || name == ":memory:" || is_uri(&name);
    (!memory && !path.exists()).then(|| path.to_owned())
}

/// Takes every permission but the owner's from `path` and its `-wal` and `-shm` files.
#[cfg(unix)]
fn owner_only(path: &Path) -> Result<(), Error> {
    use std::os::unix::fs::PermissionsExt;
    let companion = |suffix: &str| {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        PathBuf::from(name)
    };
    let companions = [companion("-wal"), companion("-shm")];
    for file in std::iter::once(path.to_owned()).chain(companions) {
        let restrict = std::fs::metadata(&file).and_then(|meta| {
            let mode = meta.permissions().mode() & !0o077;
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode))
        });
        match restrict {
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(Error::File { path: file, source }),
            Ok(()) => {}
        }
    }
    Ok(())
}

#[cfg(not(unix))]
fn owner_only(_path: &Path) -> Result<(), Error> {
    Ok(())
}

fn is_busy(error: &sqlx::Error) -> bool {
    matches!(
        error.as_database_error().and_then(|db| db.code()),
        Some(code) if code.parse::<i32>().is_ok_and(|code| code & 0xff == SQLITE_BUSY)
    )
}
