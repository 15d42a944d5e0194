//! [`MysqlTransaction`]: sqlx's transaction on a pooled connection, except that a transaction
//! dropped before it ended closes its connection instead of handing it back to the pool.

use std::fmt;
use std::ops::{Deref, DerefMut};

use sqlx::mysql::MySqlTransactionManager;
use sqlx::pool::PoolConnection;
use sqlx::{MySql, MySqlConnection, SqlStr};
use sqlx_core::transaction::TransactionManager as _;

/// A transaction on a connection of a MySQL pool, as [`begin`](crate::begin) hands it out and
/// as [`MysqlStore`](crate::MysqlStore)'s transactions are: use it as sqlx's
/// `MySqlTransaction` (`&mut *tx` is the connection; a nested `begin` on it is a savepoint),
/// [`commit`](Self::commit) it or [`rollback`](Self::rollback) it.
///
/// Dropped before it ended (its future was dropped: a client went away, a timeout fired), it
/// does not queue a `ROLLBACK` and return its connection to the pool as sqlx's transaction
/// does: it closes the connection, and the server rolls the transaction back when the session
/// ends. sqlx 0.9's MySQL connection is not safe to drop in the middle of a statement: a
/// statement dropped while its prepare (`COM_STMT_PREPARE`) was answered leaves the connection
/// reading the prepare's answer as the statement's result, then the queued `ROLLBACK`'s answer
/// as a row of a result set that never ends, and the pool's release ping waits for it for
/// ever: one connection of the pool held for good by nobody (RELIABILITY.md, "A connection
/// that never came back"). A transaction dropped before it ended may have been dropped in such
/// a statement, so its connection is not reused. A failed `commit` or `rollback` closes it
/// too.
///
/// ```no_run
/// # async fn demo() -> Result<(), sqlx::Error> {
/// let pool = sqlx::MySqlPool::connect("mysql://root@127.0.0.1/test").await?;
/// let mut tx: idempotency_mysql::MysqlTransaction = idempotency_mysql::begin(&pool).await?;
/// sqlx::query("INSERT INTO charges (amount_cents) VALUES (?)")
///     .bind(4900)
///     .execute(&mut *tx)
///     .await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
pub struct MysqlTransaction {
    conn: PoolConnection<MySql>,
    /// Begun (or beginning) and not yet ended by a `commit` or `rollback` that answered.
    open: bool,
}

impl MysqlTransaction {
    /// Runs `statement` (a `START TRANSACTION`, with what must come before it) on `conn`, as
    /// sqlx's `begin_with`: the connection counts the transaction (a nested begin is a
    /// savepoint). A begin that fails, or whose future is dropped, closes the connection.
    pub(crate) async fn begin(
        conn: PoolConnection<MySql>,
        statement: SqlStr,
    ) -> Result<Self, sqlx::Error> {
        let mut tx = Self { conn, open: true };
        MySqlTransactionManager::begin(&mut tx.conn, Some(statement)).await?;
        Ok(tx)
    }

    /// Commits the transaction; its connection goes back to the pool. On an error the
    /// connection is closed (the server rolls back what did not commit).
    pub async fn commit(mut self) -> Result<(), sqlx::Error> {
        MySqlTransactionManager::commit(&mut self.conn).await?;
        self.open = false;
        Ok(())
    }

    /// Rolls the transaction back; its connection goes back to the pool. On an error the
    /// connection is closed (the server rolls back when the session ends).
    pub async fn rollback(mut self) -> Result<(), sqlx::Error> {
        MySqlTransactionManager::rollback(&mut self.conn).await?;
        self.open = false;
        Ok(())
    }
}

impl Drop for MysqlTransaction {
    fn drop(&mut self) {
        if self.open {
            tracing::debug!(
                "a MySQL transaction was dropped before it ended: its connection is closed, not \
                 returned to the pool"
            );
            self.conn.close_on_drop();
        }
    }
}

impl Deref for MysqlTransaction {
    type Target = MySqlConnection;

    fn deref(&self) -> &MySqlConnection {
        &self.conn
    }
}

impl DerefMut for MysqlTransaction {
    fn deref_mut(&mut self) -> &mut MySqlConnection {
        &mut self.conn
    }
}

impl fmt::Debug for MysqlTransaction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MysqlTransaction")
            .field("open", &self.open)
            .finish_non_exhaustive()
    }
}
