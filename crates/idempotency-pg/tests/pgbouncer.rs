//! Through PgBouncer in `pool_mode = transaction` (`PGBOUNCER_URL`; `scripts/services.sh`
//! starts one on 127.0.0.1:6432): the records conformance suite, the leased and optimistic
//! cases, the outbox and inbox conformance suite, and statements on their own under
//! concurrency. Each test works in a schema of its own, its tables named with it (PgBouncer
//! passes no `search_path` startup option).

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

use idempotency_core::testing::Capabilities;
use idempotency_pg::{PgStore, TableName};

async fn fresh_store() -> PgStore {
    let (pool, schema) = idempotency_testing::pgbouncer_pool(10).await;
    let table = TableName::parse(&format!("{schema}.idempotency_records")).unwrap();
    let store = PgStore::with_table(pool, table);
    store.create_schema().await.expect("create schema");
    store
}

mod records {
    use super::*;
    idempotency_core::store_conformance_tests!(fresh_store, Capabilities::FULL);
}

mod optimistic {
    use super::*;
    idempotency_core::optimistic_conformance_tests!(fresh_store, Capabilities::FULL);
}

mod leased {
    use super::*;
    idempotency_core::leased_conformance_tests!(fresh_store, Capabilities::FULL);
}

mod outbox {
    use idempotency_core::config::SchemaMode;
    use idempotency_outbox::config::{InboxConfig, OutboxConfig};
    use idempotency_outbox::testing::{Capabilities, OutboxBackend};
    use idempotency_pg::{PgInbox, PgOutbox};
    use sqlx::{PgConnection, PgPool, Postgres, Transaction};

    /// A pool through PgBouncer, and the schema the tables go to.
    struct Bouncer {
        pool: PgPool,
        schema: String,
    }

    impl OutboxBackend for Bouncer {
        type Connection = PgConnection;
        type Transaction = Transaction<'static, Postgres>;
        type Pooled = sqlx::pool::PoolConnection<Postgres>;
        type Outbox = PgOutbox;
        type Inbox = PgInbox;

        async fn outbox(&self, config: &OutboxConfig) -> PgOutbox {
            let mut config = config.clone();
            config.table_name = format!("{}.{}", self.schema, config.table_name);
            PgOutbox::from_config(self.pool.clone(), &config)
                .await
                .expect("outbox")
        }

        async fn inbox(&self) -> PgInbox {
            let mut config = InboxConfig::default();
            config.schema.mode = SchemaMode::Create;
            config.table_name = format!("{}.inbox", self.schema);
            PgInbox::from_config(self.pool.clone(), &config)
                .await
                .expect("inbox")
        }

        async fn begin(&self) -> Self::Transaction {
            self.pool.begin().await.expect("begin")
        }

        async fn acquire(&self) -> Self::Pooled {
            self.pool.acquire().await.expect("acquire")
        }

        async fn commit(tx: Self::Transaction) {
            tx.commit().await.expect("commit");
        }

        async fn rollback(tx: Self::Transaction) {
            tx.rollback().await.expect("rollback");
        }
    }

    async fn backend() -> Bouncer {
        let (pool, schema) = idempotency_testing::pgbouncer_pool(10).await;
        Bouncer { pool, schema }
    }

    idempotency_outbox::outbox_conformance_tests!(backend, Capabilities::FULL);
}
