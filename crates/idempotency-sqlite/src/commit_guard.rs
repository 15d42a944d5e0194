//! [`CommitGuard`]: a store write in the caller's transaction never commits on its own.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use sqlx::SqliteConnection;
use sqlx::sqlite::SqliteTransactionManager;
use sqlx_core::transaction::TransactionManager;

/// While it lives, SQLite's commit hook of the connection turns every commit into a rollback.
///
/// A statement that rolls the whole transaction back (`INSERT OR ROLLBACK` on a taken key, a
/// trigger's `RAISE(ROLLBACK)`, a full disk) leaves the connection in autocommit, and sqlx still
/// counts the transaction open. A store write after it (the claim, the terminal record of
/// `execute_optimistic`) would then commit on its own, without the writes it speaks for, and
/// sqlx's later `COMMIT` of the ended transaction succeeds without doing anything. Inside a
/// transaction a statement commits nothing, so the hook is not called; in autocommit the
/// statement's own commit calls it, and it is refused.
///
/// The hook stays on the connection, disarmed, when the guard is dropped (so a future dropped
/// mid-statement leaves nothing armed); it replaces any commit hook of the caller's own on
/// that connection.
pub(crate) struct CommitGuard {
    armed: Arc<AtomicBool>,
    refused: Arc<AtomicBool>,
}

impl CommitGuard {
    /// Arms the guard on `conn`: one hand-over of the connection from sqlx's worker thread.
    pub(crate) async fn arm(conn: &mut SqliteConnection) -> Result<Self, sqlx::Error> {
        let armed = Arc::new(AtomicBool::new(true));
        let refused = Arc::new(AtomicBool::new(false));
        let (hook_armed, hook_refused) = (Arc::clone(&armed), Arc::clone(&refused));
        conn.lock_handle().await?.set_commit_hook(move || {
            if hook_armed.load(Ordering::Acquire) {
                hook_refused.store(true, Ordering::Release);
                false
            } else {
                true
            }
        });
        Ok(Self { armed, refused })
    }

    /// Disarms the guard; `true` when it refused a commit: the transaction had ended before
    /// the statements it guarded, which wrote nothing. A transaction is then begun again on
    /// `conn` when sqlx counts one (not a nested one, not none), so that what the caller runs next stays uncommitted until the rollback (or
    /// commit) sqlx sends for the transaction it still counts open, instead of committing
    /// statement by statement, and that rollback finds a transaction (a failed one would leave
    /// sqlx counting it open in the pool). The caller answers a retryable conflict, with
    /// [`TransactionEnded`] as its source.
    pub(crate) async fn ended(self, conn: &mut SqliteConnection) -> bool {
        self.armed.store(false, Ordering::Release);
        if !self.refused.load(Ordering::Acquire) {
            return false;
        }
        // Only where sqlx counts one transaction: within a nested one (a savepoint) its
        // rollbacks name savepoints that are gone, and a transaction begun here would stay
        // open in the pool, swallowing the next user's commit.
        if SqliteTransactionManager::get_transaction_depth(conn) == 1
            && let Err(error) = sqlx::raw_sql("BEGIN").execute(&mut *conn).await
        {
            tracing::warn!(%error, "could not begin a transaction again after one had ended");
        }
        true
    }
}

impl Drop for CommitGuard {
    fn drop(&mut self) {
        self.armed.store(false, Ordering::Release);
    }
}

/// The source of the conflict (`StoreError::Conflict`, the outbox's `Error::Conflict`) a store
/// write gets when the caller's transaction had ended before it.
#[derive(Debug, thiserror::Error)]
#[error(
    "the transaction had ended before this write: a statement in it rolled it back (INSERT OR \
     ROLLBACK, RAISE(ROLLBACK), a full disk); nothing was written; run the whole transaction \
     again"
)]
pub(crate) struct TransactionEnded;
