//! [`Database`]: the pools the facade assembles a store (and an outbox) on.

use std::future::Future;

use idempotency_core::config::PersistenceConfig;
#[cfg(feature = "outbox")]
use idempotency_core::config::Pooler;
use idempotency_core::{BoxError, ExpiredCleanup, IdempotencyStore};

use crate::Error;

/// A connection pool the facade can build the idempotency store (and, with the `outbox`
/// feature, the outbox) on: `sqlx::PgPool` (feature `postgres`), `sqlx::SqlitePool`
/// (`sqlite`), `sqlx::MySqlPool` (`mysql`).
pub trait Database: Clone + Send + Sync + 'static {
    /// The idempotency store of this database.
    type Store: IdempotencyStore + ExpiredCleanup + Clone + Send + Sync + 'static;
    /// The outbox of this database.
    #[cfg(feature = "outbox")]
    #[cfg_attr(docsrs, doc(cfg(feature = "outbox")))]
    type Outbox: idempotency_outbox::RelayStore
        + idempotency_outbox::Housekeeping
        + idempotency_outbox::Enqueue<Connection = <Self::Store as IdempotencyStore>::Connection>
        + Clone
        + Send
        + Sync
        + 'static;
    /// Whether the outbox can wake its relay by notification (`outbox.notify-channel`).
    const NOTIFICATIONS: bool;
    /// Whether the store waits for a held key by itself, so that `in-flight.policy` and
    /// `in-flight.timeout` take effect. SQLite has no per-key wait: a duplicate waits for the
    /// one write lock every writer shares, up to the pool's busy timeout, so those keys are
    /// refused there when set. Default `true`.
    const IN_FLIGHT_POLICY: bool = true;
    /// Whether the outbox table can be time-partitioned (`outbox.partitioning.enabled`):
    /// PostgreSQL only. Default `false`.
    const PARTITIONED_OUTBOX: bool = false;
    /// Whether the store and the outbox can work behind a pooler in transaction mode
    /// (`persistence.pooler: transaction`): PostgreSQL only. Default `false`.
    const TRANSACTION_POOLER: bool = false;
    /// The database the pool's connect options name (server, port and database; the file for
    /// SQLite; never a password), without asking it. Default empty.
    fn deployment(&self) -> String {
        String::new()
    }
    /// Where the records table `table_name` (`persistence.table-name`) really is, asked of
    /// the database once at start-up: [`deployment`](Self::deployment) and what connect
    /// options cannot tell. PostgreSQL: the database the connections are in, the schema the
    /// name resolves to through their `search_path` (schema per deployment on one database),
    /// and the server's system identifier when the role may read `pg_control_system()` (two
    /// servers reached by one host name; with it the server's address is left out, so that
    /// instances and the command line reaching one server by different addresses agree); MySQL: the database an unqualified name is in
    /// (`DATABASE()`); SQLite: the file's canonical absolute path (one relative path in two
    /// working directories, one file spelled two ways). With `table_name` it makes the Redis
    /// key prefix of the deployment, so that two deployments sharing one Redis never read
    /// each other's records. Default: [`deployment`](Self::deployment).
    fn table_location(
        &self,
        table_name: &str,
    ) -> impl Future<Output = Result<String, Error>> + Send {
        let _ = table_name;
        std::future::ready(Ok(self.deployment()))
    }
    /// Asks the database one round trip (`SELECT 1` in the simple query protocol, which holds
    /// behind a transaction pooler) through the pool, for the health check.
    /// Unbounded as the pool makes it (a pool waits up to its `acquire_timeout` for a
    /// connection): the caller bounds it.
    fn ping(&self) -> impl Future<Output = Result<(), BoxError>> + Send;
    /// The store, with `persistence.table-name` and `persistence.schema.mode` applied.
    fn store(
        self,
        config: &PersistenceConfig,
    ) -> impl Future<Output = Result<Self::Store, Error>> + Send;
    /// The outbox, with `outbox.table-name`, `ordering`, `notify-channel` and `schema.mode`
    /// applied, for a pool behind `pooler` (`persistence.pooler`: the outbox shares the
    /// store's pool).
    #[cfg(feature = "outbox")]
    #[cfg_attr(docsrs, doc(cfg(feature = "outbox")))]
    fn outbox(
        self,
        config: &idempotency_outbox::config::OutboxConfig,
        pooler: Pooler,
    ) -> impl Future<Output = Result<Self::Outbox, Error>> + Send;
}

#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
fn store_error(error: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::Store(Box::new(error))
}

#[cfg(all(
    feature = "outbox",
    any(feature = "postgres", feature = "sqlite", feature = "mysql")
))]
fn outbox_error(error: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::Outbox(Box::new(error))
}

/// `scheme://host:port/database` of a server database: the database defaults to the user's
/// name, as both servers do.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn server_deployment(
    scheme: &str,
    host: &str,
    port: u16,
    socket: Option<&std::path::PathBuf>,
    database: Option<&str>,
    user: &str,
) -> String {
    let server = match socket {
        Some(socket) => socket.display().to_string(),
        None => format!("{host}:{port}"),
    };
    format!("{scheme}://{server}/{}", database.unwrap_or(user))
}

/// PostgreSQL's [`Database::table_location`]. Simple-protocol statements with no parameter
/// (the table name is checked and quoted first), which hold behind a transaction pooler.
#[cfg(feature = "postgres")]
async fn postgres_location(pool: &sqlx::PgPool, table_name: &str) -> Result<String, Error> {
    use sqlx::Row;
    let table = idempotency_pg::TableName::parse(table_name).map_err(store_error)?;
    // The schema of the table the name resolves to, else the one it would be created in.
    let fallback = match table.schema() {
        Some(schema) => format!("'{schema}'"),
        None => "current_schema()".to_owned(),
    };
    let row = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "SELECT current_database()::text, coalesce((SELECT n.nspname::text \
         FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
         WHERE c.oid = to_regclass('{}')), {fallback}, '')::text",
        table.quoted()
    )))
    .fetch_one(pool)
    .await
    .map_err(store_error)?;
    let database: String = row.try_get(0).map_err(store_error)?;
    let schema: String = row.try_get(1).map_err(store_error)?;
    // The server itself. A role that may not read it (or a server without the function) leaves
    // it out; any other failure stops start-up, so that every instance of a deployment agrees.
    let server = match sqlx::raw_sql("SELECT system_identifier::text FROM pg_control_system()")
        .fetch_one(pool)
        .await
    {
        Ok(row) => row.try_get::<String, _>(0).map_err(store_error)?,
        // Only "not allowed" (42501) and "no such function" (42883) mean unreadable: any other
        // error (a server starting up or shutting down, a timeout) must not give this
        // instance a prefix of its own for as long as it runs.
        Err(sqlx::Error::Database(error))
            if matches!(error.code().as_deref(), Some("42501" | "42883")) =>
        {
            tracing::info!(%error, "the server's system identifier is not readable; the Redis key prefix names the server by its address");
            String::new()
        }
        Err(error) => return Err(store_error(error)),
    };
    // With the server's identity, its address is left out: every instance, and the command
    // line through a tunnel or PgBouncer, computes one prefix however it reaches the server.
    Ok(if server.is_empty() {
        format!("{} database={database} schema={schema}", pool.deployment())
    } else {
        format!("postgres system={server} database={database} schema={schema}")
    })
}

/// MySQL's [`Database::table_location`]: an unqualified name's database is the connection's.
#[cfg(feature = "mysql")]
async fn mysql_location(pool: &sqlx::MySqlPool, table_name: &str) -> Result<String, Error> {
    use sqlx::Row;
    let table = idempotency_mysql::TableName::parse(table_name).map_err(store_error)?;
    let database = match table.database() {
        Some(database) => database.to_owned(),
        None => sqlx::raw_sql("SELECT COALESCE(DATABASE(), '')")
            .fetch_one(pool)
            .await
            .and_then(|row| row.try_get::<String, _>(0))
            .map_err(store_error)?,
    };
    Ok(format!("{} database={database}", pool.deployment()))
}

/// SQLite's [`Database::table_location`]: the file, canonical (an in-memory database or a
/// path that cannot be resolved stays as given).
#[cfg(feature = "sqlite")]
async fn sqlite_location(pool: &sqlx::SqlitePool, table_name: &str) -> Result<String, Error> {
    let _ = table_name;
    let options = pool.connect_options();
    let file = options.get_filename();
    let path = std::fs::canonicalize(file).unwrap_or_else(|_| file.to_path_buf());
    Ok(format!("sqlite://{}", path.display()))
}

/// The SQLite and MySQL outboxes have no transaction pooler to honour (`check` refuses
/// `persistence.pooler: transaction` for them before this runs).
#[cfg(all(feature = "outbox", feature = "sqlite"))]
async fn sqlite_outbox(
    pool: sqlx::SqlitePool,
    config: &idempotency_outbox::config::OutboxConfig,
    _pooler: Pooler,
) -> Result<idempotency_sqlite::SqliteOutbox, idempotency_outbox::Error> {
    idempotency_sqlite::SqliteOutbox::from_config(pool, config).await
}

/// See [`sqlite_outbox`].
#[cfg(all(feature = "outbox", feature = "mysql"))]
async fn mysql_outbox(
    pool: sqlx::MySqlPool,
    config: &idempotency_outbox::config::OutboxConfig,
    _pooler: Pooler,
) -> Result<idempotency_mysql::MysqlOutbox, idempotency_outbox::Error> {
    idempotency_mysql::MysqlOutbox::from_config(pool, config).await
}

macro_rules! database {
    (
        $feature:literal, $pool:ty, $store:ty, $outbox:ty, $outbox_new:path, $notifications:expr,
        $partitions:expr, $in_flight:expr, $pooler:expr, $location:path,
        |$options:ident| $deployment:expr
    ) => {
        #[cfg(feature = $feature)]
        #[cfg_attr(docsrs, doc(cfg(feature = $feature)))]
        impl Database for $pool {
            type Store = $store;
            #[cfg(feature = "outbox")]
            type Outbox = $outbox;
            const NOTIFICATIONS: bool = $notifications;
            const IN_FLIGHT_POLICY: bool = $in_flight;
            const PARTITIONED_OUTBOX: bool = $partitions;
            const TRANSACTION_POOLER: bool = $pooler;

            fn deployment(&self) -> String {
                let $options = self.connect_options();
                $deployment
            }

            async fn table_location(&self, table_name: &str) -> Result<String, Error> {
                $location(self, table_name).await
            }

            async fn ping(&self) -> Result<(), BoxError> {
                // The simple query protocol: one exchange, no prepared statement. Behind a
                // transaction pooler (PgBouncer) a named statement meets a server connection
                // that already has it ("prepared statement sqlx_s_1 already exists"), and an
                // unnamed one parsed in one exchange may be bound on another server connection
                // in the next; either way the service would report its database down.
                sqlx::raw_sql("SELECT 1")
                    .execute(self)
                    .await
                    .map(|_| ())
                    .map_err(|error| Box::new(error) as BoxError)
            }

            async fn store(self, config: &PersistenceConfig) -> Result<Self::Store, Error> {
                <$store>::from_config(self, config)
                    .await
                    .map_err(store_error)
            }

            #[cfg(feature = "outbox")]
            async fn outbox(
                self,
                config: &idempotency_outbox::config::OutboxConfig,
                pooler: Pooler,
            ) -> Result<Self::Outbox, Error> {
                $outbox_new(self, config, pooler)
                    .await
                    .map_err(outbox_error)
            }
        }
    };
}

database!(
    "postgres",
    sqlx::PgPool,
    idempotency_pg::PgStore,
    idempotency_pg::PgOutbox,
    idempotency_pg::PgOutbox::from_config_with_pooler,
    true,
    true,
    true,
    true,
    postgres_location,
    |o| server_deployment(
        "postgres",
        o.get_host(),
        o.get_port(),
        o.get_socket(),
        o.get_database(),
        o.get_username()
    )
);
database!(
    "sqlite",
    sqlx::SqlitePool,
    idempotency_sqlite::SqliteStore,
    idempotency_sqlite::SqliteOutbox,
    sqlite_outbox,
    false,
    false,
    false,
    false,
    sqlite_location,
    |o| format!("sqlite://{}", o.get_filename().display())
);
database!(
    "mysql",
    sqlx::MySqlPool,
    idempotency_mysql::MysqlStore,
    idempotency_mysql::MysqlOutbox,
    mysql_outbox,
    false,
    false,
    true,
    false,
    mysql_location,
    |o| server_deployment(
        "mysql",
        o.get_host(),
        o.get_port(),
        o.get_socket(),
        o.get_database(),
        o.get_username()
    )
);
