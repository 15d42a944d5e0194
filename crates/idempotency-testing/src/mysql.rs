//! Isolated databases on MySQL or MariaDB (feature `mysql`): one `CREATE DATABASE` per call.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use sqlx::{Connection, MySqlConnection, MySqlPool};

use crate::unique_name;

/// `MYSQL_URL`, or the local server (`mysql://root@127.0.0.1:3306/test`).
pub fn mysql_url() -> String {
    std::env::var("MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned())
}

fn options() -> MySqlConnectOptions {
    let url = mysql_url();
    url.parse::<MySqlConnectOptions>()
        .unwrap_or_else(|e| panic!("MYSQL_URL={url} is not a MySQL URL: {e}"))
}

async fn admin_connection() -> MySqlConnection {
    let url = mysql_url();
    match tokio::time::timeout(
        Duration::from_secs(10),
        MySqlConnection::connect_with(&options()),
    )
    .await
    {
        Ok(Ok(conn)) => conn,
        Ok(Err(e)) => panic!(
            "cannot connect to MySQL/MariaDB at {url}: {e}. Start it (scripts/services.sh \
             does) or set MYSQL_URL."
        ),
        Err(_) => {
            panic!("MySQL/MariaDB at {url} did not answer within 10 s. Start it or set MYSQL_URL.")
        }
    }
}

/// A pool on a database of its own (`it_<unix seconds>_<pid>_<n>`), created for this call.
///
/// Tests that each take one run in parallel and again without cleanup by hand. Databases left by
/// earlier runs are dropped once they are an hour old.
pub async fn mysql_pool() -> MySqlPool {
    mysql_pool_with(10).await
}

/// [`mysql_pool`] with an explicit pool size.
pub async fn mysql_pool_with(max_connections: u32) -> MySqlPool {
    mysql_pool_with_options(max_connections, |options| options).await
}

/// [`mysql_pool_with`], with pool options of the caller's on top (a bench's own pool settings).
pub async fn mysql_pool_with_options(
    max_connections: u32,
    configure: impl FnOnce(MySqlPoolOptions) -> MySqlPoolOptions,
) -> MySqlPool {
    let database = unique_name("it");
    let mut admin = admin_connection().await;
    drop_stale_databases(&mut admin).await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE DATABASE `{database}` CHARACTER SET utf8mb4"
    )))
    .execute(&mut admin)
    .await
    .unwrap_or_else(|e| panic!("cannot create test database {database}: {e}"));
    let _ = admin.close().await;
    let pool = MySqlPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(60));
    configure(pool)
        .connect_with(options().database(&database))
        .await
        .unwrap_or_else(|e| panic!("cannot open a pool on {}: {e}", mysql_url()))
}

async fn drop_stale_databases(admin: &mut MySqlConnection) {
    static DONE: AtomicBool = AtomicBool::new(false);
    if DONE.swap(true, Ordering::SeqCst) {
        return;
    }
    let cutoff = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs().saturating_sub(3600))
        .unwrap_or_default();
    let names: Vec<String> = sqlx::query_scalar(
        "SELECT CAST(SCHEMA_NAME AS CHAR) FROM information_schema.SCHEMATA \
         WHERE SCHEMA_NAME LIKE 'it\\_%'",
    )
    .fetch_all(&mut *admin)
    .await
    .unwrap_or_default();
    for name in names {
        let created = name.split('_').nth(1).and_then(|s| s.parse::<u64>().ok());
        if created.is_some_and(|secs| secs < cutoff) {
            let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "DROP DATABASE IF EXISTS `{name}`"
            )))
            .execute(&mut *admin)
            .await;
        }
    }
}
