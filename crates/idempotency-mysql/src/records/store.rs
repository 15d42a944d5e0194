//! [`MysqlStore`]: the `IdempotencyStore` on MySQL and MariaDB.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use idempotency_core::config::{PersistenceConfig, SchemaMode};
use idempotency_core::store::{
    Acquire, Claim, ExpiredCleanup, IdempotencyStore, InsertCompleted, LockWait, StoreError,
};
use idempotency_core::trace::SpanRef;
use idempotency_core::{IdempotencyRecord, RecordId, StoredOutcome};
use sqlx::mysql::{MySqlArguments, MySqlQueryResult};
use sqlx::query::Query;
use sqlx::{MySql, MySqlConnection, MySqlPool, SqlStr};

use super::row::{
    CompleteRow, FindRow, TimesRow, completed_record, parse_status, record_from_row, span_columns,
    time,
};
use super::schema;
use super::statements::{Insert, Statements};
use crate::clock::ttl_micros;
use crate::connect::{
    self, Server, begin_read_committed, ensure_open, failed_in_transaction, in_transaction,
    restore_lock_wait,
};
use crate::error::{
    ER_DUP_ENTRY, ER_LOCK_WAIT_TIMEOUT, Error, SchemaProblem, error_number, store_error,
};
use crate::table::TableName;

/// The MySQL / MariaDB idempotency store.
///
/// Records live in one InnoDB table (default `idempotency_records`, see [`ddl`](crate::ddl)),
/// written through the caller's transaction. A concurrent duplicate waits in `acquire` for the
/// holder, for at most the call's wait budget (on MariaDB to the millisecond, on MySQL 8 in
/// whole seconds of `innodb_lock_wait_timeout`), then replays the committed outcome or takes
/// the key if the holder rolled back.
/// Cheap to clone: the pool and the statements are shared.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use idempotency_core::config::PersistenceConfig;
/// use idempotency_mysql::MysqlStore;
///
/// let pool = sqlx::MySqlPool::connect("mysql://root@127.0.0.1:3306/test").await?;
/// // table name and schema mode (`create | validate | none`) from `idempotency.persistence`
/// let store = MysqlStore::from_config(pool, &PersistenceConfig::default()).await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct MysqlStore {
    pool: MySqlPool,
    table: Arc<TableName>,
    sql: Arc<Statements>,
    /// What the server is, asked at the first insert.
    server: Arc<OnceLock<Server>>,
    /// Keys `acquire` reported `Exists` for, until `find` reads them.
    existing: Arc<Existing>,
}

/// The keys `acquire` just reported `Exists` for, in any of the store's transactions, each
/// with how many such reports wait for their `find`: `find` may read those with a locking read
/// (see `find`). Counted, so that each of several transactions told `Exists` for one key gets
/// its locking read (before: one entry per key, which the first `find` took, and the others'
/// `find` answered `None`, an acquire round lost each, `AcquireExhausted` for some once they
/// were `max-acquire-attempts` or more). Entries of requests dropped in between are dropped
/// once there are [`Existing::MAX`] keys.
#[derive(Debug, Default)]
struct Existing(Mutex<HashMap<RecordId, usize>>);

impl Existing {
    const MAX: usize = 4096;

    fn remember(&self, id: &RecordId) {
        let mut ids = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if ids.len() >= Self::MAX && !ids.contains_key(id) {
            ids.clear();
        }
        *ids.entry(id.clone()).or_default() += 1;
    }

    /// Whether `id` was remembered; forgets one report of it.
    fn forget(&self, id: &RecordId) -> bool {
        let mut ids = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if ids.is_empty() {
            return false;
        }
        match ids.get_mut(id) {
            Some(1) => ids.remove(id).is_some(),
            Some(count) => {
                *count -= 1;
                true
            }
            None => false,
        }
    }
}

/// The wait budget as `innodb_lock_wait_timeout`: whole seconds, rounded up; `0` for
/// `NoWait` (MariaDB does not wait; MySQL 8's minimum is 1 s). `None`: the session's setting.
fn lock_wait_seconds(wait: LockWait) -> Option<u64> {
    match wait {
        LockWait::Unbounded => None,
        LockWait::NoWait => Some(0),
        LockWait::Timeout(timeout) => {
            let millis = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
            Some(millis.div_ceil(1000).clamp(1, 1_073_741_824))
        }
    }
}

impl MysqlStore {
    /// A store on the default table `idempotency_records`; the schema is not touched.
    pub fn new(pool: MySqlPool) -> Self {
        Self::with_table(pool, TableName::default_table())
    }

    /// A store on `table`; the schema is not touched.
    pub fn with_table(pool: MySqlPool, table: TableName) -> Self {
        Self {
            pool,
            sql: Arc::new(Statements::new(&table)),
            table: Arc::new(table),
            server: Arc::default(),
            existing: Arc::default(),
        }
    }

    /// A store configured by `idempotency.persistence`: validates `table-name` (at most
    /// [`MAX_RECORDS_TABLE_LEN`](crate::MAX_RECORDS_TABLE_LEN) bytes), refuses servers older
    /// than MySQL 8.0.16 / MariaDB 10.6 ([`Error::UnsupportedServer`]), then applies
    /// `schema.mode`.
    pub async fn from_config(pool: MySqlPool, config: &PersistenceConfig) -> Result<Self, Error> {
        let table = TableName::parse(&config.table_name)?;
        schema::check_room(&table)?;
        connect::check_server(&pool).await?;
        let store = Self::with_table(pool, table);
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

    /// Runs the canonical DDL (`CREATE TABLE IF NOT EXISTS`); safe to run again and from
    /// several instances at once.
    pub async fn create_schema(&self) -> Result<(), Error> {
        schema::create(&self.pool, &self.table).await
    }

    /// Checks columns, types, lengths, nullability, the key the duplicate check relies on, the
    /// key columns' collations (binary or case-sensitive) and the expiry index, failing with
    /// [`Error::Schema`] naming every difference.
    pub async fn validate_schema(&self) -> Result<(), Error> {
        schema::validate(&self.pool, &self.table).await
    }

    /// Every difference between the table and the canonical schema (empty when it matches).
    pub async fn schema_problems(&self) -> Result<Vec<SchemaProblem>, Error> {
        schema::problems(&self.pool, &self.table).await
    }

    /// The pool.
    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    /// The table.
    pub fn table(&self) -> &TableName {
        &self.table
    }

    /// The SQL text of one of the statements this store issues, for inspection (`EXPLAIN`) and
    /// benchmarks: `acquire`, `insert_completed`, `inserted_times` (read after an optimistic
    /// insert), `find`, `find_locking` (`find` after `acquire` reported `Exists`), `complete`,
    /// `completed_row` (read after `complete`), `set_lock_wait` and `restore_lock_wait` (around
    /// a bounded wait on MySQL 8), `expired` (a cleanup batch's keys). `acquire` and
    /// `insert_completed` are the forms MySQL 8 runs; MariaDB runs them under `SET STATEMENT
    /// innodb_lock_wait_timeout = 0 FOR`, the operation bound through
    /// `IF(@@in_transaction, ?, NULL)` (a caller's transaction the server already ended makes
    /// the insert fail instead of committing on its own).
    pub fn statement(&self, name: &str) -> Option<&str> {
        let sql = &self.sql;
        Some(match name {
            "acquire" => sql.acquire.mysql.as_str(),
            "insert_completed" => sql.insert_completed.mysql.as_str(),
            "inserted_times" => sql.inserted_times.as_str(),
            "find" => sql.find.as_str(),
            "find_locking" => sql.find_locking.as_str(),
            "complete" => sql.complete.as_str(),
            "completed_row" => sql.completed_row.as_str(),
            "set_lock_wait" => connect::SET_LOCK_WAIT,
            "restore_lock_wait" => connect::RESTORE_LOCK_WAIT,
            "expired" => sql.expired.as_str(),
            _ => return None,
        })
    }

    /// Runs the insert `sql` (its arguments bound by `bind`), which may wait for a concurrent
    /// holder of the key within the claim's wait budget; `true` when it inserted, `false` when
    /// the key exists (committed; the failed insert holds a shared lock on it, which other
    /// replays share).
    ///
    /// The insert is the first write in the caller's transaction: when the server ended that
    /// transaction before it (one of the caller's own statements deadlocked and the caller went
    /// on), it would commit on its own. It fails instead with
    /// [`TransactionRolledBack`](crate::TransactionRolledBack), the session ended: on MariaDB
    /// the statement checks `@@in_transaction` itself (`connect::IN_TRANSACTION_ONLY`, no
    /// round trip); on MySQL 8 `connect::ensure_open` asks first, in the round trip that sets
    /// the wait budget (one more round trip when the wait is unbounded).
    ///
    /// On MariaDB the insert does not wait inside the server: it runs with
    /// `innodb_lock_wait_timeout = 0` for that statement only (`SET STATEMENT ... FOR`) and is
    /// tried again after a short sleep while the holder is in flight, until the budget runs
    /// out. A waiter that waited inside the server would hold a lock request on the holder's
    /// row; when the holder rolls back, two such waiters are left with gap locks that block
    /// each other's insert, and InnoDB kills one of them (1213). Nothing is left on the
    /// session either, so a dropped future leaves no budget behind.
    ///
    /// MySQL 8 has no statement-scoped `innodb_lock_wait_timeout` and no wait below one
    /// second: the insert waits in the server, the budget set and restored around it (see
    /// `connect::SET_LOCK_WAIT` for how a restore that never ran is made up for).
    async fn insert_waiting<'q>(
        &self,
        conn: &mut MySqlConnection,
        wait: LockWait,
        insert: &Insert,
        bind: impl Fn(Query<'q, MySql, MySqlArguments>) -> Query<'q, MySql, MySqlArguments>,
    ) -> Result<bool, StoreError> {
        let server = self.server(conn).await?;
        if server.mariadb {
            let deadline = match wait {
                LockWait::Unbounded => None,
                LockWait::NoWait => Some(Instant::now()),
                LockWait::Timeout(timeout) => Instant::now().checked_add(timeout),
            };
            return insert_polling(conn, deadline, server, &insert.mariadb, bind).await;
        }
        let seconds = lock_wait_seconds(wait);
        ensure_open(conn, seconds).await?;
        let result = bind(sqlx::query(insert.mysql.clone()))
            .execute(&mut *conn)
            .await;
        if seconds.is_some() {
            let restored = restore_lock_wait(conn).await;
            if result.is_ok() {
                restored.map_err(store_error)?;
            }
        }
        inserted(conn, result).await
    }

    /// What the server is, asked once on `conn`.
    async fn server(&self, conn: &mut MySqlConnection) -> Result<Server, StoreError> {
        if let Some(server) = self.server.get() {
            return Ok(*server);
        }
        let server = Server::ask(conn).await.map_err(store_error)?;
        Ok(*self.server.get_or_init(|| server))
    }

    async fn read(
        &self,
        conn: impl sqlx::Executor<'_, Database = MySql>,
        id: &RecordId,
    ) -> Result<Option<IdempotencyRecord>, StoreError> {
        let row = self
            .read_row(conn, id, &self.sql.find)
            .await
            .map_err(store_error)?;
        row.map(record_from_row).transpose()
    }

    /// `find` or `find_locking`.
    async fn read_row(
        &self,
        conn: impl sqlx::Executor<'_, Database = MySql>,
        id: &RecordId,
        sql: &SqlStr,
    ) -> Result<Option<FindRow>, sqlx::Error> {
        sqlx::query_as(sql.clone())
            .bind(id.operation.as_str())
            .bind(id.scope.as_str())
            .bind(id.key.as_str())
            .fetch_optional(conn)
            .await
    }
}

/// Refuses an outcome payload nested deeper than [`MAX_JSON_DEPTH`](idempotency_core::MAX_JSON_DEPTH)
/// (MariaDB's `json_valid` refuses 32 levels), before its statement. The service refuses
/// such outcomes before calling the store (`SerializationError::TooDeep`); this is for a
/// caller of the SPI that did not.
fn check_outcome(payload: Option<&str>) -> Result<(), StoreError> {
    payload
        .map_or(Ok(()), idempotency_core::check_json_depth)
        .map_err(|too_deep| StoreError::Database(Box::new(too_deep)))
}

/// The first pause of MariaDB's wait for a holder; it doubles up to [`POLL_MAX`].
const POLL_FIRST: Duration = Duration::from_millis(2);
/// The longest pause of MariaDB's wait for a holder.
const POLL_MAX: Duration = Duration::from_millis(50);

/// An insert's result: `true` inserted, `false` the key exists (1062, the statement alone is
/// undone), an error otherwise (see `connect::in_transaction`).
async fn inserted(
    conn: &mut MySqlConnection,
    result: Result<MySqlQueryResult, sqlx::Error>,
) -> Result<bool, StoreError> {
    match result {
        Ok(_) => Ok(true),
        Err(error) if error_number(&error) == Some(ER_DUP_ENTRY) => Ok(false),
        Err(error) => Err(failed_in_transaction(conn, error).await.into()),
    }
}

/// MariaDB's wait (see `MysqlStore::insert_waiting`): the insert `sql` (its MariaDB form, with
/// no server-side wait), again every few milliseconds while a holder has the key, until
/// `deadline` (`None`: until the holder ends).
async fn insert_polling<'q>(
    conn: &mut MySqlConnection,
    deadline: Option<Instant>,
    server: Server,
    sql: &SqlStr,
    bind: impl Fn(Query<'q, MySql, MySqlArguments>) -> Query<'q, MySql, MySqlArguments>,
) -> Result<bool, StoreError> {
    let mut pause = POLL_FIRST;
    loop {
        let result = bind(sqlx::query(sql.clone())).execute(&mut *conn).await;
        let in_flight = result
            .as_ref()
            .is_err_and(|error| error_number(error) == Some(ER_LOCK_WAIT_TIMEOUT));
        // Under `innodb_rollback_on_timeout` the timeout ended the transaction: reported as
        // such.
        if !in_flight || server.rollback_on_timeout {
            return inserted(conn, result).await;
        }
        let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        if left.is_some_and(|left| left.is_zero()) {
            return inserted(conn, result).await;
        }
        tokio::time::sleep(left.map_or(pause, |left| left.min(pause))).await;
        pause = (pause * 2).min(POLL_MAX);
    }
}

impl IdempotencyStore for MysqlStore {
    type Connection = MySqlConnection;
    type Transaction = crate::MysqlTransaction;
    const DB_SYSTEM: &'static str = "mysql";

    /// Safe to cancel: a `BEGIN` whose answer nobody reads is rolled back before its connection
    /// returns to the pool; a transaction dropped before it ended closes its connection (see
    /// [`MysqlTransaction`](crate::MysqlTransaction)).
    async fn begin(&self) -> Result<Self::Transaction, StoreError> {
        connect::begin(&self.pool).await.map_err(store_error)
    }

    async fn commit(tx: Self::Transaction) -> Result<(), StoreError> {
        tx.commit().await.map_err(store_error)
    }

    async fn rollback(tx: Self::Transaction) -> Result<(), StoreError> {
        tx.rollback().await.map_err(store_error)
    }

    /// A plain `INSERT`; an existing key (1062) is `Exists`. A holder's uncommitted insert of
    /// the key makes it wait, for `claim.wait` (see `insert_waiting`; out of budget it is
    /// [`StoreError::LockTimeout`]); it then reports `Exists` when the holder committed, and
    /// inserts when the holder rolled back.
    async fn acquire(
        &self,
        conn: &mut MySqlConnection,
        claim: &Claim<'_>,
    ) -> Result<Acquire, StoreError> {
        let id = claim.id;
        let result = self
            .insert_waiting(conn, claim.wait, &self.sql.acquire, |query| {
                query
                    .bind(id.operation.as_str())
                    .bind(id.scope.as_str())
                    .bind(id.key.as_str())
                    .bind(claim.fingerprint.as_str())
                    .bind(ttl_micros(claim.ttl))
            })
            .await?;
        Ok(if result {
            Acquire::Acquired
        } else {
            self.existing.remember(id);
            Acquire::Exists
        })
    }

    /// A read in the caller's transaction; when it finds nothing right after `acquire`
    /// reported `Exists` for the key, a locking read in the same transaction.
    ///
    /// Under REPEATABLE READ the transaction's snapshot is taken at its first read: a caller
    /// that read anything before the key's holder committed would not see the record that
    /// `acquire` just reported (`Exists`), and would retry forever. A locking read sees the
    /// latest committed version; after `Exists` it takes no new lock (the insert locked the
    /// row already) and no gap lock (the row exists). A locking read of a missing key would
    /// take a gap lock, and two transactions inserting into that gap deadlock: so a miss that
    /// does not follow `Exists` (`lookup_before_acquire` of a new key) answers `None`, what a
    /// new key gets anyway, without a second connection (N callers on an N-connection pool
    /// would each wait for another one until `acquire_timeout`).
    async fn find(
        &self,
        conn: &mut MySqlConnection,
        id: &RecordId,
    ) -> Result<Option<IdempotencyRecord>, StoreError> {
        let row = self.read_row(&mut *conn, id, &self.sql.find).await;
        if let Some(row) = in_transaction(conn, row).await? {
            self.existing.forget(id);
            return record_from_row(row).map(Some);
        }
        if !self.existing.forget(id) {
            return Ok(None);
        }
        let row = self.read_row(&mut *conn, id, &self.sql.find_locking).await;
        in_transaction(conn, row)
            .await?
            .map(record_from_row)
            .transpose()
    }

    /// One autocommit `SELECT` on the pool: a consistent read of the last committed state,
    /// which neither takes nor waits for locks.
    async fn lookup(&self, id: &RecordId) -> Result<Option<IdempotencyRecord>, StoreError> {
        self.read(&self.pool, id).await
    }

    async fn complete(
        &self,
        conn: &mut MySqlConnection,
        id: &RecordId,
        outcome: &StoredOutcome,
        execution_span: Option<SpanRef>,
    ) -> Result<IdempotencyRecord, StoreError> {
        let (payload, code) = outcome.to_columns();
        check_outcome(payload)?;
        let (trace_id, span_id) = span_columns(execution_span);
        let updated = sqlx::query(self.sql.complete.clone())
            .bind(outcome.status().as_str())
            .bind(payload)
            .bind(code)
            .bind(trace_id)
            .bind(span_id)
            .bind(id.operation.as_str())
            .bind(id.scope.as_str())
            .bind(id.key.as_str())
            .execute(&mut *conn)
            .await;
        let updated = in_transaction(conn, updated).await?.rows_affected();
        if updated == 0 {
            // The acquire's row is gone: with the transaction, when the server ended it since
            // (an action that went on after its own statement deadlocked). Nothing the caller
            // runs next may commit on its own.
            ensure_open(conn, None).await?;
            let found: Option<String> = sqlx::query_scalar(self.sql.status.clone())
                .bind(id.operation.as_str())
                .bind(id.scope.as_str())
                .bind(id.key.as_str())
                .fetch_optional(&mut *conn)
                .await
                .map_err(store_error)?;
            let found = found.as_deref().map(parse_status).transpose()?;
            return Err(StoreError::NotProcessing { found });
        }
        // The transaction's own write: visible to its reads whatever the snapshot.
        let row: CompleteRow = sqlx::query_as(self.sql.completed_row.clone())
            .bind(id.operation.as_str())
            .bind(id.scope.as_str())
            .bind(id.key.as_str())
            .fetch_one(&mut *conn)
            .await
            .map_err(store_error)?;
        Ok(completed_record(row, outcome.clone(), execution_span))
    }
}

impl InsertCompleted for MysqlStore {
    /// The same plain `INSERT` as `acquire`, with the outcome, and the same wait; then a read
    /// of the new row's times.
    async fn insert_completed(
        &self,
        conn: &mut MySqlConnection,
        claim: &Claim<'_>,
        outcome: &StoredOutcome,
        execution_span: Option<SpanRef>,
    ) -> Result<Option<IdempotencyRecord>, StoreError> {
        let id = claim.id;
        let (payload, code) = outcome.to_columns();
        check_outcome(payload)?;
        let (trace_id, span_id) = span_columns(execution_span);
        let result = self
            .insert_waiting(conn, claim.wait, &self.sql.insert_completed, |query| {
                query
                    .bind(id.operation.as_str())
                    .bind(id.scope.as_str())
                    .bind(id.key.as_str())
                    .bind(claim.fingerprint.as_str())
                    .bind(outcome.status().as_str())
                    .bind(payload)
                    .bind(code)
                    .bind(ttl_micros(claim.ttl))
                    .bind(trace_id.as_deref())
                    .bind(span_id.as_deref())
            })
            .await?;
        if !result {
            return Ok(None);
        }
        let (created_at, completed_at, expires_at): TimesRow =
            sqlx::query_as(self.sql.inserted_times.clone())
                .bind(id.operation.as_str())
                .bind(id.scope.as_str())
                .bind(id.key.as_str())
                .fetch_one(&mut *conn)
                .await
                .map_err(store_error)?;
        Ok(Some(IdempotencyRecord {
            fingerprint: claim.fingerprint.clone(),
            outcome: Some(outcome.clone()),
            created_at: time(created_at),
            completed_at: completed_at.map(time),
            expires_at: expires_at.map(time),
            execution_span,
        }))
    }
}

impl ExpiredCleanup for MysqlStore {
    /// One short READ COMMITTED transaction: the oldest expired keys through the expiry index,
    /// `FOR UPDATE SKIP LOCKED` (a row a request holds is left for the next batch, and no gap
    /// lock blocks inserts), then `DELETE`s of those keys by primary key, 1,000
    /// keys each (a batch of 21,846 keys or more would pass MySQL's 65,535 placeholders).
    async fn delete_expired_batch(&self, batch_size: u32) -> Result<u64, StoreError> {
        let mut tx = begin_read_committed(&self.pool)
            .await
            .map_err(store_error)?;
        let keys: Vec<(String, String, String)> = sqlx::query_as(self.sql.expired.clone())
            .bind(i64::from(batch_size))
            .fetch_all(&mut *tx)
            .await
            .map_err(store_error)?;
        if keys.is_empty() {
            tx.rollback().await.map_err(store_error)?;
            return Ok(0);
        }
        let mut deleted = 0;
        for chunk in keys.chunks(crate::CHUNK) {
            let sql: SqlStr = self.sql.delete_keys(chunk.len());
            let mut delete = sqlx::query(sql);
            for (operation, scope, key) in chunk {
                delete = delete.bind(operation).bind(scope).bind(key);
            }
            deleted += delete
                .execute(&mut *tx)
                .await
                .map_err(store_error)?
                .rows_affected();
        }
        tx.commit().await.map_err(store_error)?;
        Ok(deleted)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use idempotency_core::{Fingerprint, Scope};

    use super::*;
    use crate::TransactionRolledBack;

    /// The MySQL 8 path, run on whatever server the tests have (MySQL 8 itself is not among
    /// them): an acquire in a transaction the server ended (a `ROLLBACK` sent as plain SQL
    /// leaves the session as a deadlock does) fails instead of committing a record on its own,
    /// with an unbounded wait and with a bounded one (whose budget is set in the check's round
    /// trip); in an open transaction it acquires and puts the budget back.
    #[tokio::test]
    async fn the_mysql_8_acquire_refuses_a_transaction_the_server_ended() {
        let pool = idempotency_testing::mysql_pool_with(1).await;
        let mut config = PersistenceConfig::default();
        config.schema.mode = SchemaMode::Create;
        let store = MysqlStore::from_config(pool.clone(), &config)
            .await
            .unwrap();
        let _ = store.server.set(Server {
            mariadb: false,
            rollback_on_timeout: false,
        });
        let id = RecordId::new(
            idempotency_core::testing::op("OP"),
            Scope::new("s").unwrap(),
            idempotency_core::testing::key("mysql-8"),
        );
        let fingerprint = Fingerprint::new("ab".repeat(32));
        let claim = |wait| Claim {
            id: &id,
            fingerprint: &fingerprint,
            ttl: None,
            wait,
        };
        let lock_wait = async |conn: &mut MySqlConnection| -> u64 {
            sqlx::query_scalar("SELECT @@SESSION.innodb_lock_wait_timeout")
                .fetch_one(conn)
                .await
                .unwrap()
        };
        let own = lock_wait(&mut pool.acquire().await.unwrap()).await;
        for wait in [
            LockWait::Unbounded,
            LockWait::Timeout(Duration::from_secs(2)),
        ] {
            let mut tx = connect::begin(&pool).await.unwrap();
            sqlx::raw_sql("ROLLBACK").execute(&mut *tx).await.unwrap();
            let error = store.acquire(&mut tx, &claim(wait)).await.unwrap_err();
            let StoreError::Conflict(source) = &error else {
                panic!("not a conflict: {error:?}");
            };
            assert!(source.is::<TransactionRolledBack>(), "{source:?}");
            assert!(sqlx::query("SELECT 1").execute(&mut *tx).await.is_err());
        }
        let records: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM idempotency_records")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(records, 0, "a record committed on its own");
        assert_eq!(lock_wait(&mut pool.acquire().await.unwrap()).await, own);
        let mut tx = connect::begin(&pool).await.unwrap();
        let acquired = store
            .acquire(&mut tx, &claim(LockWait::Timeout(Duration::from_secs(2))))
            .await
            .unwrap();
        assert_eq!(acquired, Acquire::Acquired);
        assert_eq!(lock_wait(&mut tx).await, own);
        tx.rollback().await.unwrap();
    }

    #[test]
    fn wait_budgets_are_whole_seconds() {
        assert_eq!(lock_wait_seconds(LockWait::Unbounded), None);
        assert_eq!(lock_wait_seconds(LockWait::NoWait), Some(0));
        assert_eq!(
            lock_wait_seconds(LockWait::Timeout(Duration::from_millis(200))),
            Some(1)
        );
        assert_eq!(
            lock_wait_seconds(LockWait::Timeout(Duration::from_millis(2001))),
            Some(3)
        );
        assert_eq!(
            lock_wait_seconds(LockWait::Timeout(Duration::MAX)),
            Some(1_073_741_824)
        );
    }
}
