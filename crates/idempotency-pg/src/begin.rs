//! `BEGIN` that survives the caller being dropped.

use sqlx::{PgPool, Postgres, Transaction};
use tracing::Instrument as _;

/// `pool.begin()`, safe to cancel.
///
/// sqlx counts a transaction only once its `BEGIN` is answered. If the future is dropped while
/// the answer is on the wire (a client hung up, a timeout fired), the connection goes back to the
/// pool inside a transaction that nobody owns: the next user's autocommit statements then run in
/// it, invisible to others and lost when the connection closes. The begin runs in a task of its
/// own instead: dropped by the caller, the task still reads the answer, and the transaction that
/// nobody takes is rolled back before the connection returns to the pool.
pub(crate) async fn begin(pool: &PgPool) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
    let pool = pool.clone();
    // In the caller's span, so that what the pool logs stays attached to the request.
    let begun = tokio::spawn(async move { pool.begin().await }.in_current_span());
    match begun.await {
        Ok(begun) => begun,
        Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
        // The runtime is shutting down: no transaction was handed out.
        Err(join) => Err(sqlx::Error::Io(std::io::Error::other(join))),
    }
}
