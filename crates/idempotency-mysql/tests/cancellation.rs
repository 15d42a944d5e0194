//! A request dropped while its `BEGIN` is on the wire (a client that hangs up, a timeout) must
//! not hand the next user of the pool a connection inside a transaction nobody owns.
//!
//! The answers from the server go through a proxy that can hold them, so the drop lands
//! deterministically after the server ran `BEGIN` and before the client read its answer.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

use idempotency_core::store::IdempotencyStore;
use idempotency_mysql::MysqlStore;
use idempotency_testing::{HoldingProxy, until_idle};
use sqlx::MySqlPool;
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};

/// A direct pool on a fresh database, and a one-connection pool on the same database through a
/// holding proxy (its connection already open, no ping before it is handed out).
async fn pools() -> (MySqlPool, MySqlPool, HoldingProxy) {
    let direct = idempotency_testing::mysql_pool().await;
    let database: String = sqlx::query_scalar("SELECT DATABASE()")
        .fetch_one(&direct)
        .await
        .unwrap();
    sqlx::raw_sql("CREATE TABLE written (n int NOT NULL) ENGINE = InnoDB")
        .execute(&direct)
        .await
        .unwrap();
    let options: MySqlConnectOptions = idempotency_testing::mysql_url().parse().unwrap();
    let upstream = format!("{}:{}", options.get_host(), options.get_port());
    let proxy = HoldingProxy::start(upstream).await;
    let proxied = MySqlPoolOptions::new()
        .max_connections(1)
        .min_connections(1)
        .test_before_acquire(false)
        .connect_with(
            options
                .host("127.0.0.1")
                .port(proxy.port())
                .database(&database),
        )
        .await
        .unwrap();
    sqlx::query("SELECT 1").execute(&proxied).await.unwrap();
    until_idle(&proxied).await;
    (direct, proxied, proxy)
}

/// After the drop: an autocommit write through the proxied pool is visible to everyone at once,
/// which it is not when it ran inside a transaction left open on the pooled connection.
async fn assert_pool_is_clean(direct: &MySqlPool, proxied: &MySqlPool) {
    sqlx::query("INSERT INTO written (n) VALUES (1)")
        .execute(proxied)
        .await
        .unwrap();
    let seen: i64 = sqlx::query_scalar("SELECT count(*) FROM written")
        .fetch_one(direct)
        .await
        .unwrap();
    assert_eq!(
        seen, 1,
        "an autocommit write ran inside a transaction left open on the pooled connection"
    );
}

#[tokio::test]
async fn a_begin_dropped_on_the_wire_leaves_no_transaction_open_in_the_pool() {
    let (direct, proxied, proxy) = pools().await;
    let store = MysqlStore::new(proxied.clone());
    proxy.drop_while_held(store.begin()).await;
    assert_pool_is_clean(&direct, &proxied).await;
}

#[tokio::test]
async fn the_public_begin_dropped_on_the_wire_leaves_no_transaction_open_in_the_pool() {
    let (direct, proxied, proxy) = pools().await;
    proxy
        .drop_while_held(idempotency_mysql::begin(&proxied))
        .await;
    assert_pool_is_clean(&direct, &proxied).await;
}

#[tokio::test]
async fn the_public_begin_hands_out_a_transaction_that_commits_or_rolls_back() {
    let (direct, proxied, _proxy) = pools().await;
    let count = async || -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM written")
            .fetch_one(&direct)
            .await
            .unwrap()
    };
    let mut tx = idempotency_mysql::begin(&proxied).await.unwrap();
    sqlx::query("INSERT INTO written (n) VALUES (1)")
        .execute(&mut *tx)
        .await
        .unwrap();
    assert_eq!(count().await, 0, "visible before the commit");
    tx.commit().await.unwrap();
    assert_eq!(count().await, 1, "the commit");
    let mut tx = idempotency_mysql::begin(&proxied).await.unwrap();
    sqlx::query("INSERT INTO written (n) VALUES (2)")
        .execute(&mut *tx)
        .await
        .unwrap();
    drop(tx);
    until_idle(&proxied).await;
    assert_eq!(count().await, 1, "a dropped transaction rolls back");
}
