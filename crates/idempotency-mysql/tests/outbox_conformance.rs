//! The outbox conformance suite on MySQL / MariaDB (`MYSQL_URL`), each test on a fresh
//! database. InnoDB has concurrent writers (a second writer of an aggregate or an inbox entry
//! waits on the first one's row lock, like on PostgreSQL); MySQL has no notifications, so
//! relays poll.

#[path = "support/mod.rs"]
mod support;

use idempotency_core::config::SchemaMode;
use idempotency_mysql::{MysqlInbox, MysqlOutbox};
use idempotency_outbox::config::{InboxConfig, OutboxConfig};
use idempotency_outbox::testing::{Capabilities, OutboxBackend};
use sqlx::{MySql, MySqlConnection, MySqlPool, Transaction};

struct My(MySqlPool);

impl OutboxBackend for My {
    type Connection = MySqlConnection;
    type Transaction = Transaction<'static, MySql>;
    type Pooled = sqlx::pool::PoolConnection<MySql>;
    type Outbox = MysqlOutbox;
    type Inbox = MysqlInbox;

    async fn outbox(&self, config: &OutboxConfig) -> MysqlOutbox {
        MysqlOutbox::from_config(self.0.clone(), config)
            .await
            .expect("outbox")
    }

    async fn inbox(&self) -> MysqlInbox {
        let mut config = InboxConfig::default();
        config.schema.mode = SchemaMode::Create;
        MysqlInbox::from_config(self.0.clone(), &config)
            .await
            .expect("inbox")
    }

    async fn begin(&self) -> Self::Transaction {
        self.0.begin().await.expect("begin")
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

async fn backend() -> My {
    My(idempotency_testing::mysql_pool().await)
}

/// Concurrent writers like PostgreSQL; no notifications (MySQL has no `LISTEN`/`NOTIFY`).
const MYSQL: Capabilities = {
    let mut caps = Capabilities::FULL;
    caps.notifications = false;
    caps
};

idempotency_outbox::outbox_conformance_tests!(backend, MYSQL);
