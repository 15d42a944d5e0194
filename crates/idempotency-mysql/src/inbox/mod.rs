//! [`MysqlInbox`]: consumer-side deduplication on MySQL / MariaDB.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use idempotency_core::config::SchemaMode;
use idempotency_outbox::config::InboxConfig;
use idempotency_outbox::store::Inbox;
use idempotency_outbox::{Error, SchemaProblem};
use sqlx::{Connection, MySqlConnection, MySqlPool, SqlStr};
use uuid::Uuid;

use crate::clock::{NOW, micros};
use crate::connect::{self, IN_TRANSACTION_ONLY, begin_read_committed, in_transaction};
use crate::outbox::schema::{self, Index, Shape, name_col, time_col};
use crate::outbox::{from_crate_error, in_transaction_error, outbox_error, refuse_trailing_space};
use crate::records::sql;
use crate::table::TableName;

/// The inbox DDL template: `{inbox}` is replaced by the quoted name.
pub const INBOX_DDL_TEMPLATE: &str = include_str!("ddl.sql");

/// The canonical inbox DDL for `table`.
///
/// ```
/// let table = idempotency_mysql::TableName::parse("inbox")?;
/// let ddl = idempotency_mysql::inbox_ddl(&table);
/// assert!(ddl.contains("CREATE TABLE IF NOT EXISTS `inbox`"));
/// # Ok::<(), idempotency_mysql::Error>(())
/// ```
pub fn inbox_ddl(table: &TableName) -> String {
    INBOX_DDL_TEMPLATE.replace("{inbox}", table.quoted())
}

const INBOX: Shape = Shape {
    columns: &[
        name_col("consumer"),
        name_col("message_id"),
        time_col("received_at", false),
    ],
    key: &["consumer", "message_id"],
    key_purpose: "primary key on (consumer, message_id)",
    indexes: &[Index {
        purpose: "on (received_at), used by purge",
        columns: &["received_at"],
    }],
};

/// The longest consumer name and message id stored.
const MAX_LEN: usize = 255;

#[derive(Debug)]
struct Statements {
    /// MySQL 8's record, after `connect::ensure_open`.
    record: SqlStr,
    /// MariaDB's: the consumer bound through `connect::IN_TRANSACTION_ONLY`, so that it fails
    /// when the caller's transaction ended before it.
    record_mariadb: SqlStr,
    old: SqlStr,
    table: String,
}

/// The consumer inbox: `(consumer, message id)` recorded in the consumer's own transaction,
/// so a redelivered message is processed once.
///
/// A second transaction recording the same pair waits on the first one's row lock (up to the
/// session's `innodb_lock_wait_timeout`) until it ends, then sees `false` if it committed,
/// `true` if it rolled back.
///
/// ```no_run
/// # async fn demo(pool: sqlx::MySqlPool, message_id: uuid::Uuid) -> Result<(), Box<dyn std::error::Error>> {
/// use idempotency_mysql::MysqlInbox;
/// use idempotency_outbox::config::InboxConfig;
///
/// let inbox = MysqlInbox::from_config(pool.clone(), &InboxConfig::default()).await?;
/// let mut tx = idempotency_mysql::begin(&pool).await?; // pool.begin(), safe to cancel
/// if inbox.record_id(&mut tx, "billing-projector", message_id).await? {
///     // first time: apply the message's effects on &mut *tx
/// }
/// tx.commit().await?; // then ack the broker delivery
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct MysqlInbox {
    pool: MySqlPool,
    table: Arc<TableName>,
    sql: Arc<Statements>,
    /// Whether the server is MariaDB, asked at the first record.
    mariadb: Arc<OnceLock<bool>>,
}

impl MysqlInbox {
    /// An inbox on `table`; the schema is not touched.
    pub fn with_table(pool: MySqlPool, table: TableName) -> Result<Self, Error> {
        let t = table.quoted();
        let record = format!(
            "INSERT INTO {t} (consumer, message_id, received_at) VALUES ({{consumer}}, ?, {NOW}) \
             ON DUPLICATE KEY UPDATE received_at = IF(LAST_INSERT_ID(1), received_at, \
                                                      received_at)"
        );
        let sql = Statements {
            // The records store's duplicate marker: `LAST_INSERT_ID(1)` runs only on a
            // duplicate key, whose row stays as it was.
            record: sql(record.replace("{consumer}", "?")),
            record_mariadb: sql(record.replace("{consumer}", IN_TRANSACTION_ONLY)),
            old: sql(format!(
                "SELECT consumer, message_id FROM {t} \
                 WHERE received_at < {NOW} - INTERVAL ? MICROSECOND \
                 ORDER BY received_at LIMIT ? FOR UPDATE SKIP LOCKED"
            )),
            table: t.to_owned(),
        };
        Ok(Self {
            pool,
            table: Arc::new(table),
            sql: Arc::new(sql),
            mariadb: Arc::default(),
        })
    }

    /// An inbox configured by the `inbox` section: validates `table-name`, refuses servers
    /// older than MySQL 8.0.16 or MariaDB 10.6, applies `schema.mode`.
    pub async fn from_config(pool: MySqlPool, config: &InboxConfig) -> Result<Self, Error> {
        let table = TableName::parse(&config.table_name).map_err(from_crate_error)?;
        let inbox = Self::with_table(pool, table)?;
        connect::check_server(&inbox.pool)
            .await
            .map_err(from_crate_error)?;
        match config.schema.mode {
            SchemaMode::Create => inbox.create_schema().await?,
            SchemaMode::Validate => inbox.validate_schema().await?,
            SchemaMode::None => {}
        }
        Ok(inbox)
    }

    /// Runs the canonical DDL ([`inbox_ddl`](crate::inbox_ddl)).
    pub async fn create_schema(&self) -> Result<(), Error> {
        schema::create(&self.pool, &inbox_ddl(&self.table)).await
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
    /// the message), `false` for a redelivery (skip it). Both must have 1 to 255 characters
    /// and must not end with a space ([`Error::InvalidEvent`]: the PAD SPACE collation of
    /// `utf8mb4_bin` would merge `m-1 ` with `m-1`).
    ///
    /// Fails with [`Error::NotInTransaction`], before writing, when `conn` is not in a
    /// transaction begun through sqlx: the entry would commit without the consumer's effects.
    /// Fails with a retryable [`Error::Conflict`] whose source is
    /// [`TransactionRolledBack`](crate::TransactionRolledBack), the connection closed, when the
    /// server ended that transaction before or during the record (a deadlock of one of the
    /// consumer's own statements): retry the whole transaction.
    pub async fn record(
        &self,
        conn: &mut MySqlConnection,
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
            refuse_trailing_space(what, value)?;
        }
        // The caller's transaction may have ended before (one of its own statements
        // deadlocked): the record must then fail, not commit on its own. MariaDB's statement
        // checks it itself; MySQL 8 is asked first (one round trip).
        let statement = if self.is_mariadb(conn).await? {
            self.sql.record_mariadb.clone()
        } else {
            connect::ensure_open(conn, None)
                .await
                .map_err(in_transaction_error)?;
            self.sql.record.clone()
        };
        let result = sqlx::query(statement)
            .bind(consumer)
            .bind(message_id)
            .execute(&mut *conn)
            .await;
        let result = in_transaction(conn, result)
            .await
            .map_err(in_transaction_error)?;
        Ok(result.last_insert_id() != 1)
    }

    /// Whether the server is MariaDB, asked once on `conn`.
    async fn is_mariadb(&self, conn: &mut MySqlConnection) -> Result<bool, Error> {
        if let Some(mariadb) = self.mariadb.get() {
            return Ok(*mariadb);
        }
        let server = connect::Server::ask(conn).await.map_err(outbox_error)?;
        Ok(*self.mariadb.get_or_init(|| server.mariadb))
    }

    /// [`record`](Self::record) for an outbox message id.
    pub async fn record_id(
        &self,
        conn: &mut MySqlConnection,
        consumer: &str,
        message_id: Uuid,
    ) -> Result<bool, Error> {
        self.record(conn, consumer, &message_id.to_string()).await
    }

    /// Deletes entries older than `older_than` in batches of `batch_size` (each one short
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
    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    /// The table.
    pub fn table(&self) -> &TableName {
        &self.table
    }
}

impl Inbox for MysqlInbox {
    type Connection = MySqlConnection;

    async fn record(
        &self,
        conn: &mut MySqlConnection,
        consumer: &str,
        message_id: &str,
    ) -> Result<bool, Error> {
        MysqlInbox::record(self, conn, consumer, message_id).await
    }

    /// One short READ COMMITTED transaction: at most `limit` old entries, `SKIP LOCKED`,
    /// deleted by primary key.
    async fn purge(&self, older_than: Duration, limit: u32) -> Result<u64, Error> {
        let mut tx = begin_read_committed(&self.pool)
            .await
            .map_err(outbox_error)?;
        let keys: Vec<(String, String)> = sqlx::query_as(self.sql.old.clone())
            .bind(micros(older_than))
            .bind(i64::from(limit))
            .fetch_all(&mut *tx)
            .await
            .map_err(outbox_error)?;
        let mut deleted = 0;
        for chunk in keys.chunks(crate::CHUNK) {
            let rows = vec!["(?, ?)"; chunk.len()].join(", ");
            let mut delete = sqlx::query(sql(format!(
                "DELETE FROM {} WHERE (consumer, message_id) IN ({rows})",
                self.sql.table
            )));
            for (consumer, message_id) in chunk {
                delete = delete.bind(consumer).bind(message_id);
            }
            deleted += delete
                .execute(&mut *tx)
                .await
                .map_err(outbox_error)?
                .rows_affected();
        }
        tx.commit().await.map_err(outbox_error)?;
        Ok(deleted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The MySQL 8 path, run on whatever server the tests have (MySQL 8 itself is not among
    /// them): a record in a transaction the server ended (a `ROLLBACK` sent as plain SQL leaves
    /// the session as a deadlock does) fails instead of committing on its own; in an open
    /// transaction it records.
    #[tokio::test]
    async fn the_mysql_8_record_refuses_a_transaction_the_server_ended() {
        let pool = idempotency_testing::mysql_pool_with(1).await;
        let mut config = InboxConfig::default();
        config.schema.mode = SchemaMode::Create;
        let inbox = MysqlInbox::from_config(pool.clone(), &config)
            .await
            .unwrap();
        let _ = inbox.mariadb.set(false);
        let mut tx = connect::begin(&pool).await.unwrap();
        sqlx::raw_sql("ROLLBACK").execute(&mut *tx).await.unwrap();
        let error = inbox.record(&mut tx, "consumer", "m-1").await.unwrap_err();
        let Error::Conflict(source) = &error else {
            panic!("not a conflict: {error:?}");
        };
        assert!(source.is::<crate::TransactionRolledBack>(), "{source:?}");
        drop(tx);
        let mut tx = connect::begin(&pool).await.unwrap();
        assert!(inbox.record(&mut tx, "consumer", "m-2").await.unwrap());
        tx.commit().await.unwrap();
        let ids: Vec<String> = sqlx::query_scalar("SELECT message_id FROM inbox")
            .fetch_all(&pool)
            .await
            .unwrap();
        assert_eq!(ids, ["m-2"], "only the record in an open transaction");
    }
}
