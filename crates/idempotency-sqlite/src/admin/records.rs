//! [`KeyAdmin`] for [`SqliteStore`].

use idempotency_core::admin::{Eviction, KeyAdmin, KeyGroup, KeyStats, eviction};
use idempotency_core::{RecordId, RecordStatus, StoreError};
use sqlx::AssertSqlSafe;

use crate::SqliteStore;
use crate::clock::{NOW_MS, to_system_time};
use crate::error::store_error;

fn status(text: &str) -> Result<RecordStatus, StoreError> {
    text.parse()
        .map_err(|e: idempotency_core::UnknownStatus| StoreError::Corrupt {
            reason: e.to_string(),
        })
}

impl KeyAdmin for SqliteStore {
    /// One write transaction (`BEGIN IMMEDIATE` through the pool's write lock): the status
    /// read and the conditional delete cannot be split by another writer.
    async fn evict(&self, id: &RecordId, force: bool) -> Result<Eviction, StoreError> {
        let t = self.table().quoted();
        let key = "operation = ?1 AND scope = ?2 AND idempotency_key = ?3";
        let mut tx = self
            .pool()
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(store_error)?;
        let found: Option<String> =
            sqlx::query_scalar(AssertSqlSafe(format!("SELECT status FROM {t} WHERE {key}")))
                .bind(id.operation.as_str())
                .bind(id.scope.as_str())
                .bind(id.key.as_str())
                .fetch_optional(&mut *tx)
                .await
                .map_err(store_error)?;
        let deleted = sqlx::query(AssertSqlSafe(format!(
            "DELETE FROM {t} WHERE {key} AND (status <> 'PROCESSING' OR ?4)"
        )))
        .bind(id.operation.as_str())
        .bind(id.scope.as_str())
        .bind(id.key.as_str())
        .bind(force)
        .execute(&mut *tx)
        .await
        .map_err(store_error)?
        .rows_affected();
        tx.commit().await.map_err(store_error)?;
        let found = found.as_deref().map(status).transpose()?;
        Ok(eviction(found, deleted))
    }

    async fn key_stats(&self) -> Result<KeyStats, StoreError> {
        let t = self.table().quoted();
        let rows: Vec<(String, String, i64, i64)> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT operation, status, count(*), min(created_at) FROM {t} \
             GROUP BY 1, 2 ORDER BY 1, 2"
        )))
        .fetch_all(self.pool())
        .await
        .map_err(store_error)?;
        let expired: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT count(*) FROM {t} WHERE expires_at < {NOW_MS}"
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
                    to_system_time(oldest),
                ))
            })
            .collect::<Result<_, StoreError>>()?;
        Ok(KeyStats::new(
            groups,
            u64::try_from(expired).unwrap_or_default(),
        ))
    }
}
