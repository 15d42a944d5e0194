//! The outbox conformance suite on SQLite: one writer at a time (`BEGIN IMMEDIATE`), no
//! notifications (relays poll); each test on a fresh database file.

#[path = "support/mod.rs"]
mod support;

use idempotency_core::config::SchemaMode;
use idempotency_outbox::config::{InboxConfig, OutboxConfig};
use idempotency_outbox::testing::{Capabilities, OutboxBackend};
use idempotency_sqlite::{SqliteInbox, SqliteOutbox};
use sqlx::{Sqlite, SqliteConnection, SqlitePool, Transaction};

struct Lite(SqlitePool);

impl OutboxBackend for Lite {
    type Connection = SqliteConnection;
    type Transaction = Transaction<'static, Sqlite>;
    type Pooled = sqlx::pool::PoolConnection<Sqlite>;
    type Outbox = SqliteOutbox;
    type Inbox = SqliteInbox;

    async fn outbox(&self, config: &OutboxConfig) -> SqliteOutbox {
        SqliteOutbox::from_config(self.0.clone(), config)
            .await
            .expect("outbox")
    }

    async fn inbox(&self) -> SqliteInbox {
        let mut config = InboxConfig::default();
        config.schema.mode = SchemaMode::Create;
        SqliteInbox::from_config(self.0.clone(), &config)
            .await
            .expect("inbox")
    }

    async fn begin(&self) -> Self::Transaction {
        self.0.begin_with("BEGIN IMMEDIATE").await.expect("begin")
    }

    async fn acquire(&self) -> Self::Pooled {
        self.0.acquire().await.expect("acquire")
    }

    async fn commit(tx: Self::Transaction) {
        tx.commit().await.expect("commit");
    }

    async fn rollback(tx: Self::Transaction) {
        tx.rollback().await.expect("rollback");
    }
}

async fn backend() -> Lite {
    Lite(support::fresh_store().await.pool().clone())
}

idempotency_outbox::outbox_conformance_tests!(backend, Capabilities::SINGLE_WRITER);
