//! The databases a subject runs on: a fresh isolated store with a side table where effects are
//! written in the business transaction, what reads the committed effects back, and the check
//! that every pooled connection came back clean.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use idempotency_testing::HoldingProxy;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use idempotency_core::IdempotencyStore;
use idempotency_core::config::{PersistenceConfig, SchemaMode};
use idempotency_core::store::InsertCompleted;
use idempotency_mysql::MysqlStore;
use idempotency_pg::PgStore;
use idempotency_sqlite::SqliteStore;
use sqlx::{AssertSqlSafe, Row};

use crate::CheckError;
use crate::faults::{Faults, Injected};
use crate::history::Effect;

/// The wire between a store's pool and its server: a proxy whose answers can be held, so that
/// requests dropped meanwhile are dropped with a statement (a `BEGIN`, a `COMMIT`) on the wire.
pub type Wire = Arc<HoldingProxy>;

/// Holds the wire's answers for short random stretches until `done`, then lets them through;
/// counts each stretch in `faults`.
pub(crate) async fn stall(wire: Wire, seed: u64, done: Arc<AtomicBool>, faults: Arc<Faults>) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x0057_4111);
    while !done.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(rng.random_range(20..150))).await;
        wire.hold();
        faults.count(Injected::WireHold);
        tokio::time::sleep(Duration::from_millis(rng.random_range(5..40))).await;
        wire.release();
    }
    wire.release();
}

/// One effect to write inside the business transaction.
#[derive(Debug, Clone, Copy)]
pub struct NewEffect<'a> {
    /// The tenant (scope).
    pub tenant: &'a str,
    /// The key's number.
    pub key: usize,
    /// The request identity.
    pub identity: &'a str,
    /// The operation.
    pub op: u64,
}

/// A database the checker runs a subject on.
pub trait Backend: IdempotencyStore + InsertCompleted + Clone + Send + Sync + 'static {
    /// Its name in subjects (`pg`, `sqlite`, `mysql`).
    const NAME: &'static str;
    /// A fresh store on its own schema, database or file, with the records table and the
    /// effects side table; on a server, its pool goes through a [`Wire`] that can stall.
    fn fresh() -> impl Future<Output = Result<(Self, Option<Wire>), CheckError>> + Send;
    /// Writes `effect` on the business transaction's connection; returns its id.
    fn insert_effect(
        conn: &mut Self::Connection,
        effect: NewEffect<'_>,
    ) -> impl Future<Output = Result<i64, sqlx::Error>> + Send;
    /// Runs a statement that fails on a unique key (inserting the row `taken` again), as a
    /// handler that catches a constraint violation does; `Ok` when it failed that way, the
    /// unexpected outcome otherwise.
    fn violate_unique(
        conn: &mut Self::Connection,
    ) -> impl Future<Output = Result<(), String>> + Send;
    /// Kills the connection's own server session, as a database restart or an operator would,
    /// mid-transaction; whether a session was killed (nothing on SQLite, which has no server).
    fn kill(conn: &mut Self::Connection) -> impl Future<Output = bool> + Send;
    /// Every committed effect.
    fn effects(&self) -> impl Future<Output = Result<Vec<Effect>, CheckError>> + Send;
    /// One line per pooled connection that is inside a transaction or has a session setting a
    /// store changed and did not restore.
    fn unclean_connections(&self) -> impl Future<Output = Result<Vec<String>, CheckError>> + Send;
}

const EFFECTS: &str = "check_effects";

/// A table with one row, `taken`, whose name is unique: inserting it again fails.
const TAKEN: &str = "check_taken";

/// Inserts [`TAKEN`]'s row (again).
const INSERT_TAKEN: &str = "INSERT INTO check_taken (name) VALUES ('taken')";

/// Creates [`TAKEN`] with its row.
async fn create_taken<'c, E>(pool: E) -> Result<(), CheckError>
where
    E: sqlx::Executor<'c> + Copy,
{
    sqlx::raw_sql(AssertSqlSafe(format!(
        "CREATE TABLE {TAKEN} (name VARCHAR(16) PRIMARY KEY)"
    )))
    .execute(pool)
    .await
    .map_err(db)?;
    sqlx::raw_sql(INSERT_TAKEN)
        .execute(pool)
        .await
        .map_err(db)?;
    Ok(())
}

/// The insert of [`TAKEN`]'s row again: `Ok` when it failed on the unique key.
fn violated<T>(inserted: Result<T, sqlx::Error>) -> Result<(), String> {
    match inserted {
        Err(sqlx::Error::Database(e)) if e.is_unique_violation() => Ok(()),
        Err(other) => Err(other.to_string()),
        Ok(_) => Err(format!("the row `taken` of {TAKEN} was inserted twice")),
    }
}

/// How long every pooled connection has to come back once the history is over.
const RETURN_WITHIN: Duration = Duration::from_secs(10);

/// `host:port` of a server URL (`scheme://[user@]host:port/...`).
pub(crate) fn host_port(url: &str, default_port: u16) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    let host = rest.split(['/', '?']).next().unwrap_or(rest);
    if host.contains(':') {
        host.to_owned()
    } else {
        format!("{host}:{default_port}")
    }
}

fn effect_from(
    id: i64,
    tenant: String,
    key: i64,
    identity: String,
    op: i64,
) -> Result<Effect, CheckError> {
    Ok(Effect {
        id,
        tenant,
        key: usize::try_from(key).map_err(|_| CheckError::Setup(format!("key {key}")))?,
        identity,
        op: u64::try_from(op).map_err(|_| CheckError::Setup(format!("op {op}")))?,
    })
}

#[allow(clippy::needless_pass_by_value)] // used as `map_err(db)`
fn db(error: sqlx::Error) -> CheckError {
    CheckError::Database(error.to_string())
}

impl Backend for PgStore {
    const NAME: &'static str = "pg";

    async fn fresh() -> Result<(Self, Option<Wire>), CheckError> {
        let direct = idempotency_testing::pg_pool_with(1).await;
        let schema: String = sqlx::query_scalar("SELECT current_schema()")
            .fetch_one(&direct)
            .await
            .map_err(db)?;
        direct.close().await;
        let url = idempotency_testing::database_url();
        let wire = Arc::new(HoldingProxy::start(host_port(&url, 5432)).await);
        let options = url
            .parse::<sqlx::postgres::PgConnectOptions>()
            .map_err(db)?
            .host("127.0.0.1")
            .port(wire.port())
            .options([("search_path", schema.as_str())]);
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(8)
            .acquire_timeout(Duration::from_secs(60))
            .connect_with(options)
            .await
            .map_err(db)?;
        let store = PgStore::new(pool);
        store
            .create_schema()
            .await
            .map_err(|e| CheckError::Setup(e.to_string()))?;
        sqlx::raw_sql(AssertSqlSafe(format!(
            "CREATE TABLE {EFFECTS} (id bigserial PRIMARY KEY, tenant text NOT NULL, \
             idem_key bigint NOT NULL, identity text NOT NULL, op bigint NOT NULL)"
        )))
        .execute(store.pool())
        .await
        .map_err(db)?;
        create_taken(store.pool()).await?;
        Ok((store, Some(wire)))
    }

    async fn insert_effect(
        conn: &mut Self::Connection,
        effect: NewEffect<'_>,
    ) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar(AssertSqlSafe(format!(
            "INSERT INTO {EFFECTS} (tenant, idem_key, identity, op) VALUES ($1, $2, $3, $4) \
             RETURNING id"
        )))
        .bind(effect.tenant)
        .bind(i64::try_from(effect.key).unwrap_or(i64::MAX))
        .bind(effect.identity)
        .bind(i64::try_from(effect.op).unwrap_or(i64::MAX))
        .fetch_one(conn)
        .await
    }

    async fn violate_unique(conn: &mut Self::Connection) -> Result<(), String> {
        violated(sqlx::raw_sql(INSERT_TAKEN).execute(conn).await)
    }

    async fn kill(conn: &mut Self::Connection) -> bool {
        // The session ends while answering: its own termination (57P01) or a closed connection.
        match sqlx::raw_sql("SELECT pg_terminate_backend(pg_backend_pid())")
            .execute(conn)
            .await
        {
            Ok(_) => true,
            Err(sqlx::Error::Database(e)) => e.code().as_deref() == Some("57P01"),
            Err(sqlx::Error::Io(_) | sqlx::Error::Protocol(_)) => true,
            Err(_) => false,
        }
    }

    async fn effects(&self) -> Result<Vec<Effect>, CheckError> {
        let rows = sqlx::query(AssertSqlSafe(format!(
            "SELECT id, tenant, idem_key, identity, op FROM {EFFECTS} ORDER BY id"
        )))
        .fetch_all(self.pool())
        .await
        .map_err(db)?;
        rows.into_iter()
            .map(|r| effect_from(r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
            .collect()
    }

    async fn unclean_connections(&self) -> Result<Vec<String>, CheckError> {
        pg_unclean(self.pool()).await
    }
}

impl Backend for SqliteStore {
    const NAME: &'static str = "sqlite";

    async fn fresh() -> Result<(Self, Option<Wire>), CheckError> {
        let path =
            std::env::temp_dir().join(format!("{}.db", idempotency_testing::unique_name("check")));
        let mut config = PersistenceConfig::default();
        config.schema.mode = SchemaMode::Create;
        let path = path
            .to_str()
            .ok_or_else(|| CheckError::Setup("temporary path is not UTF-8".to_owned()))?
            .to_owned();
        let store = SqliteStore::connect(&path, &config)
            .await
            .map_err(|e| CheckError::Setup(e.to_string()))?;
        sqlx::raw_sql(AssertSqlSafe(format!(
            "CREATE TABLE {EFFECTS} (id INTEGER PRIMARY KEY, tenant TEXT NOT NULL, \
             idem_key INTEGER NOT NULL, identity TEXT NOT NULL, op INTEGER NOT NULL)"
        )))
        .execute(store.pool())
        .await
        .map_err(db)?;
        create_taken(store.pool()).await?;
        Ok((store, None))
    }

    async fn insert_effect(
        conn: &mut Self::Connection,
        effect: NewEffect<'_>,
    ) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar(AssertSqlSafe(format!(
            "INSERT INTO {EFFECTS} (tenant, idem_key, identity, op) VALUES (?, ?, ?, ?) \
             RETURNING id"
        )))
        .bind(effect.tenant)
        .bind(i64::try_from(effect.key).unwrap_or(i64::MAX))
        .bind(effect.identity)
        .bind(i64::try_from(effect.op).unwrap_or(i64::MAX))
        .fetch_one(conn)
        .await
    }

    async fn violate_unique(conn: &mut Self::Connection) -> Result<(), String> {
        violated(sqlx::raw_sql(INSERT_TAKEN).execute(conn).await)
    }

    async fn kill(conn: &mut Self::Connection) -> bool {
        let _ = conn;
        false
    }

    async fn effects(&self) -> Result<Vec<Effect>, CheckError> {
        let rows = sqlx::query(AssertSqlSafe(format!(
            "SELECT id, tenant, idem_key, identity, op FROM {EFFECTS} ORDER BY id"
        )))
        .fetch_all(self.pool())
        .await
        .map_err(db)?;
        rows.into_iter()
            .map(|r| effect_from(r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
            .collect()
    }

    async fn unclean_connections(&self) -> Result<Vec<String>, CheckError> {
        sqlite_unclean(self.pool()).await
    }
}

impl Backend for MysqlStore {
    const NAME: &'static str = "mysql";

    async fn fresh() -> Result<(Self, Option<Wire>), CheckError> {
        let direct = idempotency_testing::mysql_pool_with(1).await;
        let database: String = sqlx::query_scalar("SELECT DATABASE()")
            .fetch_one(&direct)
            .await
            .map_err(db)?;
        direct.close().await;
        let url = idempotency_testing::mysql_url();
        let wire = Arc::new(HoldingProxy::start(host_port(&url, 3306)).await);
        let options = url
            .parse::<sqlx::mysql::MySqlConnectOptions>()
            .map_err(db)?
            .host("127.0.0.1")
            .port(wire.port())
            .database(&database);
        let pool = sqlx::mysql::MySqlPoolOptions::new()
            .max_connections(8)
            .acquire_timeout(Duration::from_secs(60))
            .connect_with(options)
            .await
            .map_err(db)?;
        let store = MysqlStore::new(pool);
        store
            .create_schema()
            .await
            .map_err(|e| CheckError::Setup(e.to_string()))?;
        sqlx::raw_sql(AssertSqlSafe(format!(
            "CREATE TABLE {EFFECTS} (id BIGINT AUTO_INCREMENT PRIMARY KEY, \
             tenant VARCHAR(64) NOT NULL, idem_key BIGINT NOT NULL, identity TEXT NOT NULL, \
             op BIGINT NOT NULL) ENGINE=InnoDB"
        )))
        .execute(store.pool())
        .await
        .map_err(db)?;
        create_taken(store.pool()).await?;
        Ok((store, Some(wire)))
    }

    async fn insert_effect(
        conn: &mut Self::Connection,
        effect: NewEffect<'_>,
    ) -> Result<i64, sqlx::Error> {
        let result = sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {EFFECTS} (tenant, idem_key, identity, op) VALUES (?, ?, ?, ?)"
        )))
        .bind(effect.tenant)
        .bind(i64::try_from(effect.key).unwrap_or(i64::MAX))
        .bind(effect.identity)
        .bind(i64::try_from(effect.op).unwrap_or(i64::MAX))
        .execute(conn)
        .await?;
        Ok(i64::try_from(result.last_insert_id()).unwrap_or(i64::MAX))
    }

    async fn violate_unique(conn: &mut Self::Connection) -> Result<(), String> {
        violated(sqlx::raw_sql(INSERT_TAKEN).execute(conn).await)
    }

    async fn kill(conn: &mut Self::Connection) -> bool {
        let id: Result<u64, _> = sqlx::query_scalar("SELECT CONNECTION_ID()")
            .fetch_one(&mut *conn)
            .await;
        let Ok(id) = id else { return false };
        let _ = sqlx::raw_sql(AssertSqlSafe(format!("KILL CONNECTION {id}")))
            .execute(conn)
            .await;
        true
    }

    async fn effects(&self) -> Result<Vec<Effect>, CheckError> {
        let rows = sqlx::query(AssertSqlSafe(format!(
            "SELECT id, tenant, idem_key, identity, op FROM {EFFECTS} ORDER BY id"
        )))
        .fetch_all(self.pool())
        .await
        .map_err(db)?;
        rows.into_iter()
            .map(|r| effect_from(r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
            .collect()
    }

    async fn unclean_connections(&self) -> Result<Vec<String>, CheckError> {
        mysql_unclean(self.pool()).await
    }
}

/// One line per connection of `pool` that is unclean after a history, or does not come back
/// within [`RETURN_WITHIN`]. PostgreSQL: inside a transaction (a savepoint is taken),
/// `lock_timeout` / `statement_timeout` not at 0, or any setting changed for the session.
pub(crate) async fn pg_unclean(pool: &sqlx::PgPool) -> Result<Vec<String>, CheckError> {
    let size = pool.options().get_max_connections();
    let mut held = Vec::new();
    let mut unclean = Vec::new();
    for n in 0..size {
        let Ok(conn) = tokio::time::timeout(RETURN_WITHIN, pool.acquire()).await else {
            unclean.push(format!(
                "connection {n} did not come back to the pool within {RETURN_WITHIN:?}"
            ));
            break;
        };
        let mut conn = conn.map_err(db)?;
        // A savepoint is refused outside a transaction block (25P01), taken inside one.
        let in_tx = sqlx::raw_sql("SAVEPOINT check_probe")
            .execute(&mut *conn)
            .await
            .is_ok();
        if in_tx {
            sqlx::raw_sql("RELEASE SAVEPOINT check_probe")
                .execute(&mut *conn)
                .await
                .map_err(db)?;
        }
        // Any setting changed by a `SET` (not `SET LOCAL`) outlives the transaction: its
        // source is then `session`.
        let row = sqlx::query(
            "SELECT current_setting('lock_timeout'), current_setting('statement_timeout'), \
             (SELECT coalesce(string_agg(name || '=' || setting, ', ' ORDER BY name), '') \
              FROM pg_settings WHERE source = 'session')",
        )
        .fetch_one(&mut *conn)
        .await
        .map_err(db)?;
        let (lock, statement, set): (String, String, String) = (row.get(0), row.get(1), row.get(2));
        if in_tx || lock != "0" || statement != "0" || !set.is_empty() {
            unclean.push(format!(
                "connection {n}: in a transaction: {in_tx}, lock_timeout {lock}, \
                 statement_timeout {statement}, set in the session: [{set}]"
            ));
        }
        held.push(conn);
    }
    Ok(unclean)
}

/// One line per connection of `pool` that is unclean after a history, or does not come back
/// within [`RETURN_WITHIN`]. SQLite: inside a transaction (a nested `BEGIN` is refused).
pub(crate) async fn sqlite_unclean(pool: &sqlx::SqlitePool) -> Result<Vec<String>, CheckError> {
    let size = pool.options().get_max_connections();
    let mut held = Vec::new();
    let mut unclean = Vec::new();
    for n in 0..size {
        let Ok(conn) = tokio::time::timeout(RETURN_WITHIN, pool.acquire()).await else {
            unclean.push(format!(
                "connection {n} did not come back to the pool within {RETURN_WITHIN:?}"
            ));
            break;
        };
        let mut conn = conn.map_err(db)?;
        // A connection inside a transaction refuses a nested BEGIN.
        match sqlx::raw_sql("BEGIN").execute(&mut *conn).await {
            Ok(_) => {
                sqlx::raw_sql("ROLLBACK")
                    .execute(&mut *conn)
                    .await
                    .map_err(db)?;
            }
            Err(error) => unclean.push(format!("connection {n}: {error}")),
        }
        held.push(conn);
    }
    Ok(unclean)
}

/// One line per connection of `pool` that is unclean after a history, or does not come back
/// within [`RETURN_WITHIN`]. MariaDB: inside a transaction, autocommit off, or
/// `innodb_lock_wait_timeout`, the isolation level or `lock_wait_timeout` not at the server's
/// default.
pub(crate) async fn mysql_unclean(pool: &sqlx::MySqlPool) -> Result<Vec<String>, CheckError> {
    let size = pool.options().get_max_connections();
    let mut held = Vec::new();
    let mut unclean = Vec::new();
    for n in 0..size {
        let Ok(conn) = tokio::time::timeout(RETURN_WITHIN, pool.acquire()).await else {
            // Found by this checker: a statement dropped during its prepare left sqlx's
            // connection waiting for ever in the pool's release ping, every server session
            // idle (fixed by `idempotency_mysql::MysqlTransaction`). The server's sessions
            // tell a connection held on the client side from one busy on the server.
            unclean.push(format!(
                "connection {n} did not come back to the pool within {RETURN_WITHIN:?}; \
                 the server's sessions: {}",
                mysql_sessions().await
            ));
            break;
        };
        let mut conn = conn.map_err(db)?;
        let row = sqlx::query(
            "SELECT CAST(@@in_transaction AS SIGNED), \
             CAST(@@SESSION.innodb_lock_wait_timeout AS SIGNED), \
             CAST(@@GLOBAL.innodb_lock_wait_timeout AS SIGNED), \
             CAST(@@autocommit AS SIGNED), @@SESSION.tx_isolation, @@GLOBAL.tx_isolation, \
             CAST(@@SESSION.lock_wait_timeout AS SIGNED), \
             CAST(@@GLOBAL.lock_wait_timeout AS SIGNED)",
        )
        .fetch_one(&mut *conn)
        .await
        .map_err(db)?;
        let (in_tx, session, global): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
        let autocommit: i64 = row.get(3);
        let (isolation, default_isolation): (String, String) = (row.get(4), row.get(5));
        let (lock_wait, default_lock_wait): (i64, i64) = (row.get(6), row.get(7));
        if in_tx != 0
            || session != global
            || autocommit != 1
            || isolation != default_isolation
            || lock_wait != default_lock_wait
        {
            unclean.push(format!(
                "connection {n}: in a transaction: {in_tx}, innodb_lock_wait_timeout \
                 {session} (server default {global}), autocommit {autocommit}, isolation \
                 {isolation} (server default {default_isolation}), lock_wait_timeout \
                 {lock_wait} (server default {default_lock_wait})"
            ));
        }
        held.push(conn);
    }
    Ok(unclean)
}

/// What the MariaDB server's sessions are doing (user sessions, with their transactions): the
/// detail of a connection that did not come back.
async fn mysql_sessions() -> String {
    let url = idempotency_testing::mysql_url();
    let Ok(mut admin) = <sqlx::MySqlConnection as sqlx::Connection>::connect(&url).await else {
        return "(no admin connection)".to_owned();
    };
    let rows = sqlx::query(
        "SELECT CAST(p.ID AS SIGNED), COALESCE(p.DB, ''), COALESCE(p.COMMAND, ''), \
         CAST(COALESCE(p.TIME, 0) AS SIGNED), COALESCE(p.STATE, ''), \
         COALESCE(LEFT(p.INFO, 120), ''), COALESCE(t.trx_state, 'no trx') \
         FROM information_schema.PROCESSLIST p \
         LEFT JOIN information_schema.INNODB_TRX t ON t.trx_mysql_thread_id = p.ID \
         WHERE p.DB LIKE 'it\\_%' AND p.ID <> CONNECTION_ID()",
    )
    .fetch_all(&mut admin)
    .await;
    match rows {
        Ok(rows) => rows
            .iter()
            .map(|r| {
                format!(
                    "[{} {} {} {}s {} `{}` {}]",
                    r.get::<i64, _>(0),
                    r.get::<String, _>(1),
                    r.get::<String, _>(2),
                    r.get::<i64, _>(3),
                    r.get::<String, _>(4),
                    r.get::<String, _>(5),
                    r.get::<String, _>(6)
                )
            })
            .collect::<Vec<_>>()
            .join(" "),
        Err(error) => format!("(processlist: {error})"),
    }
}
