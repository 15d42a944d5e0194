//! The embedded SQLite database of the demo: one file, created on first run.

use std::path::{Path, PathBuf};

use idempotency_core::StoreError;
use idempotency_sqlite::{SqliteOutbox, SqliteStore, connect_options, open_pool};
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
    /// Opens (creating when missing, readable by its owner only) the file at `path`, the
    /// `demo.sqlite-path` setting, with the store's connection options (WAL, busy timeout) and
    /// its opening retry (two demos starting at once on a fresh file take turns switching it
    /// to WAL). A value SQLite would not take as a file name (a `sqlite:` URL, a `file:` URI,
    /// `:memory:`) is refused before anything is created.
    pub async fn open(path: &Path) -> Result<SqlitePool, StartupError> {
        let text = path.to_string_lossy();
        let refuse = |reason: String| StartupError::SqlitePath {
            path: text.clone().into_owned(),
            reason,
        };
        if text.starts_with("sqlite:") {
            return Err(refuse(
                "a file path is expected, not a URL: write `store/demo.db`, not \
                 `sqlite://store/demo.db`"
                    .to_owned(),
            ));
        }
        let options = connect_options(&text).map_err(|error| match error {
            idempotency_sqlite::Error::InvalidPath { reason, .. } => refuse(reason.to_owned()),
            other => StartupError::SqliteStore(other),
        })?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        Ok(open_pool(options).await?)
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

    async fn close(&self) {
        if let Err(error) = idempotency_sqlite::close_pool(self.store.pool()).await {
            tracing::warn!(%error, "the SQLite file was not checkpointed at shutdown");
        }
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

    /// The outbox has no index on published rows' aggregates, so a `NOT EXISTS` per charge
    /// read the whole table once per charge (11,303 charges by 61,303 events: 3.76 s, under a
    /// read snapshot that keeps the WAL from restarting). `NOT IN` reads the events once into
    /// a temporary index and probes it per charge.
    async fn charges_without_event(&self, window_secs: i64) -> Result<i64, sqlx::Error> {
        let sql = format!(
            "SELECT count(*) FROM charges c \
             WHERE c.created_at > strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-' || ? || ' seconds') \
             AND c.id NOT IN (SELECT o.aggregate_id FROM {} o \
                              WHERE o.aggregate_type = 'charge' \
                                AND o.event_type = 'ChargeCreated')",
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
