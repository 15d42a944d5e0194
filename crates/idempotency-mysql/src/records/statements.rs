//! Every statement of the records store, built once from the validated table name.

use std::sync::Arc;

use sqlx::{AssertSqlSafe, SqlSafeStr, SqlStr};

use crate::clock::NOW;
use crate::table::TableName;

/// The store's SQL. sqlx prepares each statement once per connection and reuses it.
#[derive(Debug)]
pub(super) struct Statements {
    pub(super) acquire: SqlStr,
    pub(super) insert_completed: SqlStr,
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

/// Keeps the existing row as it is, and marks the statement's result: `LAST_INSERT_ID(1)` is
/// evaluated only on a duplicate key, and the server reports its argument as the statement's
/// insert id (a table without `AUTO_INCREMENT` reports 0 for a real insert). The affected-row
/// count cannot tell the two apart: sqlx connects with `CLIENT_FOUND_ROWS`, which counts a
/// duplicate left unchanged as 1, like an insert.
pub(super) const ON_DUPLICATE_KEEP: &str =
    "ON DUPLICATE KEY UPDATE created_at = IF(LAST_INSERT_ID(1), created_at, created_at)";

impl Statements {
    pub(super) fn new(table: &TableName) -> Self {
        let t = table.quoted();
        let key = "operation = ? AND scope = ? AND idempotency_key = ?";
        Self {
            // Not `INSERT IGNORE`, which turns every error (a too-long value, a CHECK) into a
            // warning: `ON DUPLICATE KEY UPDATE` swallows the duplicate key and nothing else.
            acquire: sql(format!(
                "INSERT INTO {t} (operation, scope, idempotency_key, request_hash, status, \
                                  created_at, expires_at) \
                 VALUES (?, ?, ?, ?, 'PROCESSING', {NOW}, {NOW} + INTERVAL ? MICROSECOND) \
                 {ON_DUPLICATE_KEEP}"
            )),
            insert_completed: sql(format!(
                "INSERT INTO {t} (operation, scope, idempotency_key, request_hash, status, \
                                  result_payload, error_code, created_at, completed_at, expires_at) \
                 VALUES (?, ?, ?, ?, ?, ?, ?, {NOW}, {NOW}, {NOW} + INTERVAL ? MICROSECOND) \
                 {ON_DUPLICATE_KEEP}"
            )),
            // The transaction's own row: always visible to it.
            inserted_times: sql(format!(
                "SELECT created_at, completed_at, expires_at FROM {t} WHERE {key}"
            )),
            find: sql(format!(
                "SELECT request_hash, status, result_payload, error_code, created_at, \
                        completed_at, expires_at FROM {t} WHERE {key}"
            )),
            // The latest committed version, whatever the transaction's snapshot.
            find_locking: sql(format!(
                "SELECT request_hash, status, result_payload, error_code, created_at, \
                        completed_at, expires_at FROM {t} WHERE {key} LOCK IN SHARE MODE"
            )),
            // Never before created_at, even when the clock steps back.
            complete: sql(format!(
                "UPDATE {t} SET status = ?, result_payload = ?, error_code = ?, \
                        completed_at = GREATEST(UTC_TIMESTAMP(6), created_at) \
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
