//! [`OutboxAdmin`] for [`PgOutbox`], plain or time-partitioned (the statements name the
//! parent table, which reaches every partition).

use std::time::Duration;

use idempotency_outbox::admin::{DeadLetterFilter, ExpiredCounts, OutboxAdmin, OutboxStatus};
use idempotency_outbox::{DeadLetter, Error};
use sqlx::AssertSqlSafe;
use uuid::Uuid;

use crate::PgOutbox;
use crate::outbox::error::outbox_error;
use crate::outbox::statements::MESSAGE_COLUMNS;
use crate::outbox::store::{DeadLetterRow, dead_letter};
use crate::pooler::persistent;

const PENDING: &str = "published_at IS NULL AND dead_lettered_at IS NULL";

/// The filter's conditions on `o`, binding `$1..$3`.
const FILTER: &str = "o.dead_lettered_at IS NOT NULL \
     AND ($1::text IS NULL OR o.aggregate_type = $1) \
     AND ($2::text IS NULL OR o.aggregate_id = $2) \
     AND ($3::text IS NULL OR o.event_type = $3)";

fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or_default()
}

impl OutboxAdmin for PgOutbox {
    async fn status(&self) -> Result<OutboxStatus, Error> {
        let t = self.table().quoted();
        let mut own = self.own().await?;
        let (pending, age, leased, dead, dead_aggregates): (i64, f64, i64, i64, i64) =
            sqlx::query_as(AssertSqlSafe(format!(
                "SELECT count(*) FILTER (WHERE dead_lettered_at IS NULL), \
                        COALESCE(EXTRACT(EPOCH FROM clock_timestamp() - \
                            min(created_at) FILTER (WHERE dead_lettered_at IS NULL)), 0)::float8, \
                        count(*) FILTER (WHERE dead_lettered_at IS NULL \
                            AND claim_token IS NOT NULL AND next_attempt_at > clock_timestamp()), \
                        count(*) FILTER (WHERE dead_lettered_at IS NOT NULL), \
                        count(DISTINCT (aggregate_type, aggregate_id)) \
                            FILTER (WHERE dead_lettered_at IS NOT NULL) \
                 FROM {t} WHERE published_at IS NULL"
            )))
            .persistent(persistent(self.pooler()))
            .fetch_one(&mut *own)
            .await
            .map_err(outbox_error)?;
        // One pass over the pending rows: each aggregate's first and last pending sequence, then
        // its head row by the aggregate index. Not a pair of correlated subqueries per failing
        // row: planned as hash joins with the sequence comparison as a join filter, quadratic in
        // an aggregate's backlog (PERFORMANCE.md; the facade's tests/admin.rs keeps that query
        // as the reference the counts are compared with).
        let blocked: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT count(*) FROM \
                 (SELECT aggregate_type, aggregate_id, min(sequence) AS head FROM {t} \
                  WHERE {PENDING} AND sequence IS NOT NULL \
                  GROUP BY aggregate_type, aggregate_id \
                  HAVING max(sequence) > min(sequence)) a \
             JOIN {t} h ON h.aggregate_type = a.aggregate_type \
                 AND h.aggregate_id = a.aggregate_id AND h.sequence = a.head \
             WHERE h.published_at IS NULL AND h.dead_lettered_at IS NULL \
               AND h.last_error IS NOT NULL AND h.claim_token IS NULL"
        )))
        .persistent(persistent(self.pooler()))
        .fetch_one(&mut *own)
        .await
        .map_err(outbox_error)?;
        own.finish().await.map_err(outbox_error)?;
        Ok(OutboxStatus::new(
            count(pending),
            age,
            count(leased),
            count(dead),
            count(dead_aggregates),
            count(blocked),
        ))
    }

    async fn find_dead_letters(
        &self,
        filter: &DeadLetterFilter,
        limit: u32,
    ) -> Result<Vec<DeadLetter>, Error> {
        let t = self.table().quoted();
        let mut own = self.own().await?;
        let rows: Vec<DeadLetterRow> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT {MESSAGE_COLUMNS}, o.last_error::text, o.dead_lettered_at FROM {t} o \
             WHERE {FILTER} ORDER BY o.dead_lettered_at, o.id LIMIT $4"
        )))
        .persistent(persistent(self.pooler()))
        .bind(filter.aggregate_type.as_deref())
        .bind(filter.aggregate_id.as_deref())
        .bind(filter.event_type.as_deref())
        .bind(i64::from(limit))
        .fetch_all(&mut *own)
        .await
        .map_err(outbox_error)?;
        own.finish().await.map_err(outbox_error)?;
        rows.into_iter().map(dead_letter).collect()
    }

    async fn dead_letter(&self, id: Uuid) -> Result<Option<DeadLetter>, Error> {
        let t = self.table().quoted();
        let mut own = self.own().await?;
        let row: Option<DeadLetterRow> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT {MESSAGE_COLUMNS}, o.last_error::text, o.dead_lettered_at FROM {t} o \
             WHERE o.id = $1 AND o.dead_lettered_at IS NOT NULL"
        )))
        .persistent(persistent(self.pooler()))
        .bind(id)
        .fetch_optional(&mut *own)
        .await
        .map_err(outbox_error)?;
        own.finish().await.map_err(outbox_error)?;
        row.map(dead_letter).transpose()
    }

    async fn dead_letter_ids(&self, filter: &DeadLetterFilter) -> Result<Vec<Uuid>, Error> {
        let t = self.table().quoted();
        let mut own = self.own().await?;
        let ids = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT o.id FROM {t} o WHERE {FILTER} ORDER BY o.dead_lettered_at, o.id"
        )))
        .persistent(persistent(self.pooler()))
        .bind(filter.aggregate_type.as_deref())
        .bind(filter.aggregate_id.as_deref())
        .bind(filter.event_type.as_deref())
        .fetch_all(&mut *own)
        .await
        .map_err(outbox_error)?;
        own.finish().await.map_err(outbox_error)?;
        Ok(ids)
    }

    async fn expired_counts(
        &self,
        published: Duration,
        dead_lettered: Option<Duration>,
    ) -> Result<ExpiredCounts, Error> {
        let t = self.table().quoted();
        let mut own = self.own().await?;
        let (published, dead): (i64, i64) = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT count(*) FILTER (WHERE published_at < clock_timestamp() - $1), \
                    count(*) FILTER (WHERE dead_lettered_at < clock_timestamp() - $2::interval) \
             FROM {t} WHERE published_at IS NOT NULL OR dead_lettered_at IS NOT NULL"
        )))
        .persistent(persistent(self.pooler()))
        .bind(published)
        .bind(dead_lettered)
        .fetch_one(&mut *own)
        .await
        .map_err(outbox_error)?;
        own.finish().await.map_err(outbox_error)?;
        Ok(ExpiredCounts::new(count(published), count(dead)))
    }

    async fn discard(&self, ids: &[Uuid]) -> Result<u64, Error> {
        let t = self.table().quoted();
        let mut own = self.own().await?;
        let deleted = sqlx::query(AssertSqlSafe(format!(
            "DELETE FROM {t} WHERE id = ANY($1) AND dead_lettered_at IS NOT NULL"
        )))
        .persistent(persistent(self.pooler()))
        .bind(ids)
        .execute(&mut *own)
        .await
        .map_err(outbox_error)?
        .rows_affected();
        own.finish().await.map_err(outbox_error)?;
        Ok(deleted)
    }
}
