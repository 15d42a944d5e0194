//! [`KeyAdmin`] for [`MysqlStore`].

use std::time::SystemTime;

use chrono::NaiveDateTime;
use idempotency_core::admin::{Eviction, Force, KeyAdmin, KeyGroup, KeyStats, eviction};
use idempotency_core::lease::FencingToken;
use idempotency_core::{RecordId, RecordStatus, StoreError};
use sqlx::mysql::MySqlRow;
use sqlx::{AssertSqlSafe, MySqlConnection, Row};

use crate::MysqlStore;
use crate::clock::NOW;
use crate::error::store_error;

fn status(text: &str) -> Result<RecordStatus, StoreError> {
    text.parse()
        .map_err(|e: idempotency_core::UnknownStatus| StoreError::Corrupt {
            reason: e.to_string(),
        })
}

/// The lease token of a row read with `SELECT *`: `None` when it carries none, or when the
/// table has no `lease_token` column (leased claims never prepared on it).
fn token(row: &MySqlRow) -> Result<Option<FencingToken>, StoreError> {
    match row.try_get::<Option<i64>, _>("lease_token") {
        Ok(token) => Ok(token.map(FencingToken)),
        Err(sqlx::Error::ColumnNotFound(_)) => Ok(None),
        Err(error) => Err(store_error(error)),
    }
}

impl MysqlStore {
    /// The status and lease token of `id`'s record, read with `suffix` (`FOR UPDATE`).
    async fn claim_of(
        &self,
        conn: &mut MySqlConnection,
        id: &RecordId,
        suffix: &str,
    ) -> Result<Option<(RecordStatus, Option<FencingToken>)>, StoreError> {
        let t = self.table().quoted();
        let row = sqlx::query(AssertSqlSafe(format!(
            "SELECT * FROM {t} WHERE operation = ? AND scope = ? AND idempotency_key = ?{suffix}"
        )))
        // Not kept prepared: `*`'s columns are those of when it was prepared, and the lease
        // columns may be added to the table meanwhile (`prepare_leases`, a migration).
        .persistent(false)
        .bind(id.operation.as_str())
        .bind(id.scope.as_str())
        .bind(id.key.as_str())
        .fetch_optional(conn)
        .await
        .map_err(store_error)?;
        row.map(|row| {
            let text: String = row.try_get("status").map_err(store_error)?;
            Ok((status(&text)?, token(&row)?))
        })
        .transpose()
    }
}

impl KeyAdmin for MysqlStore {
    /// One transaction: the row is locked by the read (`FOR UPDATE`), then deleted unless it
    /// is one `force` does not allow.
    async fn evict(&self, id: &RecordId, force: Force) -> Result<Eviction, StoreError> {
        let t = self.table().quoted();
        let key = "operation = ? AND scope = ? AND idempotency_key = ?";
        let mut tx = crate::begin(self.pool()).await.map_err(store_error)?;
        let claim = self.claim_of(&mut tx, id, " FOR UPDATE").await?;
        let found = claim.map(|(status, _)| status);
        let deleted = match claim {
            Some((status, token)) if force.allows(status, token) => {
                let rows = sqlx::query(AssertSqlSafe(format!("DELETE FROM {t} WHERE {key}")))
                    .bind(id.operation.as_str())
                    .bind(id.scope.as_str())
                    .bind(id.key.as_str())
                    .execute(&mut *tx)
                    .await
                    .map_err(store_error)?
                    .rows_affected();
                (rows > 0).then_some(status)
            }
            _ => None,
        };
        tx.commit().await.map_err(store_error)?;
        Ok(eviction(force, found, deleted))
    }

    async fn lease_token(&self, id: &RecordId) -> Result<Option<FencingToken>, StoreError> {
        let mut conn = self.pool().acquire().await.map_err(store_error)?;
        let claim = self.claim_of(&mut conn, id, "").await?;
        Ok(claim.and_then(|(_, token)| token))
    }

    async fn key_stats(&self) -> Result<KeyStats, StoreError> {
        let t = self.table().quoted();
        let rows: Vec<(String, String, i64, NaiveDateTime)> =
            sqlx::query_as(AssertSqlSafe(format!(
                "SELECT operation, status, count(*), min(created_at) FROM {t} \
                 GROUP BY operation, status ORDER BY operation, status"
            )))
            .fetch_all(self.pool())
            .await
            .map_err(store_error)?;
        let expired: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT count(*) FROM {t} WHERE expires_at < {NOW}"
        )))
        .fetch_one(self.pool())
        .await
        .map_err(store_error)?;
        let groups = rows
            .into_iter()
            .map(|(operation, text, count, oldest)| {
                Ok(KeyGroup::new(
                    operation,
                    status(&text)?,
                    u64::try_from(count).unwrap_or_default(),
                    SystemTime::from(oldest.and_utc()),
                ))
            })
            .collect::<Result<_, StoreError>>()?;
        Ok(KeyStats::new(
            groups,
            u64::try_from(expired).unwrap_or_default(),
        ))
    }
}
