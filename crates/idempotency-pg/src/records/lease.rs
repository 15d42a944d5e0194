//! [`LeasedClaims`] on PostgreSQL: a committed `PROCESSING` record with a lease and a fencing
//! token, in two extra columns of the records table (`lease_token`, `lease_expires_at`) and a
//! sequence the tokens come from (`<table>_lease_token_seq`): in the canonical DDL and the
//! migrations, or added by [`prepare_leases`](LeasedClaims::prepare_leases). Every statement
//! runs on its own on the pool (autocommit) and reads the database clock.

use std::time::Duration;

use idempotency_core::lease::{FencingToken, LeaseClaim, LeasedClaims};
use idempotency_core::store::{Claim, IdempotencyStore, StoreError};
use idempotency_core::trace::SpanRef;
use idempotency_core::{IdempotencyRecord, RecordId, StoredOutcome};
use sqlx::postgres::types::PgInterval;
use sqlx::{AssertSqlSafe, SqlSafeStr};

use super::store::PgStore;
use crate::error::store_error;
use crate::table::TableName;

/// Claims that find the record gone between the upsert and the read retry this often.
const CLAIM_ROUNDS: usize = 3;

fn interval(duration: Duration) -> PgInterval {
    PgInterval {
        months: 0,
        days: 0,
        microseconds: i64::try_from(duration.as_micros()).unwrap_or(i64::MAX),
    }
}

const KEY: &str = "operation = $1 AND scope = $2 AND idempotency_key = $3";

impl PgStore {
    /// A statement on the records table (`{t}`) and the token sequence (`{seq}`).
    fn lease_sql(&self, text: impl FnOnce(&str, &str) -> String) -> sqlx::SqlStr {
        let sequence = lease_sequence(self.table());
        AssertSqlSafe(text(self.table().quoted(), sequence.quoted())).into_sql_str()
    }
}

/// The sequence the fencing tokens of `table` come from: a token is never issued twice, so a
/// claim after a release (which deletes the record) never gets a token an earlier holder of the
/// key still carries.
pub(crate) fn lease_sequence(table: &TableName) -> TableName {
    table.sibling("lease_token_seq")
}

/// The lease columns and the token sequence, for a table that lacks them; idempotent. A
/// sequence created over a table that already carries tokens (leases prepared by an earlier
/// release, which counted on the row) starts above the highest of them.
pub(crate) fn lease_ddl(table: &TableName) -> String {
    let (t, seq) = (table.quoted(), lease_sequence(table));
    let seq = seq.quoted();
    format!(
        "ALTER TABLE {t} ADD COLUMN IF NOT EXISTS lease_token BIGINT, \
                        ADD COLUMN IF NOT EXISTS lease_expires_at TIMESTAMPTZ;\n\
         CREATE SEQUENCE IF NOT EXISTS {seq};\n{}",
        sequence_start(table)
    )
}

/// Moves a sequence that never issued a token above the tokens the table carries; nothing
/// once it has issued one (the table is then not read).
fn sequence_start(table: &TableName) -> String {
    let (t, seq) = (table.quoted(), lease_sequence(table));
    let seq = seq.quoted();
    format!(
        "SELECT setval('{seq}', m) FROM {seq} AS s, \
                LATERAL (SELECT max(lease_token) AS m FROM {t} WHERE NOT s.is_called) AS x \
          WHERE NOT s.is_called AND m IS NOT NULL;\n"
    )
}

impl LeasedClaims for PgStore {
    async fn prepare_leases(&self) -> Result<(), StoreError> {
        let missing = super::schema::lease_problems(self.pool(), self.pooler(), self.table())
            .await
            .map_err(store_error)?;
        if missing.is_empty() {
            // Nothing to add: no `ALTER TABLE`, whose lock would queue behind every open write.
            // A sequence never used yet (the canonical DDL created it over a table an earlier
            // release had leased on) still starts above the tokens there.
            sqlx::raw_sql(AssertSqlSafe(sequence_start(self.table())))
                .execute(self.pool())
                .await
                .map_err(store_error)?;
            return Ok(());
        }
        if let Err(error) = sqlx::raw_sql(AssertSqlSafe(lease_ddl(self.table())))
            .execute(self.pool())
            .await
        {
            // Without the rights to alter the table (a service on `schema.mode: validate`),
            // say what the migrations should have added.
            let missing: Vec<String> = missing.iter().map(ToString::to_string).collect();
            tracing::error!(
                table = %self.table(),
                missing = %missing.join("; "),
                %error,
                "leased claims need what the table lacks; apply \
                 migrations/20261205000001_idempotency_leases.sql"
            );
            return Err(store_error(error));
        }
        Ok(())
    }

    async fn claim_leased(
        &self,
        claim: &Claim<'_>,
        lease: Duration,
    ) -> Result<LeaseClaim, StoreError> {
        // Insert with a new token from the sequence, or take over an expired lease of the same
        // request (same fingerprint) with a new token. A live lease, a terminal record or
        // another fingerprint leave the row as it is and return nothing. `prior` tells a
        // takeover from an insert. The record expires no earlier than its lease ends, so
        // cleanup never deletes a live claim; without a TTL it never expires (`GREATEST`
        // would skip the NULL).
        let upsert = self.lease_sql(|t, seq| {
            let expires = "CASE WHEN $5::interval IS NULL THEN NULL \
                           ELSE GREATEST(now() + $5, clock_timestamp() + $6) END";
            format!(
                "WITH prior AS (SELECT 1 FROM {t} WHERE {KEY}) \
                 INSERT INTO {t} (operation, scope, idempotency_key, request_hash, status, \
                                  created_at, expires_at, lease_token, lease_expires_at) \
                 VALUES ($1, $2, $3, $4, 'PROCESSING', now(), {expires}, nextval('{seq}'), \
                         clock_timestamp() + $6) \
                 ON CONFLICT (operation, scope, idempotency_key) DO UPDATE \
                 SET lease_token = nextval('{seq}'), \
                     lease_expires_at = clock_timestamp() + $6, \
                     expires_at = {expires} \
                 WHERE {t}.status = 'PROCESSING' AND {t}.lease_token IS NOT NULL \
                   AND {t}.lease_expires_at <= clock_timestamp() AND {t}.request_hash = $4 \
                 RETURNING lease_token, EXISTS (SELECT 1 FROM prior)"
            )
        });
        let left = self.lease_sql(|t, _| {
            format!(
                "SELECT EXTRACT(EPOCH FROM GREATEST(lease_expires_at - clock_timestamp(), \
                 interval '0'))::float8 FROM {t} WHERE {KEY} AND status = 'PROCESSING'"
            )
        });
        let id = claim.id;
        for _ in 0..CLAIM_ROUNDS {
            let mut own = self.own().await?;
            let token: Option<(i64, bool)> = sqlx::query_as(upsert.clone())
                .persistent(self.persistent())
                .bind(id.operation.as_str())
                .bind(id.scope.as_str())
                .bind(id.key.as_str())
                .bind(claim.fingerprint.as_str())
                .bind(claim.ttl.map(interval))
                .bind(interval(lease))
                .fetch_optional(&mut *own)
                .await
                .map_err(store_error)?;
            own.finish().await.map_err(store_error)?;
            if let Some((token, takeover)) = token {
                return Ok(LeaseClaim::Acquired {
                    token: FencingToken(token),
                    takeover,
                });
            }
            let Some(record) = self.lookup(id).await? else {
                continue; // released or deleted in between: claim again
            };
            let lease_left = if record.is_terminal() {
                None
            } else {
                let mut own = self.own().await?;
                let seconds: Option<Option<f64>> = sqlx::query_scalar(left.clone())
                    .persistent(self.persistent())
                    .bind(id.operation.as_str())
                    .bind(id.scope.as_str())
                    .bind(id.key.as_str())
                    .fetch_optional(&mut *own)
                    .await
                    .map_err(store_error)?;
                own.finish().await.map_err(store_error)?;
                let seconds = seconds.flatten().unwrap_or(0.0).max(0.0);
                Some(Duration::try_from_secs_f64(seconds).unwrap_or(Duration::ZERO))
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
                "UPDATE {t} SET status = $5, result_payload = $6::json, error_code = $7, \
                     completed_at = clock_timestamp(), lease_expires_at = NULL, \
                     trace_id = $8, span_id = $9 \
                 WHERE {KEY} AND status = 'PROCESSING' AND lease_token = $4"
            )
        });
        let (payload, code) = outcome.to_columns();
        let (trace_id, span_id) = super::row::span_columns(execution_span);
        let mut own = self.own().await?;
        let updated = sqlx::query(sql)
            .persistent(self.persistent())
            .bind(id.operation.as_str())
            .bind(id.scope.as_str())
            .bind(id.key.as_str())
            .bind(token.0)
            .bind(outcome.status().as_str())
            .bind(payload)
            .bind(code)
            .bind(trace_id)
            .bind(span_id)
            .execute(&mut *own)
            .await
            .map_err(store_error)?;
        own.finish().await.map_err(store_error)?;
        if updated.rows_affected() == 0 {
            return Ok(None);
        }
        self.lookup(id).await
    }

    async fn release_leased(&self, id: &RecordId, token: FencingToken) -> Result<bool, StoreError> {
        let sql = self.lease_sql(|t, _| {
            format!("DELETE FROM {t} WHERE {KEY} AND status = 'PROCESSING' AND lease_token = $4")
        });
        let mut own = self.own().await?;
        let deleted = sqlx::query(sql)
            .persistent(self.persistent())
            .bind(id.operation.as_str())
            .bind(id.scope.as_str())
            .bind(id.key.as_str())
            .bind(token.0)
            .execute(&mut *own)
            .await
            .map_err(store_error)?;
        own.finish().await.map_err(store_error)?;
        Ok(deleted.rows_affected() > 0)
    }
}
