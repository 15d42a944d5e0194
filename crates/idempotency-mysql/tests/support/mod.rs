//! Fresh stores on a database of their own (see `idempotency_testing::mysql_pool`), and the
//! helpers the MySQL-specific tests share.

#![allow(dead_code)] // each test crate uses a part of this module

use idempotency_core::config::{PersistenceConfig, SchemaMode};
use idempotency_mysql::MysqlStore;

/// A store on a fresh database, its table created.
pub(crate) async fn fresh_store() -> MysqlStore {
    store_on(idempotency_testing::mysql_pool().await).await
}

/// A store on `pool`, its table created.
pub(crate) async fn store_on(pool: MySqlPool) -> MysqlStore {
    let mut config = PersistenceConfig::default();
    config.schema.mode = SchemaMode::Create;
    MysqlStore::from_config(pool, &config)
        .await
        .expect("store on a fresh database")
}

use std::time::Duration;

use idempotency_core::{Call, ExecutionResult, IdempotencyKey, IdempotencyService, Outcome};
use serde_json::{Value, json};
use sqlx::{MySqlConnection, MySqlPool};
use tokio::sync::oneshot;

/// The error of the tests' actions.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AppError {
    #[error(transparent)]
    Idempotency(#[from] idempotency_core::Error),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

pub(crate) async fn with_charges(pool: &MySqlPool) {
    sqlx::query(
        "CREATE TABLE charges (id BIGINT AUTO_INCREMENT PRIMARY KEY, reference VARCHAR(64) NOT NULL)",
    )
    .execute(pool)
    .await
    .expect("create charges");
}

pub(crate) async fn insert_charge(
    conn: &mut MySqlConnection,
    reference: &str,
) -> Result<i64, sqlx::Error> {
    let id = sqlx::query("INSERT INTO charges (reference) VALUES (?)")
        .bind(reference)
        .execute(conn)
        .await?
        .last_insert_id();
    Ok(i64::try_from(id).unwrap_or_default())
}

pub(crate) async fn count(pool: &MySqlPool, table: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT COUNT(*) FROM {table}")))
        .fetch_one(pool)
        .await
        .expect("count")
}

pub(crate) fn key(label: &str) -> IdempotencyKey {
    idempotency_core::testing::key(label)
}

/// A request holding a key: `started` fires once it does, `release` lets it complete.
pub(crate) type Holder = (
    oneshot::Receiver<()>,
    oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<Outcome<Value>, AppError>>,
);

/// Starts a request whose action signals once it holds the key, then waits for `release`.
pub(crate) fn hold_key(service: &IdempotencyService<MysqlStore>, k: &IdempotencyKey) -> Holder {
    let (started_tx, started) = oneshot::channel();
    let (release, release_rx) = oneshot::channel::<()>();
    let (service, k) = (service.clone(), k.clone());
    let handle = tokio::spawn(async move {
        service
            .execute(Call::new("OP", k, &json!({"h": 1})), async |_conn| {
                let _ = started_tx.send(());
                let _ = tokio::time::timeout(Duration::from_secs(30), release_rx).await;
                Ok::<_, AppError>(ExecutionResult::success(json!("holder")))
            })
            .await
    });
    (started, release, handle)
}
