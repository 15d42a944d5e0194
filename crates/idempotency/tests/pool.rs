//! `TestWhenIdle` on a real PostgreSQL (`DATABASE_URL`): a connection killed while it sat idle
//! in the pool is replaced on checkout once it was idle for the threshold, and handed out
//! untested before that.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use idempotency::pool::TestWhenIdle;
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgPool, Row};

fn url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// A pool of one connection, tested on checkout after `after` of idleness.
async fn pool(after: Duration) -> PgPool {
    PgPoolOptions::new()
        .max_connections(1)
        .test_when_idle(after)
        .connect(&url())
        .await
        .expect("DATABASE_URL answers")
}

async fn backend_pid(pool: &PgPool) -> Result<i32, sqlx::Error> {
    sqlx::query("SELECT pg_backend_pid()")
        .fetch_one(pool)
        .await
        .map(|row| row.get(0))
}

/// Uses the pool's one connection, waits until it is back in the pool, then terminates its
/// backend from another connection and waits until the backend is gone.
async fn kill_the_idle_connection(pool: &PgPool) -> i32 {
    let pid = backend_pid(pool).await.unwrap();
    // sqlx gives the connection back in a task of its own (after its release ping).
    for _ in 0..200 {
        if pool.num_idle() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(pool.num_idle(), 1, "the connection is back in the pool");
    let admin = PgPool::connect(&url()).await.unwrap();
    let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(&admin)
        .await
        .unwrap();
    assert!(killed);
    for _ in 0..200 {
        let alive: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)")
                .bind(pid)
                .fetch_one(&admin)
                .await
                .unwrap();
        if !alive {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    admin.close().await;
    pid
}

#[tokio::test]
async fn a_connection_idle_for_the_threshold_is_tested_and_replaced_when_dead() {
    let pool = pool(Duration::from_millis(50)).await;
    let dead = kill_the_idle_connection(&pool).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let pid = backend_pid(&pool)
        .await
        .expect("the dead connection failed its ping and was replaced");
    assert_ne!(pid, dead);
}

#[tokio::test]
async fn a_zero_threshold_tests_every_checkout() {
    let pool = pool(Duration::ZERO).await;
    let dead = kill_the_idle_connection(&pool).await;
    let pid = backend_pid(&pool).await.expect("tested and replaced");
    assert_ne!(pid, dead);
}

#[tokio::test]
async fn a_connection_idle_for_less_than_the_threshold_is_handed_out_untested() {
    let pool = pool(Duration::from_secs(3600)).await;
    kill_the_idle_connection(&pool).await;
    // No ping: the first statement finds the connection dead (the documented trade-off)...
    let error = backend_pid(&pool)
        .await
        .expect_err("handed out without a ping");
    // The server's goodbye (`57P01`, read as the answer) or the closed socket.
    let lost = match &error {
        sqlx::Error::Database(e) => e.code().as_deref() == Some("57P01"),
        sqlx::Error::Io(_) | sqlx::Error::Protocol(_) => true,
        _ => false,
    };
    assert!(lost, "a lost connection: {error:?}");
    // ...and sqlx drops it when it is given back, so the next checkout opens a new one.
    let mut replaced = None;
    for _ in 0..200 {
        if let Ok(pid) = backend_pid(&pool).await {
            replaced = Some(pid);
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        replaced.is_some(),
        "the pool recovered with a new connection"
    );
}
