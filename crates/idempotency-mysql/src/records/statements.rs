//! Every statement of the records store, built once from the validated table name.

use std::sync::Arc;

use sqlx::{AssertSqlSafe, SqlSafeStr, SqlStr};

use crate::clock::NOW;
use crate::connect::IN_TRANSACTION_ONLY;
use crate::table::TableName;

/// An insert of the store, in the form each server runs it.
#[derive(Debug)]
pub(super) struct Insert {
    /// MySQL 8: the plain statement, after `connect::ensure_open`.
    pub(super) mysql: SqlStr,
    /// MariaDB: with `innodb_lock_wait_timeout = 0` for the statement alone (`SET STATEMENT
    /// ... FOR`: the session's value is never changed, so a caller that drops the statement's
    /// future leaves nothing behind; see `MysqlStore::insert_waiting`), its operation bound through
    /// `connect::IN_TRANSACTION_ONLY` (the statement fails when the caller's transaction
    /// ended before it).
    pub(super) mariadb: SqlStr,
}

impl Insert {
    /// `statement` has `{operation}` where the operation's `?` goes.
    fn new(statement: &str) -> Self {
        Self {
            mysql: sql(statement.replace("{operation}", "?")),
            mariadb: sql(format!(
                "SET STATEMENT innodb_lock_wait_timeout = 0 FOR {}",
                statement.replace("{operation}", IN_TRANSACTION_ONLY)
            )),
        }
    }
}

/// The store's SQL. sqlx prepares each statement once per connection and reuses it.
#[derive(Debug)]
pub(super) struct Statements {
    pub(super) acquire: Insert,
    pub(super) insert_completed: Insert,
    pub(super) inserted_times: SqlStr,
    pub(super) find: SqlStr,
    pub(super) find_locking: SqlStr,
    pub(super) complete: SqlStr,
    pub(super) completed_row: SqlStr,
    pub(super) status: SqlStr,
    pub(super) expired: SqlStr,
    table: String,
}

pub(crate) fn sql(text: String) -> SqlStr {
    AssertSqlSafe(Arc::<str>::from(text)).into_sql_str()
}

impl Statements {
    pub(super) fn new(table: &TableName) -> Self {
        let t = table.quoted();
        let key = "operation = ? AND scope = ? AND idempotency_key = ?";
        Self {
            // A plain insert: an existing key fails it with 1062 alone (not `INSERT IGNORE`,
            // which turns every error, a too-long value, a CHECK, into a warning), and leaves a
            // shared lock on the row, which other replays share (`ON DUPLICATE KEY UPDATE`
            // would lock it exclusively until the replayer's transaction ends).
            acquire: Insert::new(&format!(
                "INSERT INTO {t} (operation, scope, idempotency_key, request_hash, status, \
                                  created_at, expires_at) \
                 VALUES ({{operation}}, ?, ?, ?, 'PROCESSING', {NOW}, \
                         {NOW} + INTERVAL ? MICROSECOND)"
            )),
            insert_completed: Insert::new(&format!(
                "INSERT INTO {t} (operation, scope, idempotency_key, request_hash, status, \
                                  result_payload, error_code, created_at, completed_at, expires_at, \
                                  trace_id, span_id) \
                 VALUES ({{operation}}, ?, ?, ?, ?, ?, ?, {NOW}, {NOW}, \
                         {NOW} + INTERVAL ? MICROSECOND, ?, ?)"
            )),
            // The transaction's own row: always visible to it.
            inserted_times: sql(format!(
                "SELECT created_at, completed_at, expires_at FROM {t} WHERE {key}"
            )),
            find: sql(format!(
                "SELECT request_hash, status, result_payload, error_code, created_at, \
                        completed_at, expires_at, trace_id, span_id FROM {t} WHERE {key}"
            )),
            // The latest committed version, whatever the transaction's snapshot.
            find_locking: sql(format!(
                "SELECT request_hash, status, result_payload, error_code, created_at, \
                        completed_at, expires_at, trace_id, span_id FROM {t} WHERE {key} \
                 LOCK IN SHARE MODE"
            )),
            // Never before created_at, even when the clock steps back.
            complete: sql(format!(
                "UPDATE {t} SET status = ?, result_payload = ?, error_code = ?, \
                        completed_at = GREATEST(UTC_TIMESTAMP(6), created_at), \
                        trace_id = ?, span_id = ? \
                 WHERE {key} AND status = 'PROCESSING'"
            )),
            completed_row: sql(format!(
                "SELECT request_hash, created_at, completed_at, expires_at FROM {t} WHERE {key}"
            )),
            status: sql(format!("SELECT status FROM {t} WHERE {key}")),
            expired: sql(format!(
                "SELECT operation, scope, idempotency_key FROM {t} \
                 WHERE expires_at < {NOW} ORDER BY expires_at LIMIT ? \
                 FOR UPDATE SKIP LOCKED"
            )),
            table: t.to_owned(),
        }
    }

    /// `DELETE` of `n` keys by primary key (one statement per batch size, cached by sqlx).
    pub(super) fn delete_keys(&self, n: usize) -> SqlStr {
        let rows = vec!["(?, ?, ?)"; n].join(", ");
        sql(format!(
            "DELETE FROM {} WHERE (operation, scope, idempotency_key) IN ({rows})",
            self.table
        ))
    }
}
