//! [`PgInbox`]: consumer-side deduplication on PostgreSQL.

use std::sync::Arc;
use std::time::Duration;

use idempotency_core::config::SchemaMode;
use sqlx::{PgConnection, PgPool, SqlStr};
use uuid::Uuid;

use crate::outbox::error::outbox_error;
use crate::outbox::schema::{self, Column, Index, TEXT, TIME, col};
use crate::outbox::statements::sql;
use crate::pooler::{Own, Pooler};
use crate::table::TableName;
use idempotency_outbox::config::InboxConfig;
use idempotency_outbox::store::Inbox;
use idempotency_outbox::{Error, SchemaProblem};

/// The inbox DDL template: `{inbox}` and `{inbox_index}` are replaced by quoted names.
pub const INBOX_DDL_TEMPLATE: &str = include_str!("ddl.sql");

/// The canonical inbox DDL for `table`.
pub fn inbox_ddl(table: &TableName) -> String {
    INBOX_DDL_TEMPLATE
        .replace("{inbox}", table.quoted())
        .replace("{inbox_index}", &table.derived("received_at_idx"))
}

const INBOX_COLUMNS: &[Column] = &[
    col("consumer", TEXT, "varchar(255)", false),
    col("message_id", TEXT, "varchar(255)", false),
    col("received_at", TIME, "timestamptz", false),
];

const INBOX_INDEXES: &[Index] = &[
    Index {
        purpose: "primary key on (consumer, message_id)",
        columns: &["consumer", "message_id"],
        unique: true,
        partial: false,
    },
    Index {
        purpose: "by (received_at), used by purge",
        columns: &["received_at"],
        unique: false,
        partial: false,
    },
];

#[derive(Debug)]
struct Statements {
    record: SqlStr,
    purge: SqlStr,
}

/// The consumer inbox: `(consumer, message id)` recorded in the consumer's own transaction,
/// so a redelivered message is processed once.
///
/// ```no_run
/// # async fn demo(pool: sqlx::PgPool, message_id: uuid::Uuid) -> Result<(), Box<dyn std::error::Error>> {
/// use idempotency_pg::PgInbox;
/// use idempotency_outbox::config::InboxConfig;
///
/// let inbox = PgInbox::from_config(pool.clone(), &InboxConfig::default()).await?;
/// let mut tx = idempotency_pg::begin(&pool).await?; // pool.begin(), safe to cancel
/// if inbox.record_id(&mut tx, "billing-projector", message_id).await? {
///     // first time: apply the message's effects on &mut *tx
/// }
/// tx.commit().await?; // then ack the broker delivery
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct PgInbox {
    pool: PgPool,
    table: Arc<TableName>,
    sql: Arc<Statements>,
    pooler: Pooler,
}

impl PgInbox {
    /// An inbox on `table`; the schema is not touched.
    pub fn with_table(pool: PgPool, table: TableName) -> Self {
        let t = table.quoted();
        let sql = Statements {
            record: sql(format!(
                "INSERT INTO {t} (consumer, message_id) VALUES ($1, $2) ON CONFLICT DO NOTHING"
            )),
            purge: sql(format!(
                "WITH doomed AS ( \
                     SELECT consumer, message_id FROM {t} \
                     WHERE received_at < clock_timestamp() - $1 \
                     ORDER BY received_at LIMIT $2 FOR UPDATE SKIP LOCKED) \
                 DELETE FROM {t} AS i USING doomed AS d \
                 WHERE i.consumer = d.consumer AND i.message_id = d.message_id"
            )),
        };
        Self {
            pool,
            table: Arc::new(table),
            sql: Arc::new(sql),
            pooler: Pooler::None,
        }
    }

    /// This inbox for a pool behind `pooler`: with [`Pooler::Transaction`] (PgBouncer's
    /// `pool_mode = transaction`) its statements are unnamed, and the purge runs in a
    /// transaction of its own (see [`PgStore::with_pooler`](crate::PgStore::with_pooler)).
    ///
    /// ```
    /// # fn demo(pool: sqlx::PgPool) -> Result<(), idempotency_pg::Error> {
    /// use idempotency_pg::{PgInbox, Pooler, TableName};
    ///
    /// let inbox = PgInbox::with_table(pool, TableName::parse("inbox")?).with_pooler(Pooler::Transaction);
    /// assert_eq!(inbox.pooler(), Pooler::Transaction);
    /// # Ok(()) }
    /// ```
    pub fn with_pooler(mut self, pooler: Pooler) -> Self {
        self.pooler = pooler;
        self
    }

    /// What stands between the pool and the database.
    pub fn pooler(&self) -> Pooler {
        self.pooler
    }

    /// An inbox configured by the `inbox` section: validates `table-name`, applies
    /// `schema.mode`.
    pub async fn from_config(pool: PgPool, config: &InboxConfig) -> Result<Self, Error> {
        Self::from_config_with_pooler(pool, config, Pooler::None).await
    }

    /// [`from_config`](Self::from_config) for a pool behind `pooler`
    /// ([`with_pooler`](Self::with_pooler)), which the schema's statements need already.
    pub async fn from_config_with_pooler(
        pool: PgPool,
        config: &InboxConfig,
        pooler: Pooler,
    ) -> Result<Self, Error> {
        let inbox = Self::with_table(
            pool,
            TableName::parse(&config.table_name).map_err(crate::outbox::error::from_crate_error)?,
        )
        .with_pooler(pooler);
        match config.schema.mode {
            SchemaMode::Create => inbox.create_schema().await?,
            SchemaMode::Validate => inbox.validate_schema().await?,
            SchemaMode::None => {}
        }
        Ok(inbox)
    }

    /// Runs the canonical DDL ([`inbox_ddl`](crate::inbox_ddl)).
    pub async fn create_schema(&self) -> Result<(), Error> {
        let objects = [
            self.table.quoted().to_owned(),
            self.table.sibling("received_at_idx").quoted().to_owned(),
        ];
        schema::create(
            &self.pool,
            self.pooler,
            &self.table,
            &objects,
            inbox_ddl(&self.table),
        )
        .await
    }

    /// Checks the table, failing with [`Error::Schema`] naming every difference.
    pub async fn validate_schema(&self) -> Result<(), Error> {
        let problems = self.schema_problems().await?;
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Error::Schema {
                table: self.table.to_string(),
                problems,
            })
        }
    }

    /// Every difference between the table and the canonical schema.
    pub async fn schema_problems(&self) -> Result<Vec<SchemaProblem>, Error> {
        schema::problems(
            &self.pool,
            self.pooler,
            &self.table,
            INBOX_COLUMNS,
            INBOX_INDEXES,
        )
        .await
    }

    /// Records `(consumer, message_id)` in the caller's transaction; `true` when new.
    ///
    /// Fails with [`Error::NotInTransaction`], before writing, when `conn` is not in a
    /// transaction begun through sqlx: the entry would commit without the consumer's effects,
    /// and a crash in between would lose the message.
    pub async fn record(
        &self,
        conn: &mut PgConnection,
        consumer: &str,
        message_id: &str,
    ) -> Result<bool, Error> {
        crate::outbox::require_transaction(conn, "inbox record")?;
        if consumer.is_empty() || consumer.chars().count() > 255 {
            return Err(Error::InvalidEvent {
                reason: "the consumer name must have 1..=255 characters".to_owned(),
            });
        }
        if message_id.is_empty() || message_id.chars().count() > 255 {
            return Err(Error::InvalidEvent {
                reason: "the message id must have 1..=255 characters".to_owned(),
            });
        }
        // PostgreSQL's text refuses NUL (`22021`): the message's fault, not the database's.
        for (what, value) in [("consumer name", consumer), ("message id", message_id)] {
            if value.contains('\0') {
                return Err(Error::InvalidEvent {
                    reason: format!("the {what} holds a NUL character"),
                });
            }
        }
        let inserted = sqlx::query(self.sql.record.clone())
            .persistent(crate::pooler::persistent(self.pooler))
            .bind(consumer)
            .bind(message_id)
            .execute(&mut *conn)
            .await
            .map_err(outbox_error)?
            .rows_affected();
        Ok(inserted == 1)
    }

    /// [`record`](Self::record) for an outbox message id.
    pub async fn record_id(
        &self,
        conn: &mut PgConnection,
        consumer: &str,
        message_id: Uuid,
    ) -> Result<bool, Error> {
        self.record(conn, consumer, &message_id.to_string()).await
    }

    /// Deletes entries older than `older_than` in batches of `batch_size` until a batch comes
    /// back short; returns how many.
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

    /// The table.
    pub fn table(&self) -> &TableName {
        &self.table
    }
}

impl Inbox for PgInbox {
    type Connection = PgConnection;

    async fn record(
        &self,
        conn: &mut PgConnection,
        consumer: &str,
        message_id: &str,
    ) -> Result<bool, Error> {
        PgInbox::record(self, conn, consumer, message_id).await
    }

    async fn purge(&self, older_than: Duration, limit: u32) -> Result<u64, Error> {
        // READ COMMITTED, as every `SKIP LOCKED` batch (see `Own::read_committed`).
        let mut own = Own::read_committed(&self.pool)
            .await
            .map_err(outbox_error)?;
        let deleted = sqlx::query(self.sql.purge.clone())
            .persistent(crate::pooler::persistent(self.pooler))
            .bind(older_than)
            .bind(i64::from(limit))
            .execute(&mut *own)
            .await
            .map_err(outbox_error)?
            .rows_affected();
        own.finish().await.map_err(outbox_error)?;
        Ok(deleted)
    }
}
