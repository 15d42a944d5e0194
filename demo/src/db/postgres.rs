//! The PostgreSQL database of the demo.

use std::sync::atomic::{AtomicBool, Ordering};

use chrono::{DateTime, SecondsFormat, Utc};
use idempotency::pool::TestWhenIdle;
use idempotency_core::StoreError;
use idempotency_pg::PgOutbox;
use idempotency_pg::PgStore;
use sqlx::{self, PgConnection, PgPool};
use uuid::Uuid;

use super::Database;
use crate::StartupError;
use crate::config::DemoConfig;
use crate::model::{Charge, Payment, Refund};

const BUSINESS_TABLES: &str = "
CREATE TABLE IF NOT EXISTS payments (
    payment_id  UUID PRIMARY KEY,
    order_id    TEXT NOT NULL,
    recipient   TEXT NOT NULL,
    amount      NUMERIC(14, 2) NOT NULL CHECK (amount > 0),
    status      TEXT NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS refunds (
    refund_id   UUID PRIMARY KEY,
    payment_id  TEXT NOT NULL,
    amount      NUMERIC(14, 2) NOT NULL CHECK (amount > 0),
    status      TEXT NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS charges (
    id            UUID PRIMARY KEY,
    amount_cents  BIGINT NOT NULL CHECK (amount_cents > 0),
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now()
);
";

/// Whether the pool is behind a pooler in transaction mode (`idempotency.persistence.pooler`),
/// set once by [`Postgres::connect`]: the business statements are then unnamed, as the
/// stores' are (the demo has one pool per process).
static UNNAMED: AtomicBool = AtomicBool::new(false);

/// Whether the business statements may be named and cached on the connection.
fn persistent() -> bool {
    !UNNAMED.load(Ordering::Relaxed)
}

/// PostgreSQL: records, outbox and business tables in one database.
#[derive(Debug, Clone)]
pub struct Postgres {
    pool: PgPool,
    store: PgStore,
    outbox: PgOutbox,
}

impl Postgres {
    /// Connects the pool to `url` (`database.*`); behind a pooler in transaction mode
    /// (`idempotency.persistence.pooler: transaction`) the business statements are unnamed.
    pub async fn connect(url: &str, config: &DemoConfig) -> Result<PgPool, StartupError> {
        let pooler = config.idempotency.persistence.pooler;
        UNNAMED.store(
            pooler == idempotency_core::config::Pooler::Transaction,
            Ordering::Relaxed,
        );
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(config.database.max_connections.get())
            .acquire_timeout(config.database.acquire_timeout)
            .test_when_idle(config.database.test_after_idle)
            .connect(url)
            .await?;
        Ok(pool)
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }
}

impl Database for Postgres {
    type Pool = PgPool;
    type Store = PgStore;
    type Outbox = PgOutbox;

    async fn create_business_tables(pool: &PgPool) -> Result<(), sqlx::Error> {
        sqlx::raw_sql(BUSINESS_TABLES)
            .execute(pool)
            .await
            .map(|_| ())
    }

    fn new(pool: PgPool, store: Self::Store, outbox: Self::Outbox) -> Self {
        Self {
            pool,
            store,
            outbox,
        }
    }

    fn store(&self) -> &PgStore {
        &self.store
    }

    fn outbox(&self) -> &PgOutbox {
        &self.outbox
    }

    fn classify(error: sqlx::Error) -> StoreError {
        idempotency_pg::store_error(error)
    }

    fn describe(&self) -> String {
        let options = self.pool.connect_options();
        format!(
            "PostgreSQL at {}:{} (database {})",
            options.get_host(),
            options.get_port(),
            options.get_database().unwrap_or("default")
        )
    }

    async fn insert_payment(
        conn: &mut PgConnection,
        payment: &Payment,
        recipient: &str,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO payments (payment_id, order_id, recipient, amount, status) \
             VALUES ($1::uuid, $2, $3, $4::numeric, $5)",
        )
        .persistent(persistent())
        .bind(payment.payment_id.to_string())
        .bind(&payment.order_id)
        .bind(recipient)
        .bind(payment.amount.to_string())
        .bind(&payment.status)
        .execute(conn)
        .await?;
        Ok(())
    }

    async fn insert_refund(conn: &mut PgConnection, refund: &Refund) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO refunds (refund_id, payment_id, amount, status) VALUES ($1::uuid, $2, $3::numeric, $4)",
        )
        .persistent(persistent())
        .bind(refund.refund_id.to_string())
        .bind(&refund.payment_id)
        .bind(refund.amount.to_string())
        .bind(&refund.status)
        .execute(conn)
        .await?;
        Ok(())
    }

    async fn insert_charge(
        conn: &mut PgConnection,
        id: Uuid,
        amount_cents: i64,
    ) -> Result<(), sqlx::Error> {
        sqlx::query("INSERT INTO charges (id, amount_cents) VALUES ($1::uuid, $2)")
            .persistent(persistent())
            .bind(id.to_string())
            .bind(amount_cents)
            .execute(conn)
            .await?;
        Ok(())
    }

    async fn find_charge(&self, id: Uuid) -> Result<Option<Charge>, sqlx::Error> {
        // In a transaction: behind a transaction pooler a statement on its own may be parsed
        // on one server connection and bound on another.
        let mut tx = idempotency_pg::begin(&self.pool).await?;
        let row: Option<(i64, DateTime<Utc>)> =
            sqlx::query_as("SELECT amount_cents, created_at FROM charges WHERE id = $1::uuid")
                .persistent(persistent())
                .bind(id.to_string())
                .fetch_optional(&mut *tx)
                .await?;
        tx.commit().await?;
        Ok(row.map(|(amount_cents, created_at)| Charge {
            id,
            amount_cents,
            created_at: created_at.to_rfc3339_opts(SecondsFormat::Millis, true),
        }))
    }

    async fn charges_without_event(&self, window_secs: i64) -> Result<i64, sqlx::Error> {
        let sql = format!(
            "SELECT count(*) FROM charges c WHERE c.created_at > now() - make_interval(secs => $1) \
             AND NOT EXISTS (SELECT 1 FROM {} o WHERE o.aggregate_type = 'charge' \
             AND o.aggregate_id = c.id::text AND o.event_type = 'ChargeCreated')",
            self.outbox.table().quoted()
        );
        let mut tx = idempotency_pg::begin(&self.pool).await?;
        let count = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .persistent(persistent())
            .bind(window_secs as f64)
            .fetch_one(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(count)
    }

    async fn ping(&self) -> Result<(), sqlx::Error> {
        // The simple protocol: one exchange, whatever stands in front of the server.
        sqlx::raw_sql("SELECT 1")
            .execute(&self.pool)
            .await
            .map(|_| ())
    }
}
