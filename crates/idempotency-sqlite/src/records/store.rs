//! [`SqliteStore`]: the `IdempotencyStore` on SQLite.

use std::sync::Arc;

use idempotency_core::config::{PersistenceConfig, SchemaMode};
use idempotency_core::store::{
    Acquire, Claim, ExpiredCleanup, IdempotencyStore, InsertCompleted, StoreError,
};
use idempotency_core::trace::SpanRef;
use idempotency_core::{IdempotencyRecord, RecordId, StoredOutcome};
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{Sqlite, SqliteConnection, SqlitePool};

use super::row::{
    CompleteRow, FindRow, completed_record, parse_status, record_from_row, span_columns,
};
use super::schema;
use super::statements::Statements;
use crate::clock::ttl_millis;
use crate::connect::{self, BEGIN_IMMEDIATE};
use crate::error::{Error, SchemaProblem, in_transaction_error, store_error};
use crate::table::TableName;
use crate::transaction_end::{self, TransactionEnded};

/// The SQLite idempotency store.
///
/// Records live in one table (default `idempotency_records`, see [`ddl`](crate::ddl)), written
/// through the caller's transaction. Every transaction the store begins is `BEGIN IMMEDIATE`:
/// it takes SQLite's single write lock at once, so a concurrent duplicate waits at `begin`
/// (up to the busy timeout) and then finds the committed record. Cheap to clone: the pool and
/// the statements are shared.
///
/// ```
/// # async fn demo() -> Result<(), idempotency_sqlite::Error> {
/// use idempotency_sqlite::SqliteStore;
/// use idempotency_core::config::{PersistenceConfig, SchemaMode};
///
/// let mut config = PersistenceConfig::default(); // table name, schema mode
/// config.schema.mode = SchemaMode::Create;
/// let store = SqliteStore::connect("data/app.db", &config).await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    table: Arc<TableName>,
    sql: Arc<Statements>,
}

impl SqliteStore {
    /// A store on the default table `idempotency_records`; the schema is not touched.
    ///
    /// Open the pool with [`open_pool`](crate::open_pool) on
    /// [`connect_options`](crate::connect_options) (WAL, busy timeout, `create_if_missing`,
    /// a connection released inside a transaction closed), or make sure yours sets a busy
    /// timeout and [`reusable`](crate::reusable) as its `after_release`.
    pub fn new(pool: SqlitePool) -> Self {
        Self::with_table(pool, TableName::default_table())
    }

    /// A store on `table`; the schema is not touched.
    pub fn with_table(pool: SqlitePool, table: TableName) -> Self {
        Self {
            pool,
            sql: Arc::new(Statements::new(&table)),
            table: Arc::new(table),
        }
    }

    /// A store configured by `idempotency.persistence`: validates `table-name`, then applies
    /// `schema.mode`.
    pub async fn from_config(pool: SqlitePool, config: &PersistenceConfig) -> Result<Self, Error> {
        let store = Self::with_table(pool, TableName::parse(&config.table_name)?);
        store.apply_schema(config.schema.mode).await?;
        Ok(store)
    }

    /// Opens `path_or_url` (a file path or a `sqlite:` URL) with the recommended
    /// [`connect_options`](crate::connect_options), then applies `config` as
    /// [`from_config`](Self::from_config) does. The file is created when missing.
    pub async fn connect(path_or_url: &str, config: &PersistenceConfig) -> Result<Self, Error> {
        Self::connect_with(connect::connect_options(path_or_url)?, config).await
    }

    /// [`connect`](Self::connect) with options of your own (start from
    /// [`connect_options`](crate::connect_options) to keep WAL and the busy timeout).
    pub async fn connect_with(
        options: SqliteConnectOptions,
        config: &PersistenceConfig,
    ) -> Result<Self, Error> {
        let table = TableName::parse(&config.table_name)?;
        let store = Self::with_table(connect::open_pool(options).await?, table);
        store.apply_schema(config.schema.mode).await?;
        Ok(store)
    }

    /// `create` runs the canonical DDL, `validate` checks the table, `none` does nothing.
    pub async fn apply_schema(&self, mode: SchemaMode) -> Result<(), Error> {
        match mode {
            SchemaMode::Create => self.create_schema().await,
            SchemaMode::Validate => self.validate_schema().await,
            SchemaMode::None => Ok(()),
        }
    }

    /// Runs the canonical DDL (`CREATE ... IF NOT EXISTS`) in one write transaction; safe to run
    /// again and from several instances at once.
    pub async fn create_schema(&self) -> Result<(), Error> {
        schema::create(&self.pool, &self.table).await
    }

    /// Checks columns, type affinities, nullability, the key `ON CONFLICT` relies on (and its
    /// collation) and the expiry index, failing with [`Error::Schema`] naming every difference.
    pub async fn validate_schema(&self) -> Result<(), Error> {
        schema::validate(&self.pool, &self.table).await
    }

    /// Checks what leased claims ([`LeasedClaims`](idempotency_core::LeasedClaims), the
    /// layer's leased mode) need beyond [`validate_schema`](Self::validate_schema): the
    /// columns `lease_token` and `lease_expires_at` and the token counter
    /// `<table>_lease_tokens`, all in the canonical DDL. A service on `schema.mode: validate`
    /// calls this at start instead of
    /// [`prepare_leases`](idempotency_core::LeasedClaims::prepare_leases), and is refused with
    /// [`Error::Schema`] naming what is missing.
    pub async fn validate_leases(&self) -> Result<(), Error> {
        schema::validate_leases(&self.pool, &self.table).await
    }

    /// Every difference between the table and the canonical schema (empty when it matches).
    pub async fn schema_problems(&self) -> Result<Vec<SchemaProblem>, Error> {
        schema::problems(&self.pool, &self.table).await
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

impl IdempotencyStore for SqliteStore {
    type Connection = SqliteConnection;
    type Transaction = sqlx::Transaction<'static, Sqlite>;
    const DB_SYSTEM: &'static str = "sqlite";

    async fn begin(&self) -> Result<Self::Transaction, StoreError> {
        self.pool
            .begin_with(BEGIN_IMMEDIATE)
            .await
            .map_err(store_error)
    }

    /// Refuses (rolls back) a transaction in which sqlx still counts a nested transaction of
    /// the action open: sqlx's `COMMIT` would only release that savepoint, and the store's
    /// transaction would stay open on the pooled connection, committed by nobody.
    async fn commit(mut tx: Self::Transaction) -> Result<(), StoreError> {
        if transaction_end::settled_depth(&mut tx)
            .await
            .map_err(store_error)?
            > 1
        {
            Self::rollback(tx).await?;
            return Err(StoreError::Database(Box::new(
                transaction_end::NestedTransactionOpen,
            )));
        }
        tx.commit().await.map_err(store_error)
    }

    /// First rolls back the nested transactions sqlx still counts open above the store's
    /// (`transaction_end::unwind_nested`), then checks that the transaction is still open (as
    /// before each store write, which begins it again when a statement of the action had
    /// ended it), so that sqlx's `ROLLBACK` finds one: a failed one would leave sqlx counting
    /// the pooled connection in a transaction for good, and every later `BEGIN IMMEDIATE` on
    /// it refused.
    async fn rollback(mut tx: Self::Transaction) -> Result<(), StoreError> {
        // On a failed unwind, sqlx's rollback below still undoes what it can, but the
        // transaction may stay open: the answer is the error, not `Ok`.
        let unwound = transaction_end::unwind_nested(&mut tx).await;
        if unwound.is_ok()
            && let Err(error) = transaction_end::ended(&mut tx).await
        {
            tracing::debug!(%error, "could not check the transaction before its rollback");
        }
        let rolled_back = tx.rollback().await.map_err(store_error);
        unwound.map_err(store_error)?;
        rolled_back
    }

    /// `claim.wait` is not used: the transaction holds the write lock since `BEGIN IMMEDIATE`,
    /// so no uncommitted holder of the key can exist and the insert never waits.
    async fn acquire(
        &self,
        conn: &mut SqliteConnection,
        claim: &Claim<'_>,
    ) -> Result<Acquire, StoreError> {
        let id = claim.id;
        ensure_open(conn).await?;
        let inserted = sqlx::query(self.sql.acquire.clone())
            .bind(id.operation.as_str())
            .bind(id.scope.as_str())
            .bind(id.key.as_str())
            .bind(claim.fingerprint.as_str())
            .bind(ttl_millis(claim.ttl))
            .execute(&mut *conn)
            .await
            .map_err(in_transaction_error)?
            .rows_affected();
        Ok(if inserted == 1 {
            Acquire::Acquired
        } else {
            Acquire::Exists
        })
    }

    async fn find(
        &self,
        conn: &mut SqliteConnection,
        id: &RecordId,
    ) -> Result<Option<IdempotencyRecord>, StoreError> {
        let row: Option<FindRow> = sqlx::query_as(self.sql.find.clone())
            .bind(id.operation.as_str())
            .bind(id.scope.as_str())
            .bind(id.key.as_str())
            .fetch_optional(&mut *conn)
            .await
            .map_err(store_error)?;
        row.map(record_from_row).transpose()
    }

    /// One autocommit `SELECT` on the pool: in WAL mode it reads the last committed state without
    /// taking (or waiting for) the write lock, so replays proceed while a writer runs.
    async fn lookup(&self, id: &RecordId) -> Result<Option<IdempotencyRecord>, StoreError> {
        let row: Option<FindRow> = sqlx::query_as(self.sql.find.clone())
            .bind(id.operation.as_str())
            .bind(id.scope.as_str())
            .bind(id.key.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(store_error)?;
        row.map(record_from_row).transpose()
    }

    async fn complete(
        &self,
        conn: &mut SqliteConnection,
        id: &RecordId,
        outcome: &StoredOutcome,
        execution_span: Option<SpanRef>,
    ) -> Result<IdempotencyRecord, StoreError> {
        let (payload, code) = outcome.to_columns();
        let (trace_id, span_id) = span_columns(execution_span);
        // After a statement that ended the transaction the claim is gone; the check begins the
        // transaction again, so that the rollback that follows finds one and the connection
        // goes back to the pool in a state sqlx knows.
        ensure_open(conn).await?;
        let row: Option<CompleteRow> = sqlx::query_as(self.sql.complete.clone())
            .bind(id.operation.as_str())
            .bind(id.scope.as_str())
            .bind(id.key.as_str())
            .bind(outcome.status().as_str())
            .bind(payload)
            .bind(code)
            .bind(trace_id)
            .bind(span_id)
            .fetch_optional(&mut *conn)
            .await
            .map_err(in_transaction_error)?;
        let Some(row) = row else {
            let found: Option<String> = sqlx::query_scalar(self.sql.status.clone())
                .bind(id.operation.as_str())
                .bind(id.scope.as_str())
                .bind(id.key.as_str())
                .fetch_optional(&mut *conn)
                .await
                .map_err(in_transaction_error)?;
            let found = found.as_deref().map(parse_status).transpose()?;
            return Err(StoreError::NotProcessing { found });
        };
        Ok(completed_record(row, outcome.clone(), execution_span))
    }
}

impl InsertCompleted for SqliteStore {
    /// One `INSERT ... ON CONFLICT DO NOTHING RETURNING`. Like `acquire`, it never waits:
    /// the transaction holds the write lock since `BEGIN IMMEDIATE`, so `claim.wait` is unused.
    async fn insert_completed(
        &self,
        conn: &mut SqliteConnection,
        claim: &Claim<'_>,
        outcome: &StoredOutcome,
        execution_span: Option<SpanRef>,
    ) -> Result<Option<IdempotencyRecord>, StoreError> {
        let id = claim.id;
        let (payload, code) = outcome.to_columns();
        let (trace_id, span_id) = span_columns(execution_span);
        ensure_open(conn).await?;
        let row: Option<CompleteRow> = sqlx::query_as(self.sql.insert_completed.clone())
            .bind(id.operation.as_str())
            .bind(id.scope.as_str())
            .bind(id.key.as_str())
            .bind(claim.fingerprint.as_str())
            .bind(outcome.status().as_str())
            .bind(payload)
            .bind(code)
            .bind(ttl_millis(claim.ttl))
            .bind(trace_id)
            .bind(span_id)
            .fetch_optional(&mut *conn)
            .await
            .map_err(in_transaction_error)?;
        Ok(row.map(|row| completed_record(row, outcome.clone(), execution_span)))
    }
}

impl ExpiredCleanup for SqliteStore {
    /// One `DELETE` statement, which is its own short write transaction. SQLite has no row locks
    /// to skip: the batch waits for the write lock like any writer (busy timeout), holds it for
    /// one bounded delete, and request traffic waits at most that long.
    async fn delete_expired_batch(&self, batch_size: u32) -> Result<u64, StoreError> {
        Ok(sqlx::query(self.sql.delete_expired.clone())
            .bind(i64::from(batch_size))
            .execute(&self.pool)
            .await
            .map_err(store_error)?
            .rows_affected())
    }
}

/// Fails, without a write, when the caller's transaction had ended before the store's write
/// ([`transaction_end::ended`]): not retryable, see [`TransactionEnded`].
async fn ensure_open(conn: &mut SqliteConnection) -> Result<(), StoreError> {
    if transaction_end::ended(conn).await.map_err(store_error)? {
        return Err(StoreError::Database(Box::new(TransactionEnded)));
    }
    Ok(())
}
