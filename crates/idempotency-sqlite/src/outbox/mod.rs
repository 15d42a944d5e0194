//! The transactional outbox on SQLite: [`SqliteOutbox`], its statements and its schema.

pub(crate) mod error;
pub(crate) mod row;
pub(crate) mod schema;
pub(crate) mod statements;
mod store;

use std::sync::Arc;

use idempotency_core::config::SchemaMode;
use idempotency_outbox::config::{Ordering, OutboxConfig};
use idempotency_outbox::{Error, NewEvent, SchemaProblem};
use sqlx::{Connection, SqliteConnection, SqlitePool};
use uuid::Uuid;

pub(crate) use error::{from_crate_error, outbox_error};
pub(crate) use row::millis;
pub use schema::{OUTBOX_DDL_TEMPLATE, outbox_ddl};
pub(crate) use statements::sql as statements_sql;

use crate::table::TableName;
use crate::transaction_end::{self, TransactionEnded};
use schema::Names;
use statements::Statements;

/// Wraps a multi-statement enqueue: a failure undoes the counters it bumped, and the caller's
/// transaction goes on as if the call had not happened (SQLite undoes only the failed
/// statement otherwise).
const SAVEPOINT: &str = "SAVEPOINT idempotency_outbox_enqueue";
const RELEASE: &str = "RELEASE idempotency_outbox_enqueue";
const ROLLBACK_TO: &str = "ROLLBACK TO idempotency_outbox_enqueue";

/// The SQLite outbox: enqueue through the caller's connection, in the caller's transaction, and
/// the store a [`Relay`](idempotency_outbox::Relay) claims from. Cheap to clone: the pool and
/// the statements are shared.
///
/// Relays find new rows by polling only (`listen` returns `None`: SQLite has no
/// `LISTEN`/`NOTIFY`), and one relay worker is enough (see the crate docs).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = std::env::temp_dir().join(format!("idempotency-sqlite-outbox-doc-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir)?;
/// # let path = dir.join("app.db");
/// use idempotency_sqlite::SqliteOutbox;
/// use idempotency_core::config::SchemaMode;
/// use idempotency_outbox::NewEvent;
/// use idempotency_outbox::config::OutboxConfig;
///
/// let options = idempotency_sqlite::connect_options(path.to_str().ok_or("path")?)?;
/// let pool = idempotency_sqlite::open_pool(options).await?;
/// let mut config = OutboxConfig::default();
/// config.schema.mode = SchemaMode::Create;
/// let outbox = SqliteOutbox::from_config(pool.clone(), &config).await?;
///
/// let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
/// // ... business statements on &mut *tx ...
/// let event = NewEvent::new("charge", "ch_1", "ChargeCreated", &serde_json::json!({"amountCents": 4900}))?;
/// let id = outbox.enqueue(&mut tx, &event).await?;
/// tx.commit().await?; // the event becomes visible to the relay's next poll
/// # assert_eq!(id, event.id());
/// # pool.close().await;
/// # let _ = std::fs::remove_dir_all(&dir);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct SqliteOutbox {
    pool: SqlitePool,
    names: Arc<Names>,
    ordering: Ordering,
    sql: Arc<Statements>,
}

impl SqliteOutbox {
    /// An outbox on `table` (its counters in `<table>_sequences`) with the given ordering; the
    /// schema is not touched. Fails when `table` is longer than 47 bytes (the names derived from
    /// it, up to `<table>_dead_letter_idx`, must fit 63 bytes, as on PostgreSQL).
    pub fn with_options(
        pool: SqlitePool,
        table: TableName,
        ordering: Ordering,
    ) -> Result<Self, Error> {
        let names = Names::new(table)?;
        Ok(Self {
            pool,
            sql: Arc::new(Statements::new(&names)),
            names: Arc::new(names),
            ordering,
        })
    }

    /// An outbox configured by the `outbox` section: validates `table-name` (`name` or
    /// `main.name`), takes `ordering`, then applies `schema.mode`. `notify-channel` has no
    /// meaning on SQLite and is ignored; the relay settings are read by the
    /// [`Relay`](idempotency_outbox::Relay).
    pub async fn from_config(pool: SqlitePool, config: &OutboxConfig) -> Result<Self, Error> {
        let table = TableName::parse(&config.table_name).map_err(from_crate_error)?;
        let outbox = Self::with_options(pool, table, config.ordering)?;
        outbox.apply_schema(config.schema.mode).await?;
        Ok(outbox)
    }

    /// `create` runs the canonical DDL, `validate` checks the tables, `none` does nothing.
    pub async fn apply_schema(&self, mode: SchemaMode) -> Result<(), Error> {
        match mode {
            SchemaMode::Create => self.create_schema().await,
            SchemaMode::Validate => self.validate_schema().await,
            SchemaMode::None => Ok(()),
        }
    }

    /// Runs the canonical DDL ([`outbox_ddl`](crate::outbox_ddl)) in one `BEGIN IMMEDIATE`
    /// transaction; safe to run again and from several instances at once.
    pub async fn create_schema(&self) -> Result<(), Error> {
        schema::create(&self.pool, schema::ddl_for(&self.names)).await
    }

    /// Checks both tables (columns and their type affinity, nullability, the keys and the
    /// indexes the queries rely on), failing with [`Error::Schema`] naming every difference.
    pub async fn validate_schema(&self) -> Result<(), Error> {
        schema::check(&self.names.table, self.schema_problems().await?)
    }

    /// Every difference between the tables and the canonical schema (empty when they match).
    pub async fn schema_problems(&self) -> Result<Vec<SchemaProblem>, Error> {
        let mut problems = schema::problems(&self.pool, &self.names.table, &schema::OUTBOX).await?;
        problems
            .extend(schema::problems(&self.pool, &self.names.sequences, &schema::SEQUENCES).await?);
        Ok(problems)
    }

    /// Writes `event` through `conn`, in the caller's transaction; returns its id.
    ///
    /// `conn` is any SQLite connection in a transaction: `&mut sqlx::Transaction`,
    /// [`SqliteTx`](crate::SqliteTx), the connection an `execute` action receives (all
    /// dereference to `SqliteConnection`). Rolled back with it; visible to relays at commit. A
    /// connection outside a transaction is refused with [`Error::NotInTransaction`] (the event
    /// would commit on its own).
    pub async fn enqueue(
        &self,
        conn: &mut SqliteConnection,
        event: &NewEvent,
    ) -> Result<Uuid, Error> {
        self.enqueue_all(conn, std::slice::from_ref(event))
            .await
            .map(|ids| ids.first().copied().unwrap_or(event.id()))
    }

    /// Writes `events` in the caller's transaction; returns their ids, in order.
    ///
    /// Every event is checked first (names, headers, JSON payload): nothing is written when
    /// one is invalid. In `ordered` mode each aggregate's events take the next numbers of its
    /// counter in the order given; the counter is bumped in the caller's transaction, which
    /// holds SQLite's write lock from its first write to its end, so sequence order is commit
    /// order. Begin such transactions with `BEGIN IMMEDIATE` (a deferred transaction that read
    /// first may fail with a retryable [`Error::Conflict`] when another writer committed in
    /// between).
    ///
    /// Fails with [`Error::NotInTransaction`], before writing, when `conn` is not in a
    /// transaction begun through sqlx (`begin`, `begin_with`, [`SqliteTx`](crate::SqliteTx), an
    /// `execute` action's connection): a `BEGIN` sent as plain SQL is not seen. Fails with
    /// [`Error::Database`], writing nothing, when a statement of the caller had rolled the
    /// transaction back (`INSERT OR ROLLBACK`, `RAISE(ROLLBACK)`, a full disk): the events
    /// would otherwise commit on their own. That error is not retryable: the caller's
    /// statements after the one that ended the transaction committed one by one. Roll back
    /// after it: the check began a transaction again, and a later write in it is not refused.
    pub async fn enqueue_all(
        &self,
        conn: &mut SqliteConnection,
        events: &[NewEvent],
    ) -> Result<Vec<Uuid>, Error> {
        if !conn.is_in_transaction() {
            return Err(Error::NotInTransaction {
                operation: "enqueue",
            });
        }
        if events.is_empty() {
            return Ok(Vec::new());
        }
        let json = row::events_json(events)?;
        // A statement that rolled the caller's transaction back left `conn` in autocommit,
        // where these inserts would commit on their own, without the change they announce.
        if transaction_end::ended(conn).await.map_err(outbox_error)? {
            return Err(Error::Database(Box::new(TransactionEnded)));
        }
        self.write(conn, &json).await?;
        Ok(events.iter().map(NewEvent::id).collect())
    }

    /// The inserts of [`enqueue_all`](Self::enqueue_all): in `ordered` mode under a savepoint
    /// that undoes the counters when they fail.
    async fn write(&self, conn: &mut SqliteConnection, json: &str) -> Result<(), Error> {
        match self.ordering {
            Ordering::Unordered => {
                sqlx::query(self.sql.insert_unordered.clone())
                    .bind(json)
                    .execute(&mut *conn)
                    .await
                    .map_err(outbox_error)?;
            }
            Ordering::Ordered => {
                sqlx::raw_sql(SAVEPOINT)
                    .execute(&mut *conn)
                    .await
                    .map_err(outbox_error)?;
                match self.insert_ordered(conn, json).await {
                    Ok(()) => {
                        sqlx::raw_sql(RELEASE)
                            .execute(&mut *conn)
                            .await
                            .map_err(outbox_error)?;
                    }
                    Err(error) => {
                        // Undo the counters, then leave the savepoint; the caller's
                        // transaction stays usable. The first error is the one reported.
                        let undo = sqlx::raw_sql(ROLLBACK_TO).execute(&mut *conn).await;
                        if undo.is_ok() {
                            let _ = sqlx::raw_sql(RELEASE).execute(&mut *conn).await;
                        }
                        return Err(error);
                    }
                }
            }
        }
        Ok(())
    }

    async fn insert_ordered(&self, conn: &mut SqliteConnection, json: &str) -> Result<(), Error> {
        sqlx::query(self.sql.bump_sequences.clone())
            .bind(json)
            .execute(&mut *conn)
            .await
            .map_err(outbox_error)?;
        sqlx::query(self.sql.insert_ordered.clone())
            .bind(json)
            .execute(&mut *conn)
            .await
            .map_err(outbox_error)?;
        Ok(())
    }

    /// The pool.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// The outbox table.
    pub fn table(&self) -> &TableName {
        &self.names.table
    }

    /// The per-aggregate counter table, `<table>_sequences`.
    pub fn sequences_table(&self) -> &TableName {
        &self.names.sequences
    }

    /// The ordering enqueue uses.
    pub fn ordering(&self) -> Ordering {
        self.ordering
    }
}
