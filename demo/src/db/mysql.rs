//! The MySQL / MariaDB database of the demo.

use chrono::{NaiveDateTime, SecondsFormat};
use idempotency::pool::TestWhenIdle;
use idempotency_core::StoreError;
use idempotency_mysql::sqlx::{self, MySqlConnection, MySqlPool};
use idempotency_mysql::{MysqlOutbox, MysqlStore};
use uuid::Uuid;

use super::Database;
use crate::StartupError;
use crate::config::DemoConfig;
use crate::model::{Charge, Payment, Refund};

const BUSINESS_TABLES: &str = "
CREATE TABLE IF NOT EXISTS payments (
    payment_id  CHAR(36) PRIMARY KEY,
    order_id    VARCHAR(255) NOT NULL,
    recipient   VARCHAR(255) NOT NULL,
    amount      DECIMAL(14, 2) NOT NULL CHECK (amount > 0),
    status      VARCHAR(32) NOT NULL,
    created_at  DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6))
) DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
CREATE TABLE IF NOT EXISTS refunds (
    refund_id   CHAR(36) PRIMARY KEY,
    payment_id  VARCHAR(255) NOT NULL,
    amount      DECIMAL(14, 2) NOT NULL CHECK (amount > 0),
    status      VARCHAR(32) NOT NULL,
    created_at  DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6))
) DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
CREATE TABLE IF NOT EXISTS charges (
    id            CHAR(36) PRIMARY KEY,
    amount_cents  BIGINT NOT NULL CHECK (amount_cents > 0),
    created_at    DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6))
) DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
";

/// MySQL / MariaDB: records, outbox and business tables in one database.
#[derive(Debug, Clone)]
pub struct Mysql {
    pool: MySqlPool,
    store: MysqlStore,
    outbox: MysqlOutbox,
}

impl Mysql {
    /// Connects the pool to `url` (`database.*`).
    pub async fn connect(url: &str, config: &DemoConfig) -> Result<MySqlPool, StartupError> {
        let pool = sqlx::mysql::MySqlPoolOptions::new()
            .max_connections(config.database.max_connections.get())
            .acquire_timeout(config.database.acquire_timeout)
            .test_when_idle(config.database.test_after_idle)
            .connect(url)
            .await?;
        Ok(pool)
    }
}

impl Database for Mysql {
    type Pool = MySqlPool;
    type Store = MysqlStore;
    type Outbox = MysqlOutbox;

    async fn create_business_tables(pool: &MySqlPool) -> Result<(), sqlx::Error> {
        sqlx::raw_sql(BUSINESS_TABLES)
            .execute(pool)
            .await
            .map(|_| ())
    }

    fn new(pool: MySqlPool, store: Self::Store, outbox: Self::Outbox) -> Self {
        Self {
            pool,
            store,
            outbox,
        }
    }

    fn store(&self) -> &MysqlStore {
        &self.store
    }

    fn outbox(&self) -> &MysqlOutbox {
        &self.outbox
    }

    fn classify(error: sqlx::Error) -> StoreError {
        idempotency_mysql::store_error(error)
    }

    fn describe(&self) -> String {
        let options = self.pool.connect_options();
        format!(
            "MySQL at {}:{} (database {})",
            options.get_host(),
            options.get_port(),
            options.get_database().unwrap_or("default")
        )
    }

    async fn insert_payment(
        conn: &mut MySqlConnection,
        payment: &Payment,
        recipient: &str,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO payments (payment_id, order_id, recipient, amount, status) \
             VALUES (?, ?, ?, ?, ?)",
        )
        .bind(payment.payment_id.to_string())
        .bind(&payment.order_id)
        .bind(recipient)
        .bind(payment.amount.to_string())
        .bind(&payment.status)
        .execute(conn)
        .await?;
        Ok(())
    }

    async fn insert_refund(conn: &mut MySqlConnection, refund: &Refund) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO refunds (refund_id, payment_id, amount, status) VALUES (?, ?, ?, ?)",
        )
        .bind(refund.refund_id.to_string())
        .bind(&refund.payment_id)
        .bind(refund.amount.to_string())
        .bind(&refund.status)
        .execute(conn)
        .await?;
        Ok(())
    }

    async fn insert_charge(
        conn: &mut MySqlConnection,
        id: Uuid,
        amount_cents: i64,
    ) -> Result<(), sqlx::Error> {
        sqlx::query("INSERT INTO charges (id, amount_cents) VALUES (?, ?)")
            .bind(id.to_string())
            .bind(amount_cents)
            .execute(conn)
            .await?;
        Ok(())
    }

    async fn find_charge(&self, id: Uuid) -> Result<Option<Charge>, sqlx::Error> {
        let row: Option<(i64, NaiveDateTime)> =
            sqlx::query_as("SELECT amount_cents, created_at FROM charges WHERE id = ?")
                .bind(id.to_string())
                .fetch_optional(&self.pool)
                .await?;
        Ok(row.map(|(amount_cents, created_at)| Charge {
            id,
            amount_cents,
            created_at: created_at
                .and_utc()
                .to_rfc3339_opts(SecondsFormat::Millis, true),
        }))
    }

    async fn charges_without_event(&self, window_secs: i64) -> Result<i64, sqlx::Error> {
        let sql = format!(
            "SELECT count(*) FROM charges c \
             WHERE c.created_at > UTC_TIMESTAMP(6) - INTERVAL ? SECOND \
             AND NOT EXISTS (SELECT 1 FROM {} o WHERE o.aggregate_type = 'charge' \
             AND o.aggregate_id = c.id AND o.event_type = 'ChargeCreated')",
            self.outbox.table().quoted()
        );
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .bind(window_secs)
            .fetch_one(&self.pool)
            .await
    }

    async fn ping(&self) -> Result<(), sqlx::Error> {
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .map(|_| ())
    }
}
