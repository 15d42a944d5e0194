//! Test support for the workspace: where the real servers are, and isolated databases on them.
//!
//! Servers are found through `DATABASE_URL`, `REDIS_URL`, `NATS_URL` and `AMQP_URL`, defaulting to
//! the local ports. A server that does not answer fails the test loudly with what to set; tests
//! never skip.
//!
//! With the `testcontainers` feature (the laptop path), when `DATABASE_URL` / `REDIS_URL` is not
//! set and nothing answers on the local port, but a Docker engine answers, [`database_url`] (and
//! so [`pg_pool`]) and [`redis_url`] start PostgreSQL 16 and Redis 7 containers, once per test
//! process, and use them; the containers are removed when the process exits. With no URL, no
//! local server and no Docker, the first test that needs the server fails with one message
//! saying what to set. Without the feature nothing is probed: the URL variable, else the local
//! default.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool};

#[cfg(feature = "testcontainers")]
mod containers;
mod holding_proxy;
#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "metrics")]
pub mod recorded;
mod servers;

pub use holding_proxy::{HoldingProxy, until_idle};
#[cfg(feature = "mysql")]
pub use mysql::{mysql_pool, mysql_pool_with, mysql_pool_with_options, mysql_url};

/// `DATABASE_URL`, or the local PostgreSQL; with the `testcontainers` feature, a PostgreSQL
/// container when neither is there and Docker is (chosen once per process).
pub fn database_url() -> String {
    servers::resolve(&servers::POSTGRES)
}

/// `PGBOUNCER_URL`, or the PgBouncer `scripts/services.sh` starts on the local port 6432
/// (`pool_mode = transaction`, in front of the PostgreSQL of [`database_url`]).
pub fn pgbouncer_url() -> String {
    std::env::var("PGBOUNCER_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:6432/test".to_owned())
}

/// A pool through PgBouncer in transaction pooling ([`pgbouncer_url`]), and a schema of its own
/// created for this call (on a direct connection to [`database_url`], the database PgBouncer
/// passes through to).
///
/// PgBouncer refuses sqlx's `options` startup parameter, so the pool's connections have no
/// `search_path` of their own: qualify table names with the returned schema.
pub async fn pgbouncer_pool(max_connections: u32) -> (PgPool, String) {
    let schema = unique_name("it");
    let mut admin = admin_connection().await;
    drop_stale_schemas(&mut admin).await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE SCHEMA \"{schema}\"")))
        .execute(&mut admin)
        .await
        .unwrap_or_else(|e| panic!("cannot create test schema {schema}: {e}"));
    let _ = admin.close().await;
    let url = pgbouncer_url();
    let options = url
        .parse::<PgConnectOptions>()
        .unwrap_or_else(|e| panic!("PGBOUNCER_URL={url} is not a PostgreSQL URL: {e}"));
    let pool = tokio::time::timeout(
        Duration::from_secs(10),
        PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(60))
            .connect_with(options),
    )
    .await
    .unwrap_or_else(|_| panic!("PgBouncer at {url} did not answer within 10 s"))
    .unwrap_or_else(|e| {
        panic!(
            "cannot connect to PgBouncer at {url}: {e}. Start it (scripts/test.sh does, or \
             `scripts/services.sh pgbouncer start`), or set PGBOUNCER_URL."
        )
    });
    (pool, schema)
}

/// `REDIS_URL`, or the local Redis; with the `testcontainers` feature, a Redis container when
/// neither is there and Docker is (chosen once per process).
pub fn redis_url() -> String {
    servers::resolve(&servers::REDIS)
}

/// `NATS_URL`, or the local NATS server.
pub fn nats_url() -> String {
    std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned())
}

/// `AMQP_URL`, or the local RabbitMQ.
pub fn amqp_url() -> String {
    std::env::var("AMQP_URL").unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned())
}

/// A name no other test in any process uses: `prefix_<unix seconds>_<pid>_<counter>`.
pub fn unique_name(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    format!(
        "{prefix}_{secs}_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

fn options() -> PgConnectOptions {
    let url = database_url();
    url.parse::<PgConnectOptions>()
        .unwrap_or_else(|e| panic!("DATABASE_URL={url} is not a PostgreSQL URL: {e}"))
}

async fn admin_connection() -> PgConnection {
    let url = database_url();
    match tokio::time::timeout(
        Duration::from_secs(10),
        PgConnection::connect_with(&options()),
    )
    .await
    {
        Ok(Ok(conn)) => conn,
        Ok(Err(e)) => panic!(
            "cannot connect to PostgreSQL at {url}: {e}. Start it (scripts/test.sh does), set \
             DATABASE_URL, or run with a Docker engine and `--features idempotency-testing/testcontainers`."
        ),
        Err(_) => panic!(
            "PostgreSQL at {url} did not answer within 10 s. Start it, set DATABASE_URL, or run \
             with a Docker engine and `--features idempotency-testing/testcontainers`."
        ),
    }
}

/// A pool whose connections use a schema of their own (`search_path`), created for this call.
///
/// Tests that each take one run in parallel and again and again without cleanup by hand. Schemas
/// left by earlier runs are dropped once they are an hour old.
pub async fn pg_pool() -> PgPool {
    pg_pool_with(10).await
}

/// [`pg_pool`] with an explicit pool size.
pub async fn pg_pool_with(max_connections: u32) -> PgPool {
    pg_pool_with_options(max_connections, |options| options).await
}

/// [`pg_pool_with`], with pool options of the caller's on top (a bench's own pool settings).
pub async fn pg_pool_with_options(
    max_connections: u32,
    configure: impl FnOnce(PgPoolOptions) -> PgPoolOptions,
) -> PgPool {
    let schema = unique_name("it");
    let mut admin = admin_connection().await;
    drop_stale_schemas(&mut admin).await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE SCHEMA \"{schema}\"")))
        .execute(&mut admin)
        .await
        .unwrap_or_else(|e| panic!("cannot create test schema {schema}: {e}"));
    let _ = admin.close().await;
    let pool = PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(60));
    configure(pool)
        .connect_with(options().options([("search_path", schema.as_str())]))
        .await
        .unwrap_or_else(|e| panic!("cannot open a pool on {}: {e}", database_url()))
}

async fn drop_stale_schemas(admin: &mut PgConnection) {
    static DONE: AtomicBool = AtomicBool::new(false);
    if DONE.swap(true, Ordering::SeqCst) {
        return;
    }
    let cutoff = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs().saturating_sub(3600))
        .unwrap_or_default();
    let stale: Vec<String> = sqlx::query_scalar(
        "SELECT nspname::text FROM pg_namespace \
         WHERE nspname ~ '^it_[0-9]+_' AND split_part(nspname, '_', 2)::bigint < $1",
    )
    .bind(cutoff as i64)
    .fetch_all(&mut *admin)
    .await
    .unwrap_or_default();
    for schema in stale {
        let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"
        )))
        .execute(&mut *admin)
        .await;
    }
}
