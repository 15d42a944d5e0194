//! [`PgStore`]: the `IdempotencyStore` on PostgreSQL.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use idempotency_core::config::{PersistenceConfig, SchemaMode};
use idempotency_core::store::{
    Acquire, Claim, ExpiredCleanup, IdempotencyStore, InsertCompleted, LockWait, StoreError,
};
use idempotency_core::trace::SpanRef;
use idempotency_core::{Fingerprint, IdempotencyRecord, RecordId, StoredOutcome};
use sqlx::postgres::types::PgInterval;
use sqlx::{PgConnection, PgPool, Postgres};

use super::row::{CompleteRow, FindRow, InsertedRow, record_from_row, span_columns};
use super::schema;
use super::statements::Statements;
use crate::error::{Error, SchemaProblem, store_error, wait_error};
use crate::pooler::{Own, Pooler};
use crate::table::TableName;

/// The PostgreSQL idempotency store.
///
/// Records live in one table (default `idempotency_records`, see [`ddl`](crate::ddl)), written
/// through the caller's transaction. Cheap to clone: the pool and the statements are shared.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use idempotency_pg::PgStore;
/// use idempotency_core::config::PersistenceConfig;
///
/// let pool = sqlx::PgPool::connect("postgres://postgres@127.0.0.1/test").await?;
/// // table name and schema mode (`create | validate | none`) from `idempotency.persistence`
/// let store = PgStore::from_config(pool, &PersistenceConfig::default()).await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
    table: Arc<TableName>,
    sql: Arc<Statements>,
    pooler: Pooler,
}

impl PgStore {
    /// A store on the default table `idempotency_records`; the schema is not touched.
    pub fn new(pool: PgPool) -> Self {
        Self::with_table(pool, TableName::default_table())
    }

    /// A store on `table`; the schema is not touched.
    pub fn with_table(pool: PgPool, table: TableName) -> Self {
        Self {
            pool,
            sql: Arc::new(Statements::new(&table)),
            table: Arc::new(table),
            pooler: Pooler::None,
        }
    }

    /// This store for a pool behind `pooler` (`idempotency.persistence.pooler`). With
    /// [`Pooler::Transaction`] (PgBouncer's `pool_mode = transaction`) every statement is
    /// unnamed (parsed again at every call: no `sqlx_s_N` to collide with on a shared server
    /// connection) and every statement the store runs on its own (a replay's look-up, the
    /// leased claims, cleanup) runs in a transaction of its own, two round trips more. A
    /// caller's transaction ([`PgTx`](crate::PgTx), [`begin`](crate::begin)) needs nothing
    /// more: PgBouncer keeps it on one server connection.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use idempotency_pg::{PgStore, Pooler};
    ///
    /// let pool = sqlx::PgPool::connect("postgres://postgres@127.0.0.1:6432/test").await?; // PgBouncer
    /// let store = PgStore::new(pool).with_pooler(Pooler::Transaction);
    /// assert_eq!(store.pooler(), Pooler::Transaction);
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

    /// A connection for a statement on its own (see [`Own`]).
    pub(crate) async fn own(&self) -> Result<Own, StoreError> {
        Own::open(&self.pool, self.pooler)
            .await
            .map_err(store_error)
    }

    /// Whether statements may be named and cached (not behind a transaction pooler).
    pub(super) fn persistent(&self) -> bool {
        crate::pooler::persistent(self.pooler)
    }

    /// A store configured by `idempotency.persistence`: validates `table-name`, takes `pooler`
    /// ([`with_pooler`](Self::with_pooler)), then applies `schema.mode`.
    pub async fn from_config(pool: PgPool, config: &PersistenceConfig) -> Result<Self, Error> {
        let store = Self::with_table(pool, TableName::parse(&config.table_name)?)
            .with_pooler(config.pooler);
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

    /// Runs the canonical DDL (`CREATE ... IF NOT EXISTS`); safe to run again and concurrently.
    pub async fn create_schema(&self) -> Result<(), Error> {
        schema::create(&self.pool, self.pooler, &self.table).await
    }

    /// Checks columns, types, nullability, the key `ON CONFLICT` relies on and the expiry index,
    /// failing with [`Error::Schema`] naming every difference.
    pub async fn validate_schema(&self) -> Result<(), Error> {
        schema::validate(&self.pool, self.pooler, &self.table).await
    }

    /// Checks what leased claims ([`LeasedClaims`](idempotency_core::LeasedClaims), the
    /// layer's leased mode) need beyond [`validate_schema`](Self::validate_schema): the
    /// columns `lease_token` and `lease_expires_at` and the sequence
    /// `<table>_lease_token_seq`. They are in the canonical DDL and in
    /// `migrations/20261205000001_idempotency_leases.sql`; a service on
    /// `schema.mode: validate` calls this at start instead of
    /// [`prepare_leases`](idempotency_core::LeasedClaims::prepare_leases), and is refused with
    /// [`Error::Schema`] naming what is missing.
    pub async fn validate_leases(&self) -> Result<(), Error> {
        schema::validate_leases(&self.pool, self.pooler, &self.table).await
    }

    /// Every difference between the table and the canonical schema (empty when it matches).
    pub async fn schema_problems(&self) -> Result<Vec<SchemaProblem>, Error> {
        schema::problems(&self.pool, self.pooler, &self.table).await
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The table.
    pub fn table(&self) -> &TableName {
        &self.table
    }

    /// The SQL text of one of the statements this store issues, for inspection (`EXPLAIN`) and
    /// benchmarks: `acquire`, `acquire_bounded` (with the in-flight wait budget),
    /// `insert_completed`, `insert_completed_bounded`, `find`, `complete`, `delete_expired`.
    pub fn statement(&self, name: &str) -> Option<&str> {
        let sql = &self.sql;
        let statement = match name {
            "acquire" => &sql.acquire,
            "acquire_bounded" => &sql.acquire_bounded,
            "insert_completed" => &sql.insert_completed,
            "insert_completed_bounded" => &sql.insert_completed_bounded,
            "find" => &sql.find,
            "complete" => &sql.complete,
            "delete_expired" => &sql.delete_expired,
            _ => return None,
        };
        Some(statement.as_str())
    }
}

/// The savepoint numbered `number` in its transaction, which an action starts from (see
/// [`IdempotencyStore::savepoint`]): `idempotency_action_1`, `idempotency_action_2`, ...
fn action_savepoint(number: u32) -> String {
    format!("idempotency_action_{number}")
}

fn interval(ttl: Option<Duration>) -> Option<PgInterval> {
    ttl.map(|ttl| PgInterval {
        months: 0,
        days: 0,
        microseconds: i64::try_from(ttl.as_micros()).unwrap_or(i64::MAX),
    })
}

fn lock_timeout(wait: LockWait) -> Option<String> {
    match wait {
        LockWait::Unbounded => None,
        // lock_timeout = 0 would disable the timeout: 1 ms is the shortest wait PostgreSQL offers.
        LockWait::NoWait => Some("1ms".to_owned()),
        // PostgreSQL takes at most i32::MAX ms (about 24.8 days); a longer wait is that long.
        LockWait::Timeout(timeout) => Some(format!(
            "{}ms",
            timeout.as_millis().clamp(1, i32::MAX as u128)
        )),
    }
}

fn corrupt(reason: impl Into<String>) -> StoreError {
    StoreError::Corrupt {
        reason: reason.into(),
    }
}

impl IdempotencyStore for PgStore {
    type Connection = PgConnection;
    type Transaction = sqlx::Transaction<'static, Postgres>;
    const DB_SYSTEM: &'static str = "postgresql";

    /// Safe to cancel: a `BEGIN` whose answer nobody reads is rolled back before its connection
    /// returns to the pool.
    async fn begin(&self) -> Result<Self::Transaction, StoreError> {
        crate::begin(&self.pool).await.map_err(store_error)
    }

    async fn commit(tx: Self::Transaction) -> Result<(), StoreError> {
        tx.commit().await.map_err(store_error)
    }

    async fn rollback(tx: Self::Transaction) -> Result<(), StoreError> {
        tx.rollback().await.map_err(store_error)
    }

    async fn acquire(
        &self,
        conn: &mut PgConnection,
        claim: &Claim<'_>,
    ) -> Result<Acquire, StoreError> {
        let id = claim.id;
        let inserted = match lock_timeout(claim.wait) {
            None => sqlx::query(self.sql.acquire.clone())
                .persistent(self.persistent())
                .bind(id.operation.as_str())
                .bind(id.scope.as_str())
                .bind(id.key.as_str())
                .bind(claim.fingerprint.as_str())
                .bind(interval(claim.ttl))
                .execute(&mut *conn)
                .await
                .map_err(wait_error)?
                .rows_affected(),
            Some(timeout) => {
                let (count, _restored): (i64, String) =
                    sqlx::query_as(self.sql.acquire_bounded.clone())
                        .persistent(self.persistent())
                        .bind(id.operation.as_str())
                        .bind(id.scope.as_str())
                        .bind(id.key.as_str())
                        .bind(claim.fingerprint.as_str())
                        .bind(interval(claim.ttl))
                        .bind(timeout)
                        .fetch_one(&mut *conn)
                        .await
                        .map_err(wait_error)?;
                u64::try_from(count).unwrap_or_default()
            }
        };
        Ok(if inserted == 1 {
            Acquire::Acquired
        } else {
            Acquire::Exists
        })
    }

    async fn find(
        &self,
        conn: &mut PgConnection,
        id: &RecordId,
    ) -> Result<Option<IdempotencyRecord>, StoreError> {
        let row: Option<FindRow> = sqlx::query_as(self.sql.find.clone())
            .persistent(self.persistent())
            .bind(id.operation.as_str())
            .bind(id.scope.as_str())
            .bind(id.key.as_str())
            .fetch_optional(&mut *conn)
            .await
            .map_err(store_error)?;
        row.map(record_from_row).transpose()
    }

    /// `SAVEPOINT`: a statement of the action that fails aborts the transaction up to here
    /// only.
    async fn savepoint(&self, conn: &mut PgConnection, number: u32) -> Result<(), StoreError> {
        let statement = format!("SAVEPOINT {}", action_savepoint(number));
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
            .execute(&mut *conn)
            .await
            .map_err(store_error)?;
        Ok(())
    }

    /// Only for `25P02` (in_failed_sql_transaction): `complete` found the transaction aborted
    /// by a statement of the action. Any other failure of `complete` itself leaves the
    /// transaction to be rolled back whole, the action's statements with it.
    async fn rollback_to_savepoint(
        &self,
        conn: &mut PgConnection,
        number: u32,
        failed: &StoreError,
    ) -> Result<bool, StoreError> {
        if !self.aborted_before(failed) {
            return Ok(false);
        }
        let statement = format!("ROLLBACK TO SAVEPOINT {}", action_savepoint(number));
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
            .execute(&mut *conn)
            .await
            .map_err(store_error)?;
        Ok(true)
    }

    /// `25P02` (in_failed_sql_transaction): a statement of the caller's had failed before.
    fn aborted_before(&self, failed: &StoreError) -> bool {
        let StoreError::Database(source) = failed else {
            return false;
        };
        source
            .downcast_ref::<sqlx::Error>()
            .and_then(sqlx::Error::as_database_error)
            .and_then(|db| db.code())
            .is_some_and(|code| code == "25P02")
    }

    async fn lookup(&self, id: &RecordId) -> Result<Option<IdempotencyRecord>, StoreError> {
        let mut own = self.own().await?;
        let row: Option<FindRow> = sqlx::query_as(self.sql.find.clone())
            .persistent(self.persistent())
            .bind(id.operation.as_str())
            .bind(id.scope.as_str())
            .bind(id.key.as_str())
            .fetch_optional(&mut *own)
            .await
            .map_err(store_error)?;
        own.finish().await.map_err(store_error)?;
        row.map(record_from_row).transpose()
    }

    async fn complete(
        &self,
        conn: &mut PgConnection,
        id: &RecordId,
        outcome: &StoredOutcome,
        execution_span: Option<SpanRef>,
    ) -> Result<IdempotencyRecord, StoreError> {
        let (payload, code) = outcome.to_columns();
        let (trace_id, span_id) = span_columns(execution_span);
        let row: Option<CompleteRow> = sqlx::query_as(self.sql.complete.clone())
            .persistent(self.persistent())
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
            .map_err(store_error)?;
        let Some((hash, created_at, completed_at, expires_at)) = row else {
            let found: Option<String> = sqlx::query_scalar(self.sql.status.clone())
                .persistent(self.persistent())
                .bind(id.operation.as_str())
                .bind(id.scope.as_str())
                .bind(id.key.as_str())
                .fetch_optional(&mut *conn)
                .await
                .map_err(store_error)?;
            let found = found
                .map(|s| s.parse())
                .transpose()
                .map_err(|e: idempotency_core::UnknownStatus| corrupt(e.to_string()))?;
            return Err(StoreError::NotProcessing { found });
        };
        Ok(IdempotencyRecord {
            fingerprint: Fingerprint::new(hash),
            outcome: Some(outcome.clone()),
            created_at: SystemTime::from(created_at),
            completed_at: completed_at.map(SystemTime::from),
            expires_at: expires_at.map(SystemTime::from),
            execution_span,
        })
    }
}

impl InsertCompleted for PgStore {
    async fn insert_completed(
        &self,
        conn: &mut PgConnection,
        claim: &Claim<'_>,
        outcome: &StoredOutcome,
        execution_span: Option<SpanRef>,
    ) -> Result<Option<IdempotencyRecord>, StoreError> {
        let id = claim.id;
        let (payload, code) = outcome.to_columns();
        let (trace_id, span_id) = span_columns(execution_span);
        let timeout = lock_timeout(claim.wait);
        let sql = match timeout {
            None => self.sql.insert_completed.clone(),
            Some(_) => self.sql.insert_completed_bounded.clone(),
        };
        let mut query = sqlx::query_as::<_, InsertedRow>(sql)
            .persistent(self.persistent())
            .bind(id.operation.as_str())
            .bind(id.scope.as_str())
            .bind(id.key.as_str())
            .bind(claim.fingerprint.as_str())
            .bind(outcome.status().as_str())
            .bind(payload)
            .bind(code)
            .bind(interval(claim.ttl))
            .bind(trace_id)
            .bind(span_id);
        if let Some(timeout) = timeout {
            query = query.bind(timeout);
        }
        let row = query.fetch_optional(&mut *conn).await.map_err(wait_error)?;
        // Unbounded: no row when the key is taken. Bounded: one row, NULLs when it is taken.
        let Some((Some(created_at), completed_at, expires_at)) = row else {
            return Ok(None);
        };
        Ok(Some(IdempotencyRecord {
            fingerprint: claim.fingerprint.clone(),
            outcome: Some(outcome.clone()),
            created_at: SystemTime::from(created_at),
            completed_at: completed_at.map(SystemTime::from),
            expires_at: expires_at.map(SystemTime::from),
            execution_span,
        }))
    }
}

impl ExpiredCleanup for PgStore {
    async fn delete_expired_batch(&self, batch_size: u32) -> Result<u64, StoreError> {
        // One statement in a short READ COMMITTED transaction (see `Own::read_committed`): SKIP
        // LOCKED never waits on request traffic, nor fails on a row a concurrent cleanup took.
        let mut own = Own::read_committed(&self.pool).await.map_err(store_error)?;
        let deleted = sqlx::query(self.sql.delete_expired.clone())
            .persistent(self.persistent())
            .bind(i64::from(batch_size))
            .execute(&mut *own)
            .await
            .map_err(store_error)?
            .rows_affected();
        own.finish().await.map_err(store_error)?;
        Ok(deleted)
    }
}
