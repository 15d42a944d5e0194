//! Fresh database files for tests (one per call, under the system temp directory), and the
//! helpers the SQLite-specific tests share.
//!
//! Files are named `<unix seconds>_<pid>_<n>.db`; files left by runs older than an hour are
//! deleted (with their `-wal` and `-shm` companions) the first time a test asks for a path, so
//! tests run in parallel and again and again without cleanup by hand.

#![allow(dead_code)] // each test crate uses a part of this module
#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idempotency_core::config::{PersistenceConfig, SchemaMode};
use idempotency_core::store::{Claim, LockWait};
use idempotency_core::{
    Call, ExecutionResult, Fingerprint, IdempotencyKey, IdempotencyService, Outcome, RecordId,
};
use idempotency_sqlite::SqliteStore;
use serde_json::{Value, json};
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{SqliteConnection, SqlitePool};
use tokio::sync::oneshot;

fn dir() -> PathBuf {
    std::env::temp_dir().join("idempotency-sqlite-tests")
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

fn sweep_stale_files() {
    static DONE: AtomicBool = AtomicBool::new(false);
    if DONE.swap(true, Ordering::SeqCst) {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir()) else {
        return;
    };
    let cutoff = now_secs().saturating_sub(3600);
    for entry in entries.flatten() {
        let name = entry.file_name();
        let created = name
            .to_str()
            .and_then(|n| n.split('_').next())
            .and_then(|secs| secs.parse::<u64>().ok());
        if created.is_some_and(|secs| secs < cutoff) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// A path no other test in any process uses; the file does not exist yet.
pub(crate) fn temp_db_path() -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    sweep_stale_files();
    let dir = dir();
    std::fs::create_dir_all(&dir).expect("create the test directory");
    dir.join(format!(
        "{}_{}_{}.db",
        now_secs(),
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ))
}

/// The path as the `&str` that `connect` takes.
pub(crate) fn as_str(path: &std::path::Path) -> &str {
    path.to_str().expect("temp paths are UTF-8 here")
}

/// The recommended options on a fresh file.
pub(crate) fn fresh_options() -> (PathBuf, SqliteConnectOptions) {
    let path = temp_db_path();
    let options = idempotency_sqlite::connect_options(as_str(&path)).expect("options");
    (path, options)
}

/// `create` mode on the default table.
pub(crate) fn create_config() -> PersistenceConfig {
    let mut config = PersistenceConfig::default();
    config.schema.mode = SchemaMode::Create;
    config
}

/// A store with its schema on a fresh database file.
pub(crate) async fn fresh_store() -> SqliteStore {
    SqliteStore::connect(as_str(&temp_db_path()), &create_config())
        .await
        .expect("open a fresh SQLite store")
}

/// A store with the given busy timeout on a fresh database file.
pub(crate) async fn store_with_busy_timeout(timeout: Duration) -> SqliteStore {
    let (_, options) = fresh_options();
    SqliteStore::connect_with(options.busy_timeout(timeout), &create_config())
        .await
        .expect("open a fresh SQLite store")
}

/// The error of the tests' actions.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AppError {
    #[error(transparent)]
    Idempotency(#[from] idempotency_core::Error),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
    #[error("the action failed on purpose")]
    Boom,
}

pub(crate) async fn with_charges(store: &SqliteStore) {
    sqlx::query("CREATE TABLE charges (id INTEGER PRIMARY KEY, reference TEXT NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
}

pub(crate) async fn insert_charge(
    conn: &mut SqliteConnection,
    reference: &str,
) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("INSERT INTO charges (reference) VALUES (?) RETURNING id")
        .bind(reference)
        .fetch_one(conn)
        .await
}

pub(crate) async fn count(pool: &SqlitePool, table: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
        .fetch_one(pool)
        .await
        .unwrap()
}

pub(crate) fn key(label: &str) -> IdempotencyKey {
    idempotency_core::testing::key(label)
}

pub(crate) fn claim<'a>(id: &'a RecordId, fingerprint: &'a Fingerprint) -> Claim<'a> {
    Claim {
        id,
        fingerprint,
        ttl: None,
        wait: LockWait::Unbounded,
    }
}

/// Starts a request that holds the write lock for `hold` inside its action.
pub(crate) fn hold_lock(
    service: &IdempotencyService<SqliteStore>,
    k: &IdempotencyKey,
    hold: Duration,
) -> (
    oneshot::Receiver<()>,
    tokio::task::JoinHandle<Result<Outcome<Value>, AppError>>,
) {
    let (started_tx, started) = oneshot::channel();
    let (service, k) = (service.clone(), k.clone());
    let handle = tokio::spawn(async move {
        service
            .execute(Call::new("OP", k, &json!({"h": 1})), async |_conn| {
                let _ = started_tx.send(());
                tokio::time::sleep(hold).await;
                Ok::<_, AppError>(ExecutionResult::success(json!("holder")))
            })
            .await
    });
    (started, handle)
}
