//! [`ended`]: whether the caller's transaction ended under sqlx, before a store write in it.

use sqlx::SqliteConnection;
use sqlx::sqlite::SqliteTransactionManager;
use sqlx_core::transaction::{TransactionManager, begin_ansi_transaction_sql};

/// What SQLite answers a `BEGIN` inside a transaction.
const WITHIN_A_TRANSACTION: &str = "within a transaction";

/// Whether the transaction sqlx counts open on `conn` had ended before the store's write (or
/// sqlx counts none).
///
/// A statement that rolls the whole transaction back (`INSERT OR ROLLBACK` on a taken key, a
/// trigger's `RAISE(ROLLBACK)`, a full disk) leaves the connection in autocommit, and sqlx
/// still counts the transaction open. A store write after it (the claim, the terminal record
/// of `execute_optimistic`, an outbox event, an inbox entry) would then commit on its own,
/// without the writes it speaks for (sqlx's later `COMMIT` of the ended transaction fails,
/// SQLite having none open, but too late: the write is on disk). So each such write first
/// sends `BEGIN`: inside the
/// transaction SQLite refuses it and nothing changes; in autocommit it begins one, and the
/// write is not sent. The answer holds until the write runs: the connection runs its
/// statements in order and nothing else runs on it in between, so a future dropped after the
/// check leaves a write that still runs inside the transaction.
///
/// When the transaction had ended, the one begun here is kept, with the savepoints sqlx
/// counts open within it (a nested sqlx transaction): what the caller runs next stays
/// uncommitted until the rollbacks (or commits) sqlx sends for the transactions it still
/// counts open, and each of them finds what it names, so the connection goes back to the pool
/// in the state sqlx counts (before, a failed rollback left sqlx counting a transaction on a
/// pooled connection for good). Where sqlx counts no transaction, nothing is sent: the write
/// would commit on its own.
pub(crate) async fn ended(conn: &mut SqliteConnection) -> Result<bool, sqlx::Error> {
    let depth = SqliteTransactionManager::get_transaction_depth(conn);
    if depth == 0 {
        return Ok(true);
    }
    match sqlx::raw_sql("BEGIN").execute(&mut *conn).await {
        Err(sqlx::Error::Database(error)) if error.message().contains(WITHIN_A_TRANSACTION) => {
            Ok(false)
        }
        Err(error) => Err(error),
        Ok(_) => {
            if depth > 1 {
                // The savepoints of sqlx's nested transactions, by sqlx's own names.
                let savepoints: Vec<String> = (1..depth)
                    .map(|level| begin_ansi_transaction_sql(level).as_str().to_owned())
                    .collect();
                sqlx::raw_sql(sqlx::AssertSqlSafe(savepoints.join("; ")))
                    .execute(&mut *conn)
                    .await?;
            }
            Ok(true)
        }
    }
}

/// Rolls back the levels sqlx counts above the store's own transaction (depth 1) on a
/// connection the store began: nested transactions of the action whose rollback failed (a
/// statement in one had ended the whole transaction, so the savepoint its rollback named was
/// gone) stay counted, and sqlx's rollback of the store's transaction would only roll back to
/// the innermost of them, leaving the connection in a transaction that the next user of the
/// pool cannot end (its commit releases a savepoint).
///
/// Each level's savepoint is made again before sqlx's rollback to it, so that the rollback
/// finds it whether or not it still existed (a second one of the same name is rolled back with
/// the first by the levels below); everything is rolled back anyway.
pub(crate) async fn unwind_nested(conn: &mut SqliteConnection) -> Result<(), sqlx::Error> {
    loop {
        let depth = settled_depth(conn).await?;
        if depth <= 1 {
            return Ok(());
        }
        sqlx::raw_sql(begin_ansi_transaction_sql(depth - 1))
            .execute(&mut *conn)
            .await?;
        SqliteTransactionManager::rollback(conn).await?;
    }
}

/// The transaction depth sqlx counts on `conn` once the commands queued on it have run.
///
/// A nested sqlx transaction dropped without a rollback only queues one (`start_rollback`);
/// the connection's worker lowers the depth when it runs it. Above depth 1 (the store's own
/// transaction), a ping waits for the queue (the connection runs its commands in order), so
/// that a nested transaction just dropped is not taken for one left open; at depth 1 or 0 the
/// answer is final without a round trip, as queued commands never raise it.
pub(crate) async fn settled_depth(conn: &mut SqliteConnection) -> Result<usize, sqlx::Error> {
    if SqliteTransactionManager::get_transaction_depth(conn) > 1 {
        sqlx::Connection::ping(&mut *conn).await?;
    }
    Ok(SqliteTransactionManager::get_transaction_depth(conn))
}

/// The error of a commit the store refused: sqlx still counted a nested transaction of the
/// action open (its rollback or commit failed, or it was leaked), so its `COMMIT` would only
/// have released that savepoint and left the store's transaction open, committed by nobody.
#[derive(Debug, thiserror::Error)]
#[error(
    "a nested transaction of the action was still open when the store committed (its rollback \
     or commit failed, or it was leaked): everything was rolled back, nothing committed"
)]
pub(crate) struct NestedTransactionOpen;

/// The source of the error (`StoreError::Database`, the outbox's `Error::Database`) of a store
/// write whose transaction had ended before it, or that sqlx counted no transaction for. Not
/// retryable: the caller's statements after the one that ended the transaction committed one
/// by one, and a retry of the whole transaction would run them again.
#[derive(Debug, thiserror::Error)]
#[error(
    "no transaction was open for this write: a statement rolled it back (INSERT OR ROLLBACK, \
     RAISE(ROLLBACK), a full disk) and any statements after it committed one by one, or none \
     was begun; this write was not made"
)]
pub(crate) struct TransactionEnded;
