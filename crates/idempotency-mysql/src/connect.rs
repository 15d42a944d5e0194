//! What the stores ask of the server: a begin safe to cancel, a version with `SKIP LOCKED`,
//! short READ COMMITTED transactions for the relay and cleanup, and a per-statement lock wait
//! budget.

use sqlx::{MySqlConnection, MySqlPool, SqlStr};
use tracing::Instrument as _;

use crate::transaction::MysqlTransaction;

use crate::error::{
    ER_LOCK_DEADLOCK, ER_SP_DOES_NOT_EXIST, Error, InTransaction, TransactionRolledBack,
    error_number,
};

/// What every begin of this crate runs first, in the same round trip: puts back a lock wait
/// budget that a bounded wait set on MySQL 8 and could not restore (its future was dropped
/// while the statement ran; see [`set_lock_wait`]), so that the transaction begins with the
/// session's own `innodb_lock_wait_timeout`.
macro_rules! heal_lock_wait {
    () => {
        "SET SESSION innodb_lock_wait_timeout = \
         CAST(COALESCE(@idempotency_lock_wait, @@SESSION.innodb_lock_wait_timeout) AS UNSIGNED), \
         @idempotency_lock_wait = NULL; "
    };
}

/// Begins a READ COMMITTED transaction (healed, see [`heal_lock_wait`]). The relay's claims
/// and the cleanup batches use it: under InnoDB's default REPEATABLE READ a locking range read
/// also takes gap (next-key) locks, which would block request transactions inserting next to
/// the scanned rows; READ COMMITTED locks only the rows it returns, and `SKIP LOCKED` passes
/// over rows others hold.
pub(crate) const BEGIN_READ_COMMITTED: &str = concat!(
    heal_lock_wait!(),
    "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION"
);

/// sqlx's `BEGIN`, healed (see [`heal_lock_wait`]).
const BEGIN: &str = concat!(heal_lock_wait!(), "START TRANSACTION");

pub(crate) async fn begin_read_committed(
    pool: &MySqlPool,
) -> Result<MysqlTransaction, sqlx::Error> {
    begin_with(pool, BEGIN_READ_COMMITTED).await
}

/// Begins a transaction on a connection of `pool`: `pool.begin()`, safe to cancel, as a
/// [`MysqlTransaction`].
///
/// sqlx 0.9 counts a transaction only once its `START TRANSACTION` is answered. If the future of
/// `pool.begin()` is dropped while that answer is on the wire (a client hung up, a timeout
/// fired), the connection goes back to the pool inside a transaction that nobody owns: the next
/// user's autocommit statements then run in it, invisible to others and lost when the connection
/// closes. Here the begin runs in a task of its own: dropped by the caller, the task still reads
/// the answer, and the transaction that nobody takes is rolled back before the connection
/// returns to the pool.
///
/// The transaction itself, dropped before it ended, closes its connection rather than
/// returning it to the pool (sqlx's MySQL connection is not safe to drop in the middle of a
/// statement; see [`MysqlTransaction`]).
///
/// Use it wherever a request begins a transaction of its own: for the outbox's
/// `MysqlOutbox::enqueue` (feature `outbox`), the inbox, or
/// [`MysqlTx::new`](crate::MysqlTx). [`MysqlStore`](crate::MysqlStore) and the idempotency
/// service already begin this way. Commit the returned transaction, roll it back, or drop it.
///
/// It needs a Tokio runtime (sqlx's `runtime-tokio`), as the rest of this crate does. The error
/// is sqlx's, as from `pool.begin()`; if the runtime is shutting down it is
/// [`sqlx::Error::Io`].
///
/// ```no_run
/// # async fn demo() -> Result<(), sqlx::Error> {
/// let pool = sqlx::MySqlPool::connect("mysql://root@127.0.0.1/test").await?;
/// let mut tx = idempotency_mysql::begin(&pool).await?;
/// sqlx::query("INSERT INTO charges (amount_cents) VALUES (4900)")
///     .execute(&mut *tx)
///     .await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
pub async fn begin(pool: &MySqlPool) -> Result<MysqlTransaction, sqlx::Error> {
    begin_with(pool, BEGIN).await
}

/// [`begin`], with `statement` in place of sqlx's `BEGIN` (`pool.begin_with`).
pub(crate) async fn begin_with(
    pool: &MySqlPool,
    statement: &'static str,
) -> Result<MysqlTransaction, sqlx::Error> {
    let pool = pool.clone();
    let (sender, receiver) = tokio::sync::oneshot::channel();
    // In the caller's span, so that what the pool logs stays attached to the request.
    let task = tokio::spawn(
        async move {
            let begun = match pool.acquire().await {
                Ok(conn) => MysqlTransaction::begin(conn, SqlStr::from_static(statement)).await,
                Err(error) => Err(error),
            };
            // Nobody takes it (the caller's future was dropped): the begin ran to its end, so
            // the connection is in step with the server, and a rollback hands it back clean.
            if let Err(Ok(tx)) = sender.send(begun)
                && let Err(error) = tx.rollback().await
            {
                tracing::debug!(%error, "rolling back a transaction nobody took");
            }
        }
        .in_current_span(),
    );
    match receiver.await {
        Ok(begun) => begun,
        Err(_) => match task.await {
            Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
            // The runtime is shutting down: no transaction was handed out.
            Err(join) => Err(sqlx::Error::Io(std::io::Error::other(join))),
            Ok(()) => Err(sqlx::Error::Io(std::io::Error::other(
                "the begin's task ended without an answer",
            ))),
        },
    }
}

/// Asks whether the session is still in a transaction: outside one, a savepoint is not kept and
/// releasing it fails with 1305.
const PROBE: &str = "SAVEPOINT idempotency_probe; RELEASE SAVEPOINT idempotency_probe";

/// Ends this connection's session on the server: every later statement through it fails, and
/// the pool closes it when it comes back.
const END_SESSION: &str = "KILL CONNECTION_ID()";

/// Passes through the result of a statement this crate ran in the caller's transaction. When it
/// failed, finds out whether the server ended the transaction with it (a deadlock always does;
/// for any other error the server is asked); if so, ends the session too, so that nothing the
/// caller runs next commits on its own, and reports [`TransactionRolledBack`].
pub(crate) async fn in_transaction<T>(
    conn: &mut MySqlConnection,
    result: Result<T, sqlx::Error>,
) -> Result<T, InTransaction> {
    match result {
        Ok(value) => Ok(value),
        Err(error) => Err(failed_in_transaction(conn, error).await),
    }
}

/// [`in_transaction`] for a statement that failed with `error`.
pub(crate) async fn failed_in_transaction(
    conn: &mut MySqlConnection,
    error: sqlx::Error,
) -> InTransaction {
    // No answer from the server: the connection itself failed, and fails whatever comes next.
    let ended = error.as_database_error().is_some()
        && (error_number(&error) == Some(ER_LOCK_DEADLOCK) || !in_transaction_now(conn).await);
    if !ended {
        return InTransaction::Statement(error);
    }
    end_session(conn).await;
    InTransaction::RolledBack(TransactionRolledBack::new(error))
}

/// Whether the session is in a transaction; `true` when that cannot be told.
async fn in_transaction_now(conn: &mut MySqlConnection) -> bool {
    match sqlx::raw_sql(PROBE).execute(&mut *conn).await {
        Ok(_) => true,
        Err(error) => error_number(&error) != Some(ER_SP_DOES_NOT_EXIST),
    }
}

/// Ends the session (see [`END_SESSION`]); the server's answer is an error by design.
async fn end_session(conn: &mut MySqlConnection) {
    let ended = sqlx::raw_sql(END_SESSION).execute(&mut *conn).await;
    tracing::warn!(
        answer = ?ended.err(),
        "the server rolled back the caller's transaction: its connection is closed so that \
         nothing runs outside it"
    );
}

/// The server flavour and version, from `SELECT VERSION()`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ServerVersion {
    pub(crate) mariadb: bool,
    pub(crate) major: u32,
    pub(crate) minor: u32,
    pub(crate) patch: u32,
}

impl ServerVersion {
    /// Parses `8.0.36`, `8.4.3-log`, `10.11.19-MariaDB-0+deb12u1`,
    /// `5.5.5-10.11.6-MariaDB` (the replication prefix some proxies add).
    pub(crate) fn parse(version: &str) -> Option<Self> {
        let mariadb = version.contains("MariaDB");
        let version = version.strip_prefix("5.5.5-").unwrap_or(version);
        let numbers = version
            .split(|c: char| !c.is_ascii_digit() && c != '.')
            .next()?;
        let mut parts = numbers.split('.').map(|p| p.parse::<u32>().ok());
        Some(Self {
            mariadb,
            major: parts.next()??,
            minor: parts.next().flatten().unwrap_or(0),
            patch: parts.next().flatten().unwrap_or(0),
        })
    }

    /// `FOR UPDATE SKIP LOCKED` (MySQL 8.0.1, MariaDB 10.6) and enforced `CHECK` constraints
    /// (MySQL 8.0.16; MariaDB 10.2): MySQL 8.0.16, MariaDB 10.6.
    pub(crate) fn is_supported(self) -> bool {
        let v = (self.major, self.minor, self.patch);
        if self.mariadb {
            v >= (10, 6, 0)
        } else {
            v >= (8, 0, 16)
        }
    }
}

/// Refuses servers without `SKIP LOCKED` or enforced `CHECK` constraints with
/// [`Error::UnsupportedServer`].
pub(crate) async fn check_server(pool: &MySqlPool) -> Result<(), Error> {
    let version: String = sqlx::query_scalar("SELECT VERSION()")
        .fetch_one(pool)
        .await?;
    match ServerVersion::parse(&version) {
        Some(v) if v.is_supported() => Ok(()),
        _ => Err(Error::UnsupportedServer { version }),
    }
}

/// What the records store needs to know of the server.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Server {
    /// MariaDB (statement-scoped settings, lock waits of 0 s) rather than MySQL.
    pub(crate) mariadb: bool,
    /// `innodb_rollback_on_timeout`: a lock wait timeout (1205) rolls back the whole
    /// transaction.
    pub(crate) rollback_on_timeout: bool,
}

impl Server {
    /// Asks the server behind `conn`.
    pub(crate) async fn ask(conn: &mut MySqlConnection) -> Result<Self, sqlx::Error> {
        let (version, rollback_on_timeout): (String, i64) =
            sqlx::query_as("SELECT VERSION(), @@GLOBAL.innodb_rollback_on_timeout + 0")
                .fetch_one(&mut *conn)
                .await?;
        Ok(Self {
            mariadb: ServerVersion::parse(&version).is_some_and(|v| v.mariadb),
            rollback_on_timeout: rollback_on_timeout != 0,
        })
    }
}

/// `statement` with `innodb_lock_wait_timeout = seconds` for its own run only (MariaDB's
/// `SET STATEMENT ... FOR`): the session's value is never changed, so a caller that drops the
/// statement's future leaves nothing behind.
pub(crate) fn with_statement_lock_wait(statement: &str, seconds: u64) -> SqlStr {
    crate::records::statements::sql(format!(
        "SET STATEMENT innodb_lock_wait_timeout = {seconds} FOR {statement}"
    ))
}

/// Keeps the session's own value unless one is kept already: a budget left by a wait whose
/// restore never ran (its future was dropped) is not mistaken for the session's own.
pub(crate) const SET_LOCK_WAIT: &str = "SET @idempotency_lock_wait = \
     CAST(COALESCE(@idempotency_lock_wait, @@SESSION.innodb_lock_wait_timeout) AS UNSIGNED), \
     SESSION innodb_lock_wait_timeout = ?";
pub(crate) const RESTORE_LOCK_WAIT: &str = "SET SESSION innodb_lock_wait_timeout = \
     @idempotency_lock_wait, @idempotency_lock_wait = NULL";

/// MySQL 8 (whose `SET_VAR` hint does not cover `innodb_lock_wait_timeout`): sets the session's
/// `innodb_lock_wait_timeout` to `seconds` for the statements until [`restore_lock_wait`],
/// keeping the session's own value in a session variable (one round trip; the assignments of
/// one `SET` run left to right). When the restore never runs (the caller dropped the future
/// while the statement waited), the next bounded wait on the connection restores the kept
/// value, and so does every begin of this crate (`BEGIN`), before anything else runs.
/// `0` means "do not wait" on MariaDB; MySQL's minimum is 1 (it clamps 0 to 1 with a warning).
pub(crate) async fn set_lock_wait(
    conn: &mut MySqlConnection,
    seconds: u64,
) -> Result<(), sqlx::Error> {
    sqlx::query(SET_LOCK_WAIT)
        .bind(seconds)
        .execute(&mut *conn)
        .await
        .map(drop)
}

/// Puts back the value [`set_lock_wait`] replaced.
pub(crate) async fn restore_lock_wait(conn: &mut MySqlConnection) -> Result<(), sqlx::Error> {
    sqlx::query(RESTORE_LOCK_WAIT)
        .execute(&mut *conn)
        .await
        .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn session_lock_wait(conn: &mut MySqlConnection) -> u64 {
        sqlx::query_scalar("SELECT @@SESSION.innodb_lock_wait_timeout")
            .fetch_one(conn)
            .await
            .unwrap()
    }

    /// The MySQL 8 path, run on whatever server the tests have: a budget whose restore never
    /// ran is not kept as the session's own, and the next begin puts the session's own back.
    #[tokio::test]
    async fn a_budget_left_unrestored_heals_at_the_next_wait_and_the_next_begin() {
        let pool = idempotency_testing::mysql_pool_with(1).await;
        let mut conn = pool.acquire().await.unwrap();
        let own = session_lock_wait(&mut conn).await;
        assert!(own > 3, "{own}");
        // A wait whose future was dropped: set, never restored.
        set_lock_wait(&mut conn, 2).await.unwrap();
        assert_eq!(session_lock_wait(&mut conn).await, 2);
        // The next wait keeps the session's own value, not the leaked 2.
        set_lock_wait(&mut conn, 3).await.unwrap();
        restore_lock_wait(&mut conn).await.unwrap();
        assert_eq!(session_lock_wait(&mut conn).await, own);
        // Leaked again; the next begin heals it.
        set_lock_wait(&mut conn, 2).await.unwrap();
        drop(conn);
        let mut tx = begin(&pool).await.unwrap();
        assert_eq!(session_lock_wait(&mut tx).await, own);
        tx.rollback().await.unwrap();
        let mut tx = begin_read_committed(&pool).await.unwrap();
        assert_eq!(session_lock_wait(&mut tx).await, own);
        tx.rollback().await.unwrap();
    }

    #[test]
    fn versions_with_skip_locked_and_enforced_checks_are_recognized() {
        for (version, ok) in [
            ("8.0.36", true),
            // CHECK constraints are parsed and ignored before MySQL 8.0.16.
            ("8.0.16", true),
            ("8.0.15", false),
            ("8.0.1", false),
            ("8.4.3-log", true),
            ("8.0.0-dmr", false),
            ("5.7.44", false),
            ("10.11.19-MariaDB-0+deb12u1", true),
            ("10.6.0-MariaDB", true),
            ("10.5.23-MariaDB", false),
            ("5.5.5-10.11.6-MariaDB", true),
            ("11.4.2-MariaDB", true),
        ] {
            let parsed = ServerVersion::parse(version).unwrap();
            assert_eq!(parsed.is_supported(), ok, "{version}");
        }
        assert!(ServerVersion::parse("garbage").is_none());
    }
}
