//! [`SqliteInbox`]: consumer-side deduplication on SQLite.

use std::sync::Arc;
use std::time::Duration;

use idempotency_core::config::SchemaMode;
use idempotency_outbox::config::InboxConfig;
use idempotency_outbox::store::Inbox;
use idempotency_outbox::{Error, SchemaProblem};
use sqlx::{Connection, SqlStr, SqliteConnection, SqlitePool};
use uuid::Uuid;

use crate::clock::NOW_MS;
use crate::introspect::Affinity;
use crate::outbox::schema::{self, Index, Shape, col};
use crate::outbox::{from_crate_error, millis, outbox_error, statements_sql};
use crate::table::TableName;
use crate::transaction_end::{self, TransactionEnded};

/// The inbox DDL template: `{inbox}` and `{inbox_index}` are replaced by quoted names.
pub const INBOX_DDL_TEMPLATE: &str = include_str!("ddl.sql");

/// The canonical inbox DDL for `table`.
///
/// ```
/// let table = idempotency_sqlite::TableName::parse("inbox")?;
/// let ddl = idempotency_sqlite::inbox_ddl(&table);
/// assert!(ddl.contains(r#"CREATE TABLE IF NOT EXISTS "inbox""#));
/// # Ok::<(), idempotency_sqlite::Error>(())
/// ```
pub fn inbox_ddl(table: &TableName) -> String {
    INBOX_DDL_TEMPLATE
        .replace("{inbox}", table.quoted())
        .replace("{inbox_index}", &table.derived("received_at_idx"))
}

const INBOX: Shape = Shape {
    columns: &[
        col("consumer", Affinity::Text, false),
        col("message_id", Affinity::Text, false),
        col("received_at", Affinity::Integer, false),
    ],
    key: &["consumer", "message_id"],
    key_purpose: "primary key on (consumer, message_id), BINARY collation",
    indexes: &[Index {
        purpose: "by (received_at), used by purge",
        columns: &["received_at"],
        partial: false,
    }],
};

/// The longest consumer name and message id stored.
const MAX_LEN: usize = 255;

#[derive(Debug)]
struct Statements {
    record: SqlStr,
    purge: SqlStr,
}

/// The consumer inbox: `(consumer, message id)` recorded in the consumer's own transaction,
/// so a redelivered message is processed once.
///
/// SQLite has one writer at a time: a second transaction recording the same pair waits for the
/// write lock (at `BEGIN IMMEDIATE`, or at its first write) until the first one ends, then sees
/// `false` if it committed, `true` if it rolled back.
///
/// ```no_run
/// # async fn demo(pool: sqlx::SqlitePool, message_id: uuid::Uuid) -> Result<(), Box<dyn std::error::Error>> {
/// use idempotency_sqlite::SqliteInbox;
/// use idempotency_outbox::config::InboxConfig;
///
/// let inbox = SqliteInbox::from_config(pool.clone(), &InboxConfig::default()).await?;
/// let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
/// if inbox.record_id(&mut tx, "billing-projector", message_id).await? {
///     // first time: apply the message's effects on &mut *tx
/// }
/// tx.commit().await?; // then ack the broker delivery
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct SqliteInbox {
    pool: SqlitePool,
    table: Arc<TableName>,
    sql: Arc<Statements>,
}

impl SqliteInbox {
    /// An inbox on `table`; the schema is not touched. Fails when `table` is longer than 47
    /// bytes (its index is named after it and must fit 63 bytes, as on PostgreSQL).
    pub fn with_table(pool: SqlitePool, table: TableName) -> Result<Self, Error> {
        schema::check_room(&table, "inbox table name")?;
        let t = table.quoted();
        let sql = Statements {
            record: statements_sql(format!(
                "INSERT INTO {t} (consumer, message_id, received_at) VALUES (?1, ?2, {NOW_MS}) \
                 ON CONFLICT (consumer, message_id) DO NOTHING"
            )),
            purge: statements_sql(format!(
                "DELETE FROM {t} WHERE (consumer, message_id) IN ( \
                     SELECT consumer, message_id FROM {t} WHERE received_at < {NOW_MS} - ?1 \
                     ORDER BY received_at LIMIT ?2)"
            )),
        };
        Ok(Self {
            pool,
            table: Arc::new(table),
            sql: Arc::new(sql),
        })
    }

    /// An inbox configured by the `inbox` section: validates `table-name` (`name` or
    /// `main.name`), applies `schema.mode`.
    pub async fn from_config(pool: SqlitePool, config: &InboxConfig) -> Result<Self, Error> {
        let table = TableName::parse(&config.table_name).map_err(from_crate_error)?;
        let inbox = Self::with_table(pool, table)?;
        match config.schema.mode {
            SchemaMode::Create => inbox.create_schema().await?,
            SchemaMode::Validate => inbox.validate_schema().await?,
            SchemaMode::None => {}
        }
        Ok(inbox)
    }

    /// Runs the canonical DDL ([`inbox_ddl`](crate::inbox_ddl)) in one `BEGIN IMMEDIATE`
    /// transaction.
    pub async fn create_schema(&self) -> Result<(), Error> {
        schema::create(&self.pool, inbox_ddl(&self.table)).await
    }

    /// Checks the table, failing with [`Error::Schema`] naming every difference.
    pub async fn validate_schema(&self) -> Result<(), Error> {
        schema::check(&self.table, self.schema_problems().await?)
    }

    /// Every difference between the table and the canonical schema.
    pub async fn schema_problems(&self) -> Result<Vec<SchemaProblem>, Error> {
        schema::problems(&self.pool, &self.table, &INBOX).await
    }

    /// Records `(consumer, message_id)` in the caller's transaction; `true` when new (process
    /// the message), `false` for a redelivery (skip it). Both must have 1 to 255 characters.
    ///
    /// Fails with [`Error::NotInTransaction`], before writing, when `conn` is not in a
    /// transaction begun through sqlx: the entry would commit without the consumer's effects.
    /// For the same reason fails with [`Error::Database`], writing nothing, when a statement
    /// of the caller had rolled the transaction back (`INSERT OR ROLLBACK`, `RAISE(ROLLBACK)`,
    /// a full disk); not retryable: the caller's statements after the one that ended the
    /// transaction committed one by one. Roll back after it: the check began a transaction
    /// again, and a later write in it is not refused.
    pub async fn record(
        &self,
        conn: &mut SqliteConnection,
        consumer: &str,
        message_id: &str,
    ) -> Result<bool, Error> {
        if !conn.is_in_transaction() {
            return Err(Error::NotInTransaction {
                operation: "inbox record",
            });
        }
        for (what, value) in [("consumer name", consumer), ("message id", message_id)] {
            if value.is_empty() || value.chars().count() > MAX_LEN {
                return Err(Error::InvalidEvent {
                    reason: format!("the {what} must have 1..={MAX_LEN} characters"),
                });
            }
            if value.contains('\0') {
                return Err(Error::InvalidEvent {
                    reason: format!("the {what} holds a NUL character"),
                });
            }
        }
        // A statement that rolled the caller's transaction back left `conn` in autocommit,
        // where the entry would commit on its own, without the consumer's effects.
        if transaction_end::ended(conn).await.map_err(outbox_error)? {
            return Err(Error::Database(Box::new(TransactionEnded)));
        }
        let inserted = sqlx::query(self.sql.record.clone())
            .bind(consumer)
            .bind(message_id)
            .execute(&mut *conn)
            .await;
        Ok(inserted.map_err(outbox_error)?.rows_affected() == 1)
    }

    /// [`record`](Self::record) for an outbox message id.
    pub async fn record_id(
        &self,
        conn: &mut SqliteConnection,
        consumer: &str,
        message_id: Uuid,
    ) -> Result<bool, Error> {
        self.record(conn, consumer, &message_id.to_string()).await
    }

    /// Deletes entries older than `older_than` in batches of `batch_size` (each one short write
    /// transaction) until a batch comes back short; returns how many.
    pub async fn purge_older_than(
        &self,
        older_than: Duration,
        batch_size: u32,
    ) -> Result<u64, Error> {
        let limit = batch_size.max(1);
        let mut total = 0;
        loop {
            let deleted = Inbox::purge(self, older_than, limit).await?;
            total += deleted;
            if deleted < u64::from(limit) {
                return Ok(total);
            }
        }
    }

    /// The pool.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// The table.
    pub fn table(&self) -> &TableName {
        &self.table
    }
}

impl Inbox for SqliteInbox {
    type Connection = SqliteConnection;

    async fn record(
        &self,
        conn: &mut SqliteConnection,
        consumer: &str,
        message_id: &str,
    ) -> Result<bool, Error> {
        SqliteInbox::record(self, conn, consumer, message_id).await
    }

    /// One `DELETE` of at most `limit` entries, its own short write transaction.
    async fn purge(&self, older_than: Duration, limit: u32) -> Result<u64, Error> {
        Ok(sqlx::query(self.sql.purge.clone())
            .bind(millis(older_than))
            .bind(i64::from(limit))
            .execute(&self.pool)
            .await
            .map_err(outbox_error)?
            .rows_affected())
    }
}
