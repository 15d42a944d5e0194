//! The bench's connection pools: each on a schema (or database) of its own, configured as the
//! starter recommends ([`idempotency::pool::TestWhenIdle`]), so every scenario that shares a pool
//! pays the same per-transaction round trips as a service configured that way.

use ::idempotency::pool::{TEST_AFTER_IDLE, TestWhenIdle};
use idempotency_mysql::sqlx::MySqlPool;
use sqlx::PgPool;

/// A PostgreSQL pool of `max_connections` on a schema of its own.
pub(crate) async fn postgres(max_connections: u32) -> PgPool {
    idempotency_testing::pg_pool_with_options(max_connections, |options| {
        options.test_when_idle(TEST_AFTER_IDLE)
    })
    .await
}

/// A MySQL / MariaDB pool of `max_connections` on a database of its own.
pub(crate) async fn mysql(max_connections: u32) -> MySqlPool {
    idempotency_testing::mysql_pool_with_options(max_connections, |options| {
        options.test_when_idle(TEST_AFTER_IDLE)
    })
    .await
}
