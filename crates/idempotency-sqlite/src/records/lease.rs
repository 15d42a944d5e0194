//! [`LeasedClaims`] on SQLite: a committed `PROCESSING` record with a lease and a fencing
//! token, in two extra columns of the records table (`lease_token`, `lease_expires_at` in Unix
//! milliseconds) and a one-row table the tokens are counted in (`<table>_lease_tokens`): in the
//! canonical DDL, or added by [`prepare_leases`](LeasedClaims::prepare_leases). Every statement
//! runs on the pool and reads the database clock.

use std::time::Duration;

use idempotency_core::lease::{FencingToken, LeaseClaim, LeasedClaims};
use idempotency_core::store::{Claim, IdempotencyStore, StoreError};
use idempotency_core::trace::SpanRef;
use idempotency_core::{IdempotencyRecord, RecordId, StoredOutcome};
use sqlx::{AssertSqlSafe, SqlSafeStr, SqlStr};

use super::store::SqliteStore;
use crate::clock::{NOW_MS, ttl_millis};
use crate::error::store_error;
use crate::table::TableName;

/// Claims that find the record gone between the upsert and the read retry this often.
const CLAIM_ROUNDS: usize = 3;

const KEY: &str = "operation = ?1 AND scope = ?2 AND idempotency_key = ?3";

fn millis(duration: Duration) -> i64 {
    ttl_millis(Some(duration)).unwrap_or(i64::MAX / 2)
}

impl SqliteStore {
    /// A statement on the records table (`{t}`) and the token counter (`{seq}`).
    fn lease_sql(&self, text: impl FnOnce(&str, &str) -> String) -> SqlStr {
        let counter = lease_counter(self.table());
        AssertSqlSafe(text(self.table().quoted(), &counter)).into_sql_str()
    }
}

/// The one-row table the fencing tokens of `table` are counted in, quoted: a token is never
/// issued twice, so a claim after a release (which deletes the record) never gets a token an
/// earlier holder of the key still carries.
pub(crate) fn lease_counter(table: &TableName) -> String {
    table.derived("lease_tokens")
}

/// The token counter, for a database that lacks it, moved above the tokens the table already
/// carries (leases prepared by an earlier release, which counted on the row, or a counter the
/// canonical DDL created at 0 over such a table); idempotent, and it never moves back. The lease columns are added by `prepare_leases`, or
/// are in the canonical DDL.
pub(crate) fn lease_counter_ddl(table: &TableName) -> String {
    let (t, seq) = (table.quoted(), lease_counter(table));
    format!(
        "CREATE TABLE IF NOT EXISTS {seq} (\n\
         \x20   id    INTEGER PRIMARY KEY CHECK (id = 1),\n\
         \x20   last  INTEGER NOT NULL\n\
         ) STRICT;\n\
         INSERT INTO {seq} (id, last) VALUES (1, 0) ON CONFLICT (id) DO NOTHING;\n\
         UPDATE {seq} SET last = max(last, (SELECT coalesce(max(lease_token), 0) FROM {t})) \
         WHERE id = 1;\n"
    )
}

impl LeasedClaims for SqliteStore {
    async fn prepare_leases(&self) -> Result<(), StoreError> {
        // Under the write lock, so that two processes starting together add each column once.
        let mut tx = self.begin().await?;
        for (column, ty) in [("lease_token", "INTEGER"), ("lease_expires_at", "INTEGER")] {
            let present: i64 =
                sqlx::query_scalar("SELECT count(*) FROM pragma_table_info(?1) WHERE name = ?2")
                    .bind(self.table().name())
                    .bind(column)
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(store_error)?;
            if present == 0 {
                let sql =
                    self.lease_sql(|t, _| format!("ALTER TABLE {t} ADD COLUMN {column} {ty}"));
                sqlx::query(sql)
                    .execute(&mut *tx)
                    .await
                    .map_err(store_error)?;
            }
        }
        sqlx::raw_sql(AssertSqlSafe(lease_counter_ddl(self.table())))
            .execute(&mut *tx)
            .await
            .map_err(store_error)?;
        Self::commit(tx).await
    }

    async fn claim_leased(
        &self,
        claim: &Claim<'_>,
        lease: Duration,
    ) -> Result<LeaseClaim, StoreError> {
        // Insert with a new token from the counter, or take over an expired lease of the same
        // request (same fingerprint) with a new token. A live lease, a terminal record or
        // another fingerprint leave the row as it is and return nothing. One transaction, under
        // the write lock: the token is counted, the row written, and whether a row was there
        // (a takeover) read together.
        let next = self.lease_sql(|_, seq| {
            format!("UPDATE {seq} SET last = last + 1 WHERE id = 1 RETURNING last")
        });
        let prior = self.lease_sql(|t, _| format!("SELECT count(*) FROM {t} WHERE {KEY}"));
        // The record expires no earlier than its lease ends, so cleanup never deletes a live
        // claim; without a TTL (`?5` NULL) `max` is NULL: it never expires.
        let upsert = self.lease_sql(|t, _| {
            format!(
                "INSERT INTO {t} (operation, scope, idempotency_key, request_hash, status, \
                                  created_at, expires_at, lease_token, lease_expires_at) \
                 VALUES (?1, ?2, ?3, ?4, 'PROCESSING', {NOW_MS}, \
                         max({NOW_MS} + ?5, {NOW_MS} + ?6), ?7, {NOW_MS} + ?6) \
                 ON CONFLICT (operation, scope, idempotency_key) DO UPDATE \
                 SET lease_token = ?7, lease_expires_at = {NOW_MS} + ?6, \
                     expires_at = max({NOW_MS} + ?5, {NOW_MS} + ?6) \
                 WHERE status = 'PROCESSING' AND lease_token IS NOT NULL \
                   AND lease_expires_at <= {NOW_MS} AND request_hash = ?4 \
                 RETURNING lease_token"
            )
        });
        let left = self.lease_sql(|t, _| {
            format!(
                "SELECT max(lease_expires_at - {NOW_MS}, 0) FROM {t} \
                 WHERE {KEY} AND status = 'PROCESSING'"
            )
        });
        let id = claim.id;
        for _ in 0..CLAIM_ROUNDS {
            let mut tx = self.begin().await?;
            let fresh: Option<i64> = sqlx::query_scalar(next.clone())
                .fetch_optional(&mut *tx)
                .await
                .map_err(store_error)?;
            let Some(fresh) = fresh else {
                return Err(StoreError::Database(
                    format!(
                        "the lease token counter {} has no row: run prepare_leases, or apply the \
                     migration that creates it",
                        lease_counter(self.table())
                    )
                    .into(),
                ));
            };
            let existed: i64 = sqlx::query_scalar(prior.clone())
                .bind(id.operation.as_str())
                .bind(id.scope.as_str())
                .bind(id.key.as_str())
                .fetch_one(&mut *tx)
                .await
                .map_err(store_error)?;
            let token: Option<i64> = sqlx::query_scalar(upsert.clone())
                .bind(id.operation.as_str())
                .bind(id.scope.as_str())
                .bind(id.key.as_str())
                .bind(claim.fingerprint.as_str())
                .bind(ttl_millis(claim.ttl))
                .bind(millis(lease))
                .bind(fresh)
                .fetch_optional(&mut *tx)
                .await
                .map_err(store_error)?;
            Self::commit(tx).await?;
            if let Some(token) = token {
                return Ok(LeaseClaim::Acquired {
                    token: FencingToken(token),
                    takeover: existed > 0,
                });
            }
            let Some(record) = self.lookup(id).await? else {
                continue; // released or deleted in between: claim again
            };
            let lease_left = if record.is_terminal() {
                None
            } else {
                let ms: Option<Option<i64>> = sqlx::query_scalar(left.clone())
                    .bind(id.operation.as_str())
                    .bind(id.scope.as_str())
                    .bind(id.key.as_str())
                    .fetch_optional(self.pool())
                    .await
                    .map_err(store_error)?;
                let ms = ms.flatten().unwrap_or(0).max(0);
                Some(Duration::from_millis(ms.unsigned_abs()))
            };
            return Ok(LeaseClaim::Exists { record, lease_left });
        }
        Err(StoreError::Conflict(
            "the record kept vanishing while being claimed".into(),
        ))
    }

    async fn complete_leased(
        &self,
        id: &RecordId,
        token: FencingToken,
        outcome: &StoredOutcome,
        execution_span: Option<SpanRef>,
    ) -> Result<Option<IdempotencyRecord>, StoreError> {
        let sql = self.lease_sql(|t, _| {
            format!(
                "UPDATE {t} SET status = ?5, result_payload = ?6, error_code = ?7, \
                     completed_at = {NOW_MS}, lease_expires_at = NULL, \
                     trace_id = ?8, span_id = ?9 \
                 WHERE {KEY} AND status = 'PROCESSING' AND lease_token = ?4"
            )
        });
        let (payload, code) = outcome.to_columns();
        let (trace_id, span_id) = execution_span
            .map(|s| (s.trace_id_hex(), s.span_id_hex()))
            .unzip();
        let updated = sqlx::query(sql)
            .bind(id.operation.as_str())
            .bind(id.scope.as_str())
            .bind(id.key.as_str())
            .bind(token.0)
            .bind(outcome.status().as_str())
            .bind(payload)
            .bind(code)
            .bind(trace_id)
            .bind(span_id)
            .execute(self.pool())
            .await
            .map_err(store_error)?;
        if updated.rows_affected() == 0 {
            return Ok(None);
        }
        self.lookup(id).await
    }

    async fn release_leased(&self, id: &RecordId, token: FencingToken) -> Result<bool, StoreError> {
        let sql = self.lease_sql(|t, _| {
            format!("DELETE FROM {t} WHERE {KEY} AND status = 'PROCESSING' AND lease_token = ?4")
        });
        let deleted = sqlx::query(sql)
            .bind(id.operation.as_str())
            .bind(id.scope.as_str())
            .bind(id.key.as_str())
            .bind(token.0)
            .execute(self.pool())
            .await
            .map_err(store_error)?;
        Ok(deleted.rows_affected() > 0)
    }
}
