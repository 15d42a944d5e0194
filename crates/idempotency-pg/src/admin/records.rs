//! [`KeyAdmin`] for [`PgStore`].

use std::time::SystemTime;

use chrono::{DateTime, Utc};
use idempotency_core::admin::{Eviction, KeyAdmin, KeyGroup, KeyStats, eviction};
use idempotency_core::{RecordId, RecordStatus, StoreError};
use sqlx::AssertSqlSafe;

use crate::PgStore;
use crate::error::store_error;
use crate::pooler::persistent;

fn status(text: &str) -> Result<RecordStatus, StoreError> {
    text.parse()
        .map_err(|e: idempotency_core::UnknownStatus| StoreError::Corrupt {
            reason: e.to_string(),
        })
}

impl KeyAdmin for PgStore {
    /// One statement: the status read and the conditional delete see one snapshot.
    async fn evict(&self, id: &RecordId, force: bool) -> Result<Eviction, StoreError> {
        let t = self.table().quoted();
        let mut own = self.own().await?;
        let key = "operation = $1 AND scope = $2 AND idempotency_key = $3";
        let (found, deleted): (Option<String>, i64) = sqlx::query_as(AssertSqlSafe(format!(
            "WITH target AS (SELECT status::text AS status FROM {t} WHERE {key}), \
                  gone AS (DELETE FROM {t} WHERE {key} AND (status <> 'PROCESSING' OR $4) \
                           RETURNING 1) \
             SELECT (SELECT status FROM target), (SELECT count(*) FROM gone)"
        )))
        .persistent(persistent(self.pooler()))
        .bind(id.operation.as_str())
        .bind(id.scope.as_str())
        .bind(id.key.as_str())
        .bind(force)
        .fetch_one(&mut *own)
        .await
        .map_err(store_error)?;
        own.finish().await.map_err(store_error)?;
        let found = found.as_deref().map(status).transpose()?;
        Ok(eviction(found, u64::try_from(deleted).unwrap_or_default()))
    }

    async fn key_stats(&self) -> Result<KeyStats, StoreError> {
        let t = self.table().quoted();
        let mut own = self.own().await?;
        let rows: Vec<(String, String, i64, DateTime<Utc>)> =
            sqlx::query_as(AssertSqlSafe(format!(
                "SELECT operation::text, status::text, count(*), min(created_at) FROM {t} \
                 GROUP BY 1, 2 ORDER BY 1, 2"
            )))
            .persistent(persistent(self.pooler()))
            .fetch_all(&mut *own)
            .await
            .map_err(store_error)?;
        let expired: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT count(*) FROM {t} WHERE expires_at < now()"
        )))
        .persistent(persistent(self.pooler()))
        .fetch_one(&mut *own)
        .await
        .map_err(store_error)?;
        own.finish().await.map_err(store_error)?;
        let groups = rows
            .into_iter()
            .map(|(operation, text, count, oldest)| {
                Ok(KeyGroup::new(
                    operation,
                    status(&text)?,
                    u64::try_from(count).unwrap_or_default(),
                    SystemTime::from(oldest),
                ))
            })
            .collect::<Result<_, StoreError>>()?;
        Ok(KeyStats::new(
            groups,
            u64::try_from(expired).unwrap_or_default(),
        ))
    }
}
