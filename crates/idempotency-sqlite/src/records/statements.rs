//! Every statement of the records store, built once from the validated table name.

use std::sync::Arc;

use sqlx::{AssertSqlSafe, SqlSafeStr, SqlStr};

use crate::clock::NOW_MS;
use crate::table::TableName;

/// The store's SQL. sqlx prepares each statement once per connection and reuses it.
#[derive(Debug)]
pub(super) struct Statements {
    pub(super) acquire: SqlStr,
    pub(super) insert_completed: SqlStr,
    pub(super) find: SqlStr,
    pub(super) complete: SqlStr,
    pub(super) status: SqlStr,
    pub(super) delete_expired: SqlStr,
}

fn sql(text: String) -> SqlStr {
    AssertSqlSafe(Arc::<str>::from(text)).into_sql_str()
}

impl Statements {
    pub(super) fn new(table: &TableName) -> Self {
        let t = table.quoted();
        let key = "operation = ?1 AND scope = ?2 AND idempotency_key = ?3";
        Self {
            // `NULL + n` is NULL: no TTL, no expiry.
            acquire: sql(format!(
                "INSERT INTO {t} (operation, scope, idempotency_key, request_hash, status, \
                                  created_at, expires_at) \
                 VALUES (?1, ?2, ?3, ?4, 'PROCESSING', {NOW_MS}, {NOW_MS} + ?5) \
                 ON CONFLICT (operation, scope, idempotency_key) DO NOTHING"
            )),
            insert_completed: sql(format!(
                "INSERT INTO {t} (operation, scope, idempotency_key, request_hash, status, \
                                  result_payload, error_code, created_at, completed_at, expires_at, \
                                  trace_id, span_id) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, {NOW_MS}, {NOW_MS}, {NOW_MS} + ?8, ?9, ?10) \
                 ON CONFLICT (operation, scope, idempotency_key) DO NOTHING \
                 RETURNING request_hash, created_at, completed_at, expires_at"
            )),
            find: sql(format!(
                "SELECT request_hash, status, result_payload, error_code, created_at, \
                        completed_at, expires_at, trace_id, span_id FROM {t} WHERE {key}"
            )),
            complete: sql(format!(
                "UPDATE {t} SET status = ?4, result_payload = ?5, error_code = ?6, \
                        completed_at = {NOW_MS}, trace_id = ?7, span_id = ?8 \
                 WHERE {key} AND status = 'PROCESSING' \
                 RETURNING request_hash, created_at, completed_at, expires_at"
            )),
            status: sql(format!("SELECT status FROM {t} WHERE {key}")),
            // No `DELETE ... LIMIT` (a compile-time option) and no row locks to skip: pick the
            // oldest expired keys through the expiry index, delete them in the same statement.
            delete_expired: sql(format!(
                "DELETE FROM {t} WHERE (operation, scope, idempotency_key) IN ( \
                     SELECT operation, scope, idempotency_key FROM {t} \
                     WHERE expires_at < {NOW_MS} ORDER BY expires_at LIMIT ?1)"
            )),
        }
    }
}
