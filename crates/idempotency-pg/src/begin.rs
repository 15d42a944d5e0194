//! `BEGIN` that survives the caller being dropped.

use sqlx::{PgPool, Postgres, Transaction};
use tracing::Instrument as _;

/// Begins a transaction on a connection of `pool`: `pool.begin()`, safe to cancel.
///
/// sqlx 0.9 counts a transaction only once its `BEGIN` is answered. If the future of
/// `pool.begin()` is dropped while that answer is on the wire (a client hung up, a timeout
/// fired), the connection goes back to the pool inside a transaction that nobody owns: the next
/// user's autocommit statements then run in it, invisible to others and lost when the connection
/// closes. Here the begin runs in a task of its own: dropped by the caller, the task still reads
/// the answer, and the transaction that nobody takes is rolled back before the connection
/// returns to the pool.
///
/// Use it wherever a request begins a transaction of its own: for the outbox's
/// `PgOutbox::enqueue` (feature `outbox`), the inbox, or [`PgTx::new`](crate::PgTx).
/// [`PgStore`](crate::PgStore) and the idempotency service already begin this way. The returned
/// transaction is sqlx's own: commit it, or drop it to roll back.
///
/// It needs a Tokio runtime (sqlx's `runtime-tokio`), as the rest of this crate does. The error
/// is sqlx's, as from `pool.begin()`; if the runtime is shutting down it is
/// [`sqlx::Error::Io`].
///
/// ```no_run
/// # async fn demo() -> Result<(), sqlx::Error> {
/// let pool = sqlx::PgPool::connect("postgres://postgres@127.0.0.1/test").await?;
/// let mut tx = idempotency_pg::begin(&pool).await?;
/// sqlx::query("INSERT INTO charges (amount_cents) VALUES (4900)")
///     .execute(&mut *tx)
///     .await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
pub async fn begin(pool: &PgPool) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
    spawned_begin(pool, None).await
}

/// [`begin`] with `statement` in place of `BEGIN` (`pool.begin_with`), as safe to cancel: a
/// `BEGIN` with options, or `BEGIN` followed by `SET LOCAL`s in the same round trip.
pub(crate) async fn begin_with(
    pool: &PgPool,
    statement: &'static str,
) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
    spawned_begin(pool, Some(statement)).await
}

async fn spawned_begin(
    pool: &PgPool,
    statement: Option<&'static str>,
) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
    // In the caller's span, so that what the pool logs stays attached to the request.
    let begun = tokio::spawn(begin_task(pool.clone(), statement).in_current_span());
    match begun.await {
        Ok(begun) => begun,
        Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
        // The runtime is shutting down: no transaction was handed out.
        Err(join) => Err(sqlx::Error::Io(std::io::Error::other(join))),
    }
}

/// What the task of [`spawned_begin`] runs: sqlx's begin, boxed. `tokio::spawn` moves the
/// future it is given into the task's allocation, a copy of the whole future at each step of
/// the way; sqlx's begin future is 2.7 kB (most of it the pool's acquire), copied in full even
/// before it ran. Boxed inside the task, it is built once, in place of its first poll, and the
/// task holds a pointer to it.
async fn begin_task(
    pool: PgPool,
    statement: Option<&'static str>,
) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
    match statement {
        Some(statement) => Box::pin(pool.begin_with(statement)).await,
        None => Box::pin(pool.begin()).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The future `spawned_begin` spawns (in the caller's span, as it spawns it) stays a few
    /// words (80 bytes): sqlx's begin future, 2,728 bytes when it was spawned as is, is boxed
    /// inside it.
    #[tokio::test]
    async fn the_spawned_begin_is_small() {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .connect_lazy("postgres://postgres@127.0.0.1/test")
            .expect("a lazy pool");
        for statement in [None, Some("BEGIN")] {
            let task = begin_task(pool.clone(), statement).in_current_span();
            let size = size_of_val(&task);
            assert!(size <= 256, "the spawned begin is {size} bytes");
        }
    }
}
