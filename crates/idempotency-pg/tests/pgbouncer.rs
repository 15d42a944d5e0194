//! Through PgBouncer in `pool_mode = transaction` (`PGBOUNCER_URL`; `scripts/services.sh`
//! starts one on 127.0.0.1:6432): the records conformance suite, the leased and optimistic
//! cases, the outbox and inbox conformance suite, and statements on their own under
//! concurrency, every store with `Pooler::Transaction`; the relay's wake-up listens on a
//! direct connection (`with_listen_pool`). Each test works in a schema of its own, its tables named with it (PgBouncer
//! passes no `search_path` startup option).

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

/// Every test's name starts with `through_pgbouncer::` (`-- --skip through_pgbouncer` leaves them
/// out where no PgBouncer runs, as on the testcontainers path).
mod through_pgbouncer {
    use idempotency_core::testing::Capabilities;
    use idempotency_pg::{PgStore, Pooler, TableName};

    async fn fresh_store() -> PgStore {
        let (pool, schema) = idempotency_testing::pgbouncer_pool(10).await;
        let table = TableName::parse(&format!("{schema}.idempotency_records")).unwrap();
        let store = PgStore::with_table(pool, table).with_pooler(Pooler::Transaction);
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
        use idempotency_pg::{PgInbox, PgOutbox, Pooler};
        use sqlx::{PgConnection, PgPool, Postgres, Transaction};

        /// A pool through PgBouncer, the schema the tables go to, and a direct pool for `LISTEN`.
        struct Bouncer {
            pool: PgPool,
            schema: String,
            direct: PgPool,
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
                PgOutbox::from_config_with_pooler(self.pool.clone(), &config, Pooler::Transaction)
                    .await
                    .expect("outbox")
                    .with_listen_pool(self.direct.clone())
            }

            async fn inbox(&self) -> PgInbox {
                let mut config = InboxConfig::default();
                config.schema.mode = SchemaMode::Create;
                config.table_name = format!("{}.inbox", self.schema);
                PgInbox::from_config_with_pooler(self.pool.clone(), &config, Pooler::Transaction)
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
            let direct = idempotency_testing::pg_pool_with(2).await;
            Bouncer {
                pool,
                schema,
                direct,
            }
        }

        idempotency_outbox::outbox_conformance_tests!(backend, Capabilities::FULL);
    }

    /// The operator statements (`keys evict` and `stats`, `outbox status`, the dead letters'
    /// list, show, ids, discard, the purge's counts) from more clients than PgBouncer has
    /// server connections: unnamed and each in a transaction of its own, as the stores' (before:
    /// sqlx's named statements on the pool failed with 42P05 "prepared statement already
    /// exists" or 26000 "does not exist").
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn the_operator_statements_hold_under_contention() {
        use idempotency_core::admin::{Force, KeyAdmin};
        use idempotency_core::config::SchemaMode;
        use idempotency_core::{IdempotencyKey, Operation, RecordId, Scope};
        use idempotency_outbox::admin::{DeadLetterFilter, OutboxAdmin};
        use idempotency_outbox::config::OutboxConfig;
        use idempotency_pg::PgOutbox;
        use std::time::Duration;

        let (pool, schema) = idempotency_testing::pgbouncer_pool(48).await;
        let table = TableName::parse(&format!("{schema}.idempotency_records")).unwrap();
        let store = PgStore::with_table(pool.clone(), table).with_pooler(Pooler::Transaction);
        store.create_schema().await.unwrap();
        let mut config = OutboxConfig::default();
        config.schema.mode = SchemaMode::Create;
        config.table_name = format!("{schema}.outbox");
        let outbox = PgOutbox::from_config_with_pooler(pool, &config, Pooler::Transaction)
            .await
            .unwrap();
        let mut tasks = Vec::new();
        for task in 0..48 {
            let (store, outbox) = (store.clone(), outbox.clone());
            tasks.push(tokio::spawn(async move {
                let filter = DeadLetterFilter::default();
                for round in 0..5 {
                    let id = RecordId::new(
                        Operation::new("PAY").unwrap(),
                        Scope::default(),
                        IdempotencyKey::new(format!("k-{task}-{round}")).unwrap(),
                    );
                    store.evict(&id, Force::No).await.unwrap();
                    store.lease_token(&id).await.unwrap();
                    store.key_stats().await.unwrap();
                    outbox.status().await.unwrap();
                    outbox.find_dead_letters(&filter, 10).await.unwrap();
                    outbox.dead_letter_ids(&filter).await.unwrap();
                    outbox.dead_letter(uuid::Uuid::nil()).await.unwrap();
                    outbox.discard(&[]).await.unwrap();
                    outbox
                        .expired_counts(Duration::from_secs(3600), None)
                        .await
                        .unwrap();
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
    }

    /// Statements the store runs on its own (a replay's look-up, the leased claims) from more
    /// clients than PgBouncer has server connections: each runs inside a transaction of its own, so
    /// sqlx's two exchanges (parse, then bind and execute) stay on one server connection. Without
    /// that, PgBouncer hands the bind to whichever server connection is free, where the unnamed
    /// statement is another client's or none.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn statements_on_their_own_hold_under_contention() {
        use idempotency_core::lease::{LeaseClaim, LeasedClaims};
        use idempotency_core::store::{Claim, IdempotencyStore, LockWait};
        use idempotency_core::{
            Fingerprint, IdempotencyKey, Operation, RecordId, Scope, StoredOutcome,
        };
        use std::time::Duration;

        // More clients (48) than the server connections PgBouncer gives one database and user
        // (default_pool_size = 20 in scripts/services.sh).
        let (pool, schema) = idempotency_testing::pgbouncer_pool(48).await;
        let table = TableName::parse(&format!("{schema}.idempotency_records")).unwrap();
        let store = PgStore::with_table(pool, table).with_pooler(Pooler::Transaction);
        store.create_schema().await.unwrap();
        store.prepare_leases().await.unwrap();
        let operation = Operation::new("PAY").unwrap();
        let scope = Scope::new("tenant").unwrap();
        let mut tasks = Vec::new();
        for task in 0..48 {
            let store = store.clone();
            let (operation, scope) = (operation.clone(), scope.clone());
            tasks.push(tokio::spawn(async move {
                for round in 0..15 {
                    let key = IdempotencyKey::new(format!("k-{task}-{round}")).unwrap();
                    let id = RecordId::new(operation.clone(), scope.clone(), key);
                    let fingerprint = Fingerprint::new(format!("{:0>64}", task * 100 + round));
                    let claim = Claim {
                        id: &id,
                        fingerprint: &fingerprint,
                        ttl: Some(Duration::from_secs(60)),
                        wait: LockWait::Unbounded,
                    };
                    let LeaseClaim::Acquired { token, .. } = store
                        .claim_leased(&claim, Duration::from_secs(30))
                        .await
                        .unwrap()
                    else {
                        panic!("a fresh key was not acquired");
                    };
                    let outcome = StoredOutcome::Completed {
                        payload: format!("{{\"n\":{round}}}"),
                    };
                    let done = store
                        .complete_leased(&id, token, &outcome, None)
                        .await
                        .unwrap();
                    assert!(done.is_some(), "the holder's completion was refused");
                    let found = store
                        .lookup(&id)
                        .await
                        .unwrap()
                        .expect("the completed record");
                    assert_eq!(found.fingerprint, fingerprint);
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
    }
}
