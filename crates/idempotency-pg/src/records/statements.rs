//! The records store's SQL, built once per store from the validated table name.

use std::sync::Arc;

use sqlx::{AssertSqlSafe, SqlSafeStr, SqlStr};

use crate::table::TableName;

/// Every statement, built once per store from the validated table name. sqlx prepares each one
/// once per connection and reuses it.
#[derive(Debug)]
pub(super) struct Statements {
    pub(super) acquire: SqlStr,
    pub(super) acquire_bounded: SqlStr,
    pub(super) insert_completed: SqlStr,
    pub(super) insert_completed_bounded: SqlStr,
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
        let key = "operation = $1 AND scope = $2 AND idempotency_key = $3";
        let columns =
            "operation, scope, idempotency_key, request_hash, status, created_at, expires_at";
        let completed_columns = "operation, scope, idempotency_key, request_hash, status, \
                                 result_payload, error_code, created_at, completed_at, expires_at, \
                                 trace_id, span_id";
        Self {
            acquire: sql(format!(
                "INSERT INTO {t} ({columns}) VALUES ($1, $2, $3, $4, 'PROCESSING', now(), now() + $5) \
                 ON CONFLICT (operation, scope, idempotency_key) DO NOTHING"
            )),
            // One round trip: set `lock_timeout` for the insert only, then restore it, so the
            // caller's own statements keep their setting. The insert reads from `cfg`, so the new
            // timeout is in force before it can wait; the restore is computed from `ins`, so it
            // happens after the insert finished.
            acquire_bounded: sql(format!(
                "WITH cfg AS MATERIALIZED ( \
                     SELECT current_setting('lock_timeout') AS previous, \
                            set_config('lock_timeout', $6, true) AS applied), \
                 ins AS ( \
                     INSERT INTO {t} ({columns}) \
                     SELECT $1, $2, $3, $4, 'PROCESSING', now(), now() + $5 FROM cfg \
                     ON CONFLICT (operation, scope, idempotency_key) DO NOTHING RETURNING 1) \
                 SELECT i.n, set_config('lock_timeout', cfg.previous, true) \
                 FROM cfg, (SELECT count(*) AS n FROM ins) AS i"
            )),
            insert_completed: sql(format!(
                "INSERT INTO {t} ({completed_columns}) \
                 VALUES ($1, $2, $3, $4, $5, $6::json, $7, now(), clock_timestamp(), now() + $8, \
                         $9, $10) \
                 ON CONFLICT (operation, scope, idempotency_key) DO NOTHING \
                 RETURNING created_at, completed_at, expires_at"
            )),
            // The same single-round-trip lock budget as `acquire_bounded`.
            insert_completed_bounded: sql(format!(
                "WITH cfg AS MATERIALIZED ( \
                     SELECT current_setting('lock_timeout') AS previous, \
                            set_config('lock_timeout', $11, true) AS applied), \
                 ins AS ( \
                     INSERT INTO {t} ({completed_columns}) \
                     SELECT $1, $2, $3, $4, $5, $6::json, $7, now(), clock_timestamp(), now() + $8, \
                            $9, $10 \
                     FROM cfg \
                     ON CONFLICT (operation, scope, idempotency_key) DO NOTHING \
                     RETURNING created_at, completed_at, expires_at) \
                 SELECT ins.created_at, ins.completed_at, ins.expires_at, \
                        set_config('lock_timeout', cfg.previous, true) \
                 FROM cfg LEFT JOIN ins ON true"
            )),
            find: sql(format!(
                "SELECT request_hash, status, result_payload::text, error_code, created_at, \
                        completed_at, expires_at, trace_id, span_id FROM {t} WHERE {key}"
            )),
            complete: sql(format!(
                "UPDATE {t} SET status = $4, result_payload = $5::json, error_code = $6, \
                        completed_at = clock_timestamp(), trace_id = $7, span_id = $8 \
                 WHERE {key} AND status = 'PROCESSING' \
                 RETURNING request_hash, created_at, completed_at, expires_at"
            )),
            status: sql(format!("SELECT status FROM {t} WHERE {key}")),
            delete_expired: sql(format!(
                "WITH doomed AS ( \
                     SELECT operation, scope, idempotency_key FROM {t} \
                     WHERE expires_at < now() ORDER BY expires_at LIMIT $1 \
                     FOR UPDATE SKIP LOCKED) \
                 DELETE FROM {t} AS r USING doomed AS d \
                 WHERE r.operation = d.operation AND r.scope = d.scope \
                   AND r.idempotency_key = d.idempotency_key"
            )),
        }
    }
}
