//! [`KeyAdmin`] for [`PgStore`].

use std::time::SystemTime;

use chrono::{DateTime, Utc};
use idempotency_core::admin::{Eviction, Force, KeyAdmin, KeyGroup, KeyStats, eviction};
use idempotency_core::lease::FencingToken;
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

/// The lease token of row `r`, `NULL` when the table has no `lease_token` column (leased
/// claims never prepared on it). `to_json`, not `to_jsonb`: the row's `json` outcome is
/// copied as written, and one `jsonb` refuses (a `\u0000` escape) cannot fail the read.
const TOKEN: &str = "(to_json(r) ->> 'lease_token')::bigint";

/// How often an eviction runs its statement when a concurrent write makes it fail with a
/// serialization error (nothing was deleted then).
const EVICTION_TRIES: usize = 3;

impl PgStore {
    /// [`KeyAdmin::evict`]'s statement, once.
    async fn evict_once(&self, id: &RecordId, force: Force) -> Result<Eviction, StoreError> {
        let t = self.table().quoted();
        let mut own = self.own().await?;
        let key = "operation = $1 AND scope = $2 AND idempotency_key = $3";
        let (forced, token) = force.claim();
        let (found, deleted): (Option<String>, Option<String>) =
            sqlx::query_as(AssertSqlSafe(format!(
                "WITH target AS (SELECT status::text AS status FROM {t} WHERE {key}), \
                      gone AS (DELETE FROM {t} AS r WHERE {key} AND CASE WHEN $4 \
                                 THEN status = 'PROCESSING' AND {TOKEN} IS NOT DISTINCT FROM $5 \
                                 ELSE status <> 'PROCESSING' END \
                               RETURNING status::text AS status) \
                 SELECT (SELECT status FROM target), (SELECT status FROM gone)"
            )))
            .persistent(persistent(self.pooler()))
            .bind(id.operation.as_str())
            .bind(id.scope.as_str())
            .bind(id.key.as_str())
            .bind(forced)
            .bind(token)
            .fetch_one(&mut *own)
            .await
            .map_err(store_error)?;
        own.finish().await.map_err(store_error)?;
        let found = found.as_deref().map(status).transpose()?;
        let deleted = deleted.as_deref().map(status).transpose()?;
        Ok(eviction(force, found, deleted))
    }
}

impl KeyAdmin for PgStore {
    /// One statement. Under READ COMMITTED the delete's condition is checked again on the
    /// row's newest version when a concurrent write changed it; under REPEATABLE READ or
    /// SERIALIZABLE (`default_transaction_isolation`) that write fails the statement with a
    /// serialization error, having deleted nothing, and the statement runs again on a new
    /// snapshot. Either way a takeover or a completion that commits meanwhile is seen; the
    /// status reported is the deleted row's. The token is read from the row as JSON, so a
    /// table without the lease columns is evicted from too.
    async fn evict(&self, id: &RecordId, force: Force) -> Result<Eviction, StoreError> {
        let mut tries = 1;
        loop {
            match self.evict_once(id, force).await {
                Err(StoreError::Conflict(_)) if tries < EVICTION_TRIES => tries += 1,
                other => return other,
            }
        }
    }

    async fn lease_token(&self, id: &RecordId) -> Result<Option<FencingToken>, StoreError> {
        let t = self.table().quoted();
        let mut own = self.own().await?;
        let token: Option<Option<i64>> = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT {TOKEN} FROM {t} AS r \
             WHERE operation = $1 AND scope = $2 AND idempotency_key = $3"
        )))
        .persistent(persistent(self.pooler()))
        .bind(id.operation.as_str())
        .bind(id.scope.as_str())
        .bind(id.key.as_str())
        .fetch_optional(&mut *own)
        .await
        .map_err(store_error)?;
        own.finish().await.map_err(store_error)?;
        Ok(token.flatten().map(FencingToken))
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
