//! [`KeyAdmin`] for [`MysqlStore`].

use std::time::SystemTime;

use chrono::NaiveDateTime;
use idempotency_core::admin::{Eviction, KeyAdmin, KeyGroup, KeyStats, eviction};
use idempotency_core::{RecordId, RecordStatus, StoreError};
use sqlx::AssertSqlSafe;

use crate::MysqlStore;
use crate::clock::NOW;
use crate::error::store_error;

fn status(text: &str) -> Result<RecordStatus, StoreError> {
    text.parse()
        .map_err(|e: idempotency_core::UnknownStatus| StoreError::Corrupt {
            reason: e.to_string(),
        })
}

impl KeyAdmin for MysqlStore {
    /// One transaction: the row is locked by the read (`FOR UPDATE`), then deleted unless it
    /// is `PROCESSING` and eviction is not forced.
    async fn evict(&self, id: &RecordId, force: bool) -> Result<Eviction, StoreError> {
        let t = self.table().quoted();
        let key = "operation = ? AND scope = ? AND idempotency_key = ?";
        let mut tx = crate::begin(self.pool()).await.map_err(store_error)?;
        let found: Option<String> = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT status FROM {t} WHERE {key} FOR UPDATE"
        )))
        .bind(id.operation.as_str())
        .bind(id.scope.as_str())
        .bind(id.key.as_str())
        .fetch_optional(&mut *tx)
        .await
        .map_err(store_error)?;
        let found = found.as_deref().map(status).transpose()?;
        let deleted = match found {
            Some(RecordStatus::Processing) if !force => 0,
            Some(_) => sqlx::query(AssertSqlSafe(format!("DELETE FROM {t} WHERE {key}")))
                .bind(id.operation.as_str())
                .bind(id.scope.as_str())
                .bind(id.key.as_str())
                .execute(&mut *tx)
                .await
                .map_err(store_error)?
                .rows_affected(),
            None => 0,
        };
        tx.commit().await.map_err(store_error)?;
        Ok(eviction(found, deleted))
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
