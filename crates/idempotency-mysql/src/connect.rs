//! What the stores ask of the server: a begin safe to cancel, a version with `SKIP LOCKED`,
//! short READ COMMITTED transactions for the relay and cleanup, and a per-statement lock wait
//! budget.

use sqlx::{MySqlConnection, MySqlPool, SqlStr};
use tracing::Instrument as _;

use crate::transaction::MysqlTransaction;

use crate::error::{
    ER_BAD_NULL_ERROR, ER_LOCK_DEADLOCK, ER_SP_DOES_NOT_EXIST, EndedEarlier, Error, InTransaction,
    TransactionRolledBack, error_number,
};

/// What every begin of this crate runs first, in the same round trip: puts back a lock wait
/// budget that a bounded wait set on MySQL 8 and could not restore (its future was dropped
/// while the statement ran; see [`SET_LOCK_WAIT`]), so that the transaction begins with the
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
    let (sender, receiver) = tokio::sync::oneshot::channel();
    // In the caller's span, so that what the pool logs stays attached to the request.
    let task = tokio::spawn(begin_task(pool.clone(), statement, sender).in_current_span());
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

/// What the task of [`begin_with`] runs: the begin, its transaction sent to `sender`, or rolled
/// back when nobody takes it.
///
/// The begin and the rollback are boxed: `tokio::spawn` moves the future it is given into the
/// task's allocation, a copy of the whole future at each step of the way, and the pool's
/// acquire alone makes an unboxed one 2.4 kB, copied in full even before it ran. Boxed, each
/// is built once, where it starts, and the task holds pointers.
async fn begin_task(
    pool: MySqlPool,
    statement: &'static str,
    sender: tokio::sync::oneshot::Sender<Result<MysqlTransaction, sqlx::Error>>,
) {
    let begun = Box::pin(async {
        let conn = pool.acquire().await?;
        MysqlTransaction::begin(conn, SqlStr::from_static(statement)).await
    })
    .await;
    // Nobody takes it (the caller's future was dropped): the begin ran to its end, so the
    // connection is in step with the server, and a rollback hands it back clean.
    if let Err(Ok(tx)) = sender.send(begun)
        && let Err(error) = Box::pin(tx.rollback()).await
    {
        tracing::debug!(%error, "rolling back a transaction nobody took");
    }
}

/// Asks whether the session is still in a transaction: outside one, a savepoint is not kept and
/// releasing it fails with 1305.
const PROBE: &str = "SAVEPOINT idempotency_probe; RELEASE SAVEPOINT idempotency_probe";

/// What this crate's writes on MariaDB bind their first key column with, in place of `?`:
/// `NULL` when the session is not in a transaction any more, which the `NOT NULL` column
/// refuses (1048), so that the statement fails instead of committing on its own. MariaDB's
/// `@@in_transaction` is 0 outside a transaction, autocommit statements included, and 1 from
/// `START TRANSACTION` on. It costs no round trip: the check runs inside the statement. MySQL 8
/// has no such variable: there [`ensure_open`] asks first.
pub(crate) const IN_TRANSACTION_ONLY: &str = "IF(@@in_transaction, ?, NULL)";

/// MySQL 8's check (see [`IN_TRANSACTION_ONLY`] for MariaDB's) that the caller's transaction
/// is still open before a statement of this crate writes in it: when the server ended it
/// before (a deadlock of one of the caller's own statements), ends the session too and
/// reports [`TransactionRolledBack`], so that neither that write nor anything after it commits
/// on its own. `lock_wait`: sets the bounded wait budget too ([`SET_LOCK_WAIT`]), in
/// the same round trip (the `SET` does not run when the check fails).
pub(crate) async fn ensure_open(
    conn: &mut MySqlConnection,
    lock_wait: Option<u64>,
) -> Result<(), InTransaction> {
    let probed = match lock_wait {
        None => sqlx::raw_sql(PROBE).execute(&mut *conn).await,
        Some(seconds) => {
            let set = SET_LOCK_WAIT.replace('?', &seconds.to_string());
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!("{PROBE}; {set}")))
                .execute(&mut *conn)
                .await
        }
    };
    match probed {
        Ok(_) => Ok(()),
        Err(error) => Err(failed_in_transaction(conn, error).await),
    }
}

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
    // A savepoint the server did not keep, or the NULL of `IN_TRANSACTION_ONLY`: the statement
    // failed because the transaction had ended before it, not with it.
    if matches!(
        error_number(&error),
        Some(ER_SP_DOES_NOT_EXIST | ER_BAD_NULL_ERROR)
    ) {
        return InTransaction::RolledBack(TransactionRolledBack::new(EndedEarlier));
    }
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

/// MySQL 8 (whose `SET_VAR` hint does not cover `innodb_lock_wait_timeout`): sets the session's
/// `innodb_lock_wait_timeout` for the statements until [`restore_lock_wait`], keeping the
/// session's own value in a session variable unless one is kept already, so that a budget left
/// by a wait whose restore never ran (its future was dropped) is not mistaken for the session's
/// own (the assignments of one `SET` run left to right). When the restore never runs, the next
/// bounded wait on the connection restores the kept value, and so does every begin of this
/// crate (`BEGIN`), before anything else runs. `0` means "do not wait" on MariaDB; MySQL's
/// minimum is 1 (it clamps 0 to 1 with a warning). [`ensure_open`] runs it, with the budget in
/// place of `?`.
pub(crate) const SET_LOCK_WAIT: &str = "SET @idempotency_lock_wait = \
     CAST(COALESCE(@idempotency_lock_wait, @@SESSION.innodb_lock_wait_timeout) AS UNSIGNED), \
     SESSION innodb_lock_wait_timeout = ?";
pub(crate) const RESTORE_LOCK_WAIT: &str = "SET SESSION innodb_lock_wait_timeout = \
     @idempotency_lock_wait, @idempotency_lock_wait = NULL";

/// Puts back the value [`SET_LOCK_WAIT`] replaced.
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
        let own = session_lock_wait(&mut pool.acquire().await.unwrap()).await;
        assert!(own > 3, "{own}");
        let mut tx = begin(&pool).await.unwrap();
        // A wait whose future was dropped: set, never restored.
        ensure_open(&mut tx, Some(2)).await.unwrap();
        assert_eq!(session_lock_wait(&mut tx).await, 2);
        // The next wait keeps the session's own value, not the leaked 2.
        ensure_open(&mut tx, Some(3)).await.unwrap();
        restore_lock_wait(&mut tx).await.unwrap();
        assert_eq!(session_lock_wait(&mut tx).await, own);
        // Leaked again, and the connection goes back to the pool with it; the next begin
        // heals it.
        ensure_open(&mut tx, Some(2)).await.unwrap();
        tx.rollback().await.unwrap();
        assert_eq!(
            session_lock_wait(&mut pool.acquire().await.unwrap()).await,
            2
        );
        let mut tx = begin(&pool).await.unwrap();
        assert_eq!(session_lock_wait(&mut tx).await, own);
        tx.rollback().await.unwrap();
        let mut tx = begin_read_committed(&pool).await.unwrap();
        assert_eq!(session_lock_wait(&mut tx).await, own);
        tx.rollback().await.unwrap();
    }

    /// The session's transaction ended under sqlx (as after a deadlock: the session is back in
    /// autocommit, sqlx still counts the transaction), shown with a `ROLLBACK` sent as plain
    /// SQL.
    async fn ended_under_sqlx(pool: &MySqlPool) -> MysqlTransaction {
        let mut tx = begin(pool).await.unwrap();
        sqlx::raw_sql("ROLLBACK").execute(&mut *tx).await.unwrap();
        tx
    }

    fn assert_ended_earlier(result: Result<(), InTransaction>) {
        let Err(InTransaction::RolledBack(error)) = result else {
            panic!("not refused: {result:?}");
        };
        let source = std::error::Error::source(&error).unwrap();
        assert!(source.is::<EndedEarlier>(), "{source:?}");
    }

    /// MySQL 8's check, run on whatever server the tests have: refused once the transaction
    /// ended, the budget's `SET` not run, and the session ended with it.
    #[tokio::test]
    async fn ensure_open_refuses_a_transaction_the_server_ended() {
        let pool = idempotency_testing::mysql_pool_with(1).await;
        let own = session_lock_wait(&mut pool.acquire().await.unwrap()).await;
        let mut tx = begin(&pool).await.unwrap();
        ensure_open(&mut tx, None).await.unwrap();
        tx.rollback().await.unwrap();
        let mut tx = ended_under_sqlx(&pool).await;
        let id: u64 = sqlx::query_scalar("SELECT CONNECTION_ID()")
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        assert_ended_earlier(ensure_open(&mut tx, Some(2)).await);
        assert!(
            sqlx::query("SELECT 1").execute(&mut *tx).await.is_err(),
            "the session goes on"
        );
        drop(tx);
        let mut conn = pool.acquire().await.unwrap();
        let now: u64 = sqlx::query_scalar("SELECT CONNECTION_ID()")
            .fetch_one(&mut *conn)
            .await
            .unwrap();
        assert_ne!(now, id, "the ended session came back to the pool");
        assert_eq!(session_lock_wait(&mut conn).await, own);
    }

    /// MariaDB's check: `IN_TRANSACTION_ONLY` is read at each run of a prepared statement, so
    /// the statement prepared in an open transaction fails once the transaction ended.
    #[tokio::test]
    async fn the_mariadb_guard_refuses_a_write_once_the_transaction_ended() {
        let pool = idempotency_testing::mysql_pool_with(1).await;
        let mariadb = Server::ask(&mut pool.acquire().await.unwrap())
            .await
            .unwrap()
            .mariadb;
        if !mariadb {
            return; // MySQL 8 has no `@@in_transaction`: `ensure_open` asks there.
        }
        sqlx::raw_sql("CREATE TABLE guarded (name VARCHAR(10) PRIMARY KEY) ENGINE = InnoDB")
            .execute(&pool)
            .await
            .unwrap();
        let insert = format!("INSERT INTO guarded (name) VALUES ({IN_TRANSACTION_ONLY})");
        let mut tx = begin(&pool).await.unwrap();
        sqlx::query(sqlx::AssertSqlSafe(insert.clone()))
            .bind("in")
            .execute(&mut *tx)
            .await
            .unwrap();
        tx.commit().await.unwrap();
        let mut tx = ended_under_sqlx(&pool).await;
        let result = sqlx::query(sqlx::AssertSqlSafe(insert))
            .bind("out")
            .execute(&mut *tx)
            .await;
        let error = result.unwrap_err();
        assert_eq!(error_number(&error), Some(ER_BAD_NULL_ERROR), "{error:?}");
        let failed = failed_in_transaction(&mut tx, error).await;
        assert_ended_earlier(Err(failed));
        drop(tx);
        let names: Vec<String> = sqlx::query_scalar("SELECT name FROM guarded")
            .fetch_all(&pool)
            .await
            .unwrap();
        assert_eq!(names, ["in"]);
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

    /// The future `begin_with` spawns (in the caller's span, as it spawns it) stays a few
    /// words (144 bytes): 2,360 bytes when the begin and the rollback were not boxed inside it.
    #[tokio::test]
    async fn the_spawned_begin_is_small() {
        let pool = sqlx::mysql::MySqlPoolOptions::new()
            .connect_lazy("mysql://root@127.0.0.1/test")
            .unwrap();
        let (sender, _receiver) = tokio::sync::oneshot::channel();
        let task = begin_task(pool, BEGIN, sender).in_current_span();
        let size = size_of_val(&task);
        assert!(size <= 256, "the spawned begin is {size} bytes");
    }
}
