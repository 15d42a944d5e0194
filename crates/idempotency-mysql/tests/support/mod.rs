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
pub(crate) async fn store_on(pool: sqlx::MySqlPool) -> MysqlStore {
    let mut config = PersistenceConfig::default();
    config.schema.mode = SchemaMode::Create;
    MysqlStore::from_config(pool, &config)
        .await
        .expect("store on a fresh database")
}
