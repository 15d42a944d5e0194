//! The embedded SQLite database of the demo: one file, created on first run.

use std::path::{Path, PathBuf};

use idempotency_core::StoreError;
use idempotency_sqlite::{SqliteOutbox, SqliteStore, connect_options};
use sqlx::{self, SqliteConnection, SqlitePool};
use uuid::Uuid;

use super::Database;
use crate::StartupError;
use crate::model::{Charge, Payment, Refund};

const BUSINESS_TABLES: &str = "
CREATE TABLE IF NOT EXISTS payments (
    payment_id  TEXT PRIMARY KEY,
    order_id    TEXT NOT NULL,
    recipient   TEXT NOT NULL,
    amount      TEXT NOT NULL,
    status      TEXT NOT NULL,
    created_at  TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
CREATE TABLE IF NOT EXISTS refunds (
    refund_id   TEXT PRIMARY KEY,
    payment_id  TEXT NOT NULL,
    amount      TEXT NOT NULL,
    status      TEXT NOT NULL,
    created_at  TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
CREATE TABLE IF NOT EXISTS charges (
    id            TEXT PRIMARY KEY,
    amount_cents  INTEGER NOT NULL CHECK (amount_cents > 0),
    created_at    TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
";

/// SQLite: records, outbox and business tables in one file.
#[derive(Debug, Clone)]
pub struct Sqlite {
    path: PathBuf,
    store: SqliteStore,
    outbox: SqliteOutbox,
}

impl Sqlite {
    /// Opens (creating when missing) the file at `path`, with the store's connection options
    /// (WAL, busy timeout).
    pub async fn open(path: &Path) -> Result<SqlitePool, StartupError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let options = connect_options(&path.to_string_lossy())?;
        Ok(SqlitePool::connect_with(options).await?)
    }
}

impl Database for Sqlite {
    type Pool = SqlitePool;
    type Store = SqliteStore;
    type Outbox = SqliteOutbox;

    async fn create_business_tables(pool: &SqlitePool) -> Result<(), sqlx::Error> {
        sqlx::raw_sql(BUSINESS_TABLES)
            .execute(pool)
            .await
            .map(|_| ())
    }

    fn new(pool: SqlitePool, store: Self::Store, outbox: Self::Outbox) -> Self {
        let path = pool.connect_options().get_filename().to_owned();
        let path = std::fs::canonicalize(&path).unwrap_or(path);
        Self {
            path,
            store,
            outbox,
        }
    }

    fn store(&self) -> &SqliteStore {
        &self.store
    }

    fn outbox(&self) -> &SqliteOutbox {
        &self.outbox
    }

    fn classify(error: sqlx::Error) -> StoreError {
        idempotency_sqlite::store_error(error)
    }

    fn describe(&self) -> String {
        format!(
            "SQLite file {} (set DATABASE_URL for PostgreSQL)",
            self.path.display()
        )
    }

    async fn insert_payment(
        conn: &mut SqliteConnection,
        payment: &Payment,
        recipient: &str,
    ) -> Result<(), sqlx::Error> {
        sqlx::query("INSERT INTO payments (payment_id, order_id, recipient, amount, status) VALUES (?, ?, ?, ?, ?)")
            .bind(payment.payment_id.to_string())
            .bind(&payment.order_id)
            .bind(recipient)
            .bind(payment.amount.to_string())
            .bind(&payment.status)
            .execute(conn)
            .await?;
        Ok(())
    }

    async fn insert_refund(
        conn: &mut SqliteConnection,
        refund: &Refund,
    ) -> Result<(), sqlx::Error> {
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
        conn: &mut SqliteConnection,
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
        let row: Option<(i64, String)> =
            sqlx::query_as("SELECT amount_cents, created_at FROM charges WHERE id = ?")
                .bind(id.to_string())
                .fetch_optional(self.store.pool())
                .await?;
        Ok(row.map(|(amount_cents, created_at)| Charge {
            id,
            amount_cents,
            created_at,
        }))
    }

    async fn charges_without_event(&self, window_secs: i64) -> Result<i64, sqlx::Error> {
        let sql = format!(
            "SELECT count(*) FROM charges c \
             WHERE c.created_at > strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-' || ? || ' seconds') \
             AND NOT EXISTS (SELECT 1 FROM {} o WHERE o.aggregate_type = 'charge' \
             AND o.aggregate_id = c.id AND o.event_type = 'ChargeCreated')",
            self.outbox.table().quoted()
        );
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .bind(window_secs)
            .fetch_one(self.store.pool())
            .await
    }

    async fn ping(&self) -> Result<(), sqlx::Error> {
        sqlx::query("SELECT 1")
            .execute(self.store.pool())
            .await
            .map(|_| ())
    }
}
