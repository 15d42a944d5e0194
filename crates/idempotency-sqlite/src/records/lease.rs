//! [`LeasedClaims`] on SQLite: a committed `PROCESSING` record with a lease and a fencing
//! token, in two extra columns of the records table (`lease_token`, `lease_expires_at` in Unix
//! milliseconds, added by [`prepare_leases`](LeasedClaims::prepare_leases)). Every statement
//! runs on its own on the pool and reads the database clock.

use std::time::Duration;

use idempotency_core::lease::{FencingToken, LeaseClaim, LeasedClaims};
use idempotency_core::store::{Claim, IdempotencyStore, StoreError};
use idempotency_core::{IdempotencyRecord, RecordId, StoredOutcome};
use sqlx::{AssertSqlSafe, SqlSafeStr, SqlStr};

use super::store::SqliteStore;
use crate::clock::{NOW_MS, ttl_millis};
use crate::error::store_error;

/// Claims that find the record gone between the upsert and the read retry this often.
const CLAIM_ROUNDS: usize = 3;

const KEY: &str = "operation = ?1 AND scope = ?2 AND idempotency_key = ?3";

fn millis(duration: Duration) -> i64 {
    ttl_millis(Some(duration)).unwrap_or(i64::MAX / 2)
}

impl SqliteStore {
    fn lease_sql(&self, text: impl FnOnce(&str) -> String) -> SqlStr {
        AssertSqlSafe(text(self.table().quoted())).into_sql_str()
    }
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
                let sql = self.lease_sql(|t| format!("ALTER TABLE {t} ADD COLUMN {column} {ty}"));
                sqlx::query(sql)
                    .execute(&mut *tx)
                    .await
                    .map_err(store_error)?;
            }
        }
        Self::commit(tx).await
    }

    async fn claim_leased(
        &self,
        claim: &Claim<'_>,
        lease: Duration,
    ) -> Result<LeaseClaim, StoreError> {
        // Insert with token 1, or take over an expired lease of the same request (same
        // fingerprint) with the next token. A live lease, a terminal record or another
        // fingerprint leave the row as it is and return nothing.
        let upsert = self.lease_sql(|t| {
            format!(
                "INSERT INTO {t} (operation, scope, idempotency_key, request_hash, status, \
                                  created_at, expires_at, lease_token, lease_expires_at) \
                 VALUES (?1, ?2, ?3, ?4, 'PROCESSING', {NOW_MS}, {NOW_MS} + ?5, 1, {NOW_MS} + ?6) \
                 ON CONFLICT (operation, scope, idempotency_key) DO UPDATE \
                 SET lease_token = lease_token + 1, lease_expires_at = {NOW_MS} + ?6, \
                     expires_at = {NOW_MS} + ?5 \
                 WHERE status = 'PROCESSING' AND lease_token IS NOT NULL \
                   AND lease_expires_at <= {NOW_MS} AND request_hash = ?4 \
                 RETURNING lease_token"
            )
        });
        let left = self.lease_sql(|t| {
            format!(
                "SELECT max(lease_expires_at - {NOW_MS}, 0) FROM {t} \
                 WHERE {KEY} AND status = 'PROCESSING'"
            )
        });
        let id = claim.id;
        for _ in 0..CLAIM_ROUNDS {
            let token: Option<i64> = sqlx::query_scalar(upsert.clone())
                .bind(id.operation.as_str())
                .bind(id.scope.as_str())
                .bind(id.key.as_str())
                .bind(claim.fingerprint.as_str())
                .bind(ttl_millis(claim.ttl))
                .bind(millis(lease))
                .fetch_optional(self.pool())
                .await
                .map_err(store_error)?;
            if let Some(token) = token {
                return Ok(LeaseClaim::Acquired {
                    token: FencingToken(token),
                    takeover: token > 1,
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
    ) -> Result<Option<IdempotencyRecord>, StoreError> {
        let sql = self.lease_sql(|t| {
            format!(
                "UPDATE {t} SET status = ?5, result_payload = ?6, error_code = ?7, \
                     completed_at = {NOW_MS}, lease_expires_at = NULL \
                 WHERE {KEY} AND status = 'PROCESSING' AND lease_token = ?4"
            )
        });
        let (payload, code) = outcome.to_columns();
        let updated = sqlx::query(sql)
            .bind(id.operation.as_str())
            .bind(id.scope.as_str())
            .bind(id.key.as_str())
            .bind(token.0)
            .bind(outcome.status().as_str())
            .bind(payload)
            .bind(code)
            .execute(self.pool())
            .await
            .map_err(store_error)?;
        if updated.rows_affected() == 0 {
            return Ok(None);
        }
        self.lookup(id).await
    }

    async fn release_leased(&self, id: &RecordId, token: FencingToken) -> Result<bool, StoreError> {
        let sql = self.lease_sql(|t| {
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
