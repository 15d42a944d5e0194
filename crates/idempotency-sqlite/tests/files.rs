//! The database file: plain paths SQLite would not take as file names, the permissions of a
//! new file, the WAL's size limit and the checkpoint at close.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

mod support;

use idempotency_sqlite::{
    Error, JOURNAL_SIZE_LIMIT, SqliteStore, close_pool, connect_options, open_pool,
};
use support::{as_str, create_config, temp_db_path};

/// `file:` makes SQLite read a plain path as a URI: with `?mode=memory` every pooled
/// connection got an empty in-memory database of its own (requests failed with `no such
/// table`, nothing was saved). `:memory:` did the same.
#[test]
fn plain_paths_sqlite_would_not_take_as_file_names_are_refused() {
    for path in ["file:mem.db?mode=memory", "FILE:x.db", ":memory:", ""] {
        let error = connect_options(path).unwrap_err();
        assert!(
            matches!(&error, Error::InvalidPath { path: p, .. } if p == path),
            "{path}: {error:?}"
        );
    }
    for fine in [
        "data/app.db",
        "./file:x.db",
        "sqlite::memory:",
        "sqlite:file:x?mode=memory&cache=shared",
    ] {
        connect_options(fine).unwrap();
    }
}

/// Idempotency records hold responses: a database file the store creates is not readable by
/// other users, nor are its WAL and shared-memory files.
#[cfg(unix)]
#[tokio::test]
async fn a_new_database_file_is_for_its_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let path = temp_db_path();
    let store = SqliteStore::connect(as_str(&path), &create_config())
        .await
        .unwrap();
    for suffix in ["", "-wal", "-shm"] {
        let file = format!("{}{suffix}", as_str(&path));
        let mode = std::fs::metadata(&file).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "{file}: {mode:o}");
    }
    store.pool().close().await;
}

/// An existing file keeps the permissions its owner gave it.
#[cfg(unix)]
#[tokio::test]
async fn an_existing_database_file_keeps_its_permissions() {
    use std::os::unix::fs::PermissionsExt;
    let path = temp_db_path();
    std::fs::write(&path, b"").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
    let pool = open_pool(connect_options(as_str(&path)).unwrap())
        .await
        .unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o640);
    pool.close().await;
}

/// Without a `journal_size_limit` a WAL that grew (a large purge under load) keeps its size for
/// good; `close_pool` checkpoints it into the database file and empties it.
#[tokio::test]
async fn the_wal_is_limited_and_emptied_at_close() {
    let path = temp_db_path();
    let store = SqliteStore::connect(as_str(&path), &create_config())
        .await
        .unwrap();
    let limit: i64 = sqlx::query_scalar("PRAGMA journal_size_limit")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(u64::try_from(limit).unwrap(), JOURNAL_SIZE_LIMIT);
    sqlx::query(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2000) \
         INSERT INTO idempotency_records (operation, idempotency_key, request_hash, status, \
             result_payload, created_at) \
         SELECT 'OP', 'k' || i, 'h', 'COMPLETED', json_quote(hex(randomblob(500))), 0 FROM n",
    )
    .execute(store.pool())
    .await
    .unwrap();
    let wal = format!("{}-wal", as_str(&path));
    assert!(std::fs::metadata(&wal).unwrap().len() > 0);
    close_pool(store.pool()).await.unwrap();
    assert!(store.pool().is_closed());
    assert_eq!(std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0), 0);
    let store = SqliteStore::connect(as_str(&path), &create_config())
        .await
        .unwrap();
    let kept: i64 = sqlx::query_scalar("SELECT count(*) FROM idempotency_records")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(kept, 2000);
    store.pool().close().await;
}

/// A pooled connection that sqlx still counts in a transaction when it is released (a nested
/// transaction whose statement rolled the whole transaction back: sqlx's rollback of the
/// savepoint fails, and it counts the transaction open for good) is closed, not handed to the
/// next user (before: every later `BEGIN IMMEDIATE` on it was refused).
#[tokio::test]
async fn a_connection_released_inside_a_transaction_is_not_reused() {
    let path = temp_db_path();
    let pool = open_pool(connect_options(as_str(&path)).unwrap())
        .await
        .unwrap();
    sqlx::raw_sql("CREATE TABLE applied (id INTEGER PRIMARY KEY); INSERT INTO applied VALUES (1)")
        .execute(&pool)
        .await
        .unwrap();
    let mut tx = pool.begin().await.unwrap();
    let mut inner = sqlx::Connection::begin(&mut *tx).await.unwrap();
    sqlx::query("INSERT OR ROLLBACK INTO applied VALUES (1)")
        .execute(&mut *inner)
        .await
        .unwrap_err();
    drop(inner);
    drop(tx);
    // Released in the background: until every connection is idle again (or closed).
    let started = std::time::Instant::now();
    while pool.num_idle() < pool.size() as usize {
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let mut idle = Vec::new();
    for _ in 0..pool.num_idle() {
        idle.push(pool.acquire().await.unwrap());
    }
    for conn in &mut idle {
        assert!(
            !sqlx::Connection::is_in_transaction(&**conn),
            "a connection counted in a transaction was handed out"
        );
        let mut tx = sqlx::Connection::begin_with(&mut **conn, "BEGIN IMMEDIATE")
            .await
            .unwrap();
        sqlx::query("SELECT 1").execute(&mut *tx).await.unwrap();
        tx.commit().await.unwrap();
    }
    drop(idle);
    // The one connection there was went: a new one serves the next user.
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
    sqlx::query("INSERT INTO applied VALUES (2)")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    close_pool(&pool).await.unwrap();
}
