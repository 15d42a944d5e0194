//! Statements that run on their own, directly or behind a pooler in transaction mode.
//!
//! Behind PgBouncer's `pool_mode = transaction` a client's session lasts one transaction:
//! a statement outside one goes to whichever server connection is free. sqlx runs a statement
//! with parameters in two exchanges (parse and describe, then bind and execute, each ending in
//! a `Sync`), and names it (`sqlx_s_N`) to reuse it on the connection. Both break there: the
//! name is taken or missing on the server connection of the next transaction, and an unnamed
//! statement parsed outside a transaction may be bound on another server connection. So with
//! [`Pooler::Transaction`] every statement is unnamed (`persistent(false)`) and every statement
//! the stores run on their own runs inside a transaction ([`Own`]), which keeps one server
//! connection for its two exchanges.

use std::ops::{Deref, DerefMut};

pub use idempotency_core::config::Pooler;
use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, PgPool, Postgres, Transaction};

/// The `BEGIN` of [`Own::read_committed`].
pub(crate) const READ_COMMITTED: &str = "BEGIN ISOLATION LEVEL READ COMMITTED";

/// Whether statements may be named and cached on the connection (sqlx's `persistent`).
pub(crate) fn persistent(pooler: Pooler) -> bool {
    !matches!(pooler, Pooler::Transaction)
}

/// A connection for a statement that runs on its own: a pooled connection, or behind a
/// transaction pooler a transaction of its own (two round trips more: `BEGIN`, `COMMIT`).
#[derive(Debug)]
pub(crate) enum Own {
    Pooled(PoolConnection<Postgres>),
    Tx(Transaction<'static, Postgres>),
}

impl Own {
    /// A connection of `pool` as `pooler` needs it.
    pub(crate) async fn open(pool: &PgPool, pooler: Pooler) -> Result<Self, sqlx::Error> {
        Ok(match pooler {
            Pooler::Transaction => Self::Tx(crate::begin(pool).await?),
            _ => Self::Pooled(pool.acquire().await?),
        })
    }

    /// A READ COMMITTED transaction of `pool` (`BEGIN ISOLATION LEVEL READ COMMITTED`), whatever
    /// the pooler and `default_transaction_isolation` say: for a statement that locks rows
    /// with `FOR UPDATE SKIP LOCKED` (a claim, a cleanup or retention batch). Under REPEATABLE
    /// READ or SERIALIZABLE a row another session changed after the statement's snapshot fails
    /// it (a serialization error) instead of being skipped. Two round trips more than a
    /// pooled connection: `BEGIN`, `COMMIT`.
    pub(crate) async fn read_committed(pool: &PgPool) -> Result<Self, sqlx::Error> {
        crate::begin::begin_with(pool, READ_COMMITTED)
            .await
            .map(Self::Tx)
    }

    /// Commits the transaction, if there is one.
    pub(crate) async fn finish(self) -> Result<(), sqlx::Error> {
        match self {
            Self::Pooled(_) => Ok(()),
            Self::Tx(tx) => tx.commit().await,
        }
    }
}

impl Deref for Own {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        match self {
            Self::Pooled(conn) => conn,
            Self::Tx(tx) => tx,
        }
    }
}

impl DerefMut for Own {
    fn deref_mut(&mut self) -> &mut PgConnection {
        match self {
            Self::Pooled(conn) => conn,
            Self::Tx(tx) => tx,
        }
    }
}
