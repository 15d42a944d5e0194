//! [`ended`]: whether the caller's transaction ended under sqlx, before a store write in it.

use sqlx::SqliteConnection;
use sqlx::sqlite::SqliteTransactionManager;
use sqlx_core::transaction::TransactionManager;

/// What SQLite answers a `BEGIN` inside a transaction.
const WITHIN_A_TRANSACTION: &str = "within a transaction";

/// Whether the transaction sqlx counts open on `conn` had ended before the store's write.
///
/// A statement that rolls the whole transaction back (`INSERT OR ROLLBACK` on a taken key, a
/// trigger's `RAISE(ROLLBACK)`, a full disk) leaves the connection in autocommit, and sqlx
/// still counts the transaction open. A store write after it (the claim, the terminal record
/// of `execute_optimistic`, an outbox event, an inbox entry) would then commit on its own,
/// without the writes it speaks for, and sqlx's later `COMMIT` of the ended transaction
/// succeeds without doing anything. So each such write first sends `BEGIN`: inside the
/// transaction SQLite refuses it and nothing changes; in autocommit it begins one, and the
/// write is not sent. The answer holds until the write runs: the connection runs its
/// statements in order and nothing else runs on it in between, so a future dropped after the
/// check leaves a write that still runs inside the transaction.
///
/// When the transaction had ended, the one begun here is kept where sqlx counts one
/// transaction (not a nested one, not none): what the caller runs next stays uncommitted
/// until the rollback (or commit) sqlx sends for the transaction it still counts open, and
/// that rollback finds a transaction (a failed one would leave sqlx counting it open in the
/// pool). Elsewhere it is rolled back at once: within a nested transaction sqlx's rollbacks
/// name savepoints that are gone, and a transaction begun here would stay open in the pool,
/// swallowing the next user's commit.
pub(crate) async fn ended(conn: &mut SqliteConnection) -> Result<bool, sqlx::Error> {
    match sqlx::raw_sql("BEGIN").execute(&mut *conn).await {
        Err(sqlx::Error::Database(error)) if error.message().contains(WITHIN_A_TRANSACTION) => {
            Ok(false)
        }
        Err(error) => Err(error),
        Ok(_) => {
            if SqliteTransactionManager::get_transaction_depth(conn) != 1 {
                sqlx::raw_sql("ROLLBACK").execute(&mut *conn).await?;
            }
            Ok(true)
        }
    }
}

/// The source of the error (`StoreError::Database`, the outbox's `Error::Database`) of a store
/// write whose transaction had ended before it. Not retryable: the caller's statements after
/// the one that ended it committed one by one, and a retry of the whole transaction would
/// run them again.
#[derive(Debug, thiserror::Error)]
#[error(
    "the transaction had ended before this write: a statement in it rolled it back (INSERT OR \
     ROLLBACK, RAISE(ROLLBACK), a full disk), and the statements after it committed one by \
     one; this write was not made"
)]
pub(crate) struct TransactionEnded;
