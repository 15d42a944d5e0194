//! Connection pool options that spare a round trip per transaction.
//!
//! By default an sqlx pool tests every connection it hands out with a ping: a round trip to the
//! database before the first statement of every transaction, on the request's path. sqlx also
//! pings every connection it takes back (that one it does always, after the transaction, off
//! the request's path). A connection handed out is therefore one that answered a ping when it
//! was last given back; what the ping on checkout still catches is a connection that died while
//! it sat idle in the pool, which a connection in steady use does not do.
//!
//! [`TestWhenIdle::test_when_idle`] keeps that check for connections idle long enough to have
//! gone stale (a firewall dropping quiet connections, a server restarted in the meantime) and
//! skips it for the others. A first execution of `execute` is then 5 round trips instead of 6,
//! and `execute_optimistic` 4 instead of 5 (PERFORMANCE.md measures what that is worth).
//!
//! The trade-off: a connection killed within `after` of its last use (the database restarted
//! under load, say) is handed out untested, and its first statement fails. The transaction
//! fails with a retryable error (`StoreError::Unavailable`, HTTP 503), the retry with the same
//! key runs from scratch, and sqlx drops the dead connection when it is given back. Nothing is
//! committed twice: idempotency does not depend on the ping.

use std::time::Duration;

use sqlx::Connection;
use sqlx::pool::PoolOptions;

/// A threshold for [`TestWhenIdle::test_when_idle`] that suits most services, and the one the
/// demo (`database.test-after-idle`) and the load bench use: 10 s. A connection in steady use
/// is never idle that long; one a firewall or a restart may have dropped usually is.
pub const TEST_AFTER_IDLE: Duration = Duration::from_secs(10);

/// Tests pooled connections on checkout only after they sat idle for a while.
///
/// Implemented for sqlx's [`PoolOptions`] of every database (`PgPoolOptions`,
/// `MySqlPoolOptions`, `SqlitePoolOptions`).
///
/// ```no_run
/// use std::time::Duration;
/// use idempotency::pool::TestWhenIdle;
/// use idempotency::sqlx::postgres::PgPoolOptions;
///
/// # async fn connect() -> Result<(), sqlx::Error> {
/// let pool = PgPoolOptions::new()
///     .max_connections(20)
///     .test_when_idle(Duration::from_secs(10))
///     .connect("postgres://localhost/app")
///     .await?;
/// # Ok(()) }
/// ```
pub trait TestWhenIdle: Sized {
    /// Pings a connection before handing it out only when it sat idle in the pool for `after`
    /// or longer; a connection that fails the ping is closed and another one is handed out
    /// (what sqlx does for every checkout by default).
    ///
    /// It turns sqlx's `test_before_acquire` off and sets `before_acquire`, replacing a
    /// `before_acquire` set earlier. `Duration::ZERO` tests every checkout, like sqlx's default.
    fn test_when_idle(self, after: Duration) -> Self;
}

impl<DB: sqlx::Database> TestWhenIdle for PoolOptions<DB> {
    fn test_when_idle(self, after: Duration) -> Self {
        self.test_before_acquire(false)
            .before_acquire(move |conn, meta| {
                Box::pin(async move {
                    if meta.idle_for >= after {
                        conn.ping().await?;
                    }
                    Ok(true)
                })
            })
    }
}
