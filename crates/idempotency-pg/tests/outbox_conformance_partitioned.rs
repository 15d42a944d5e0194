//! The outbox conformance suite on the time-partitioned PostgreSQL layout
//! (`outbox.partitioning.enabled`): every case, every capability, each test on a fresh schema.
//! The parent is partitioned by day with 3 days ahead, so the cases' rows land in the
//! current day's partition.

use idempotency_core::config::SchemaMode;
use idempotency_outbox::config::{InboxConfig, OutboxConfig};
use idempotency_outbox::testing::{Capabilities, OutboxBackend};
use idempotency_pg::{PgInbox, PgOutbox};
use sqlx::{PgConnection, PgPool, Postgres, Transaction};

struct Pg(PgPool);

impl OutboxBackend for Pg {
    type Connection = PgConnection;
    type Transaction = Transaction<'static, Postgres>;
    type Pooled = sqlx::pool::PoolConnection<Postgres>;
    type Outbox = PgOutbox;
    type Inbox = PgInbox;

    async fn outbox(&self, config: &OutboxConfig) -> PgOutbox {
        let mut config = config.clone();
        config.partitioning.enabled = true;
        let outbox = PgOutbox::from_config(self.0.clone(), &config)
            .await
            .expect("outbox");
        assert!(
            outbox.partitions().await.expect("partitions").len() >= 5,
            "the default partition, today's and 3 ahead"
        );
        outbox
    }

    async fn inbox(&self) -> PgInbox {
        let mut config = InboxConfig::default();
        config.schema.mode = SchemaMode::Create;
        PgInbox::from_config(self.0.clone(), &config)
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

async fn backend() -> Pg {
    Pg(idempotency_testing::pg_pool().await)
}

idempotency_outbox::outbox_conformance_tests!(backend, Capabilities::FULL);
