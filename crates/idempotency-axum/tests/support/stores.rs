//! Fresh stores with leases prepared, for the tests that run on PostgreSQL and SQLite in both
//! modes of the layer.

use std::future::Future;

use idempotency_core::LeasedClaims;
use idempotency_core::config::{PersistenceConfig, SchemaMode};
use idempotency_pg::PgStore;
use idempotency_sqlite::SqliteStore;

/// A store with leases, fresh per test, and what removes it.
pub(crate) trait Backend: LeasedClaims + Clone {
    fn fresh() -> impl Future<Output = (Self, Cleanup)> + Send;
}

/// Removes a test's SQLite files when dropped (nothing for PostgreSQL: its schema is dropped
/// by `idempotency_testing` once stale).
pub(crate) struct Cleanup(Option<std::path::PathBuf>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(path) = &self.0 {
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
            }
        }
    }
}

impl Backend for PgStore {
    async fn fresh() -> (Self, Cleanup) {
        let store = PgStore::new(idempotency_testing::pg_pool().await);
        store.create_schema().await.unwrap();
        store.prepare_leases().await.unwrap();
        (store, Cleanup(None))
    }
}

impl Backend for SqliteStore {
    async fn fresh() -> (Self, Cleanup) {
        let path =
            std::env::temp_dir().join(format!("{}.db", idempotency_testing::unique_name("axum")));
        let mut config = PersistenceConfig::default();
        config.schema.mode = SchemaMode::Create;
        let store = SqliteStore::connect(path.to_str().unwrap(), &config)
            .await
            .unwrap();
        store.prepare_leases().await.unwrap();
        (store, Cleanup(Some(path)))
    }
}
