//! [`OutboxAdmin`] for [`SqliteOutbox`].

use std::time::Duration;

use idempotency_outbox::admin::{DeadLetterFilter, ExpiredCounts, OutboxAdmin, OutboxStatus};
use idempotency_outbox::{DeadLetter, Error};
use sqlx::AssertSqlSafe;
use uuid::Uuid;

use crate::SqliteOutbox;
use crate::clock::NOW_MS;
use crate::outbox::error::{corrupt, outbox_error};
use crate::outbox::row::{DeadLetterRow, dead_letter, ids_json, millis};
use crate::outbox::statements::MESSAGE_COLUMNS;

const PENDING: &str = "published_at IS NULL AND dead_lettered_at IS NULL";

/// The filter's conditions, binding `?1..?3`.
const FILTER: &str = "dead_lettered_at IS NOT NULL \
     AND (?1 IS NULL OR aggregate_type = ?1) \
     AND (?2 IS NULL OR aggregate_id = ?2) \
     AND (?3 IS NULL OR event_type = ?3)";

fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or_default()
}

impl OutboxAdmin for SqliteOutbox {
    async fn status(&self) -> Result<OutboxStatus, Error> {
        let t = self.table().quoted();
        // The blocked aggregates in one pass: each aggregate's first and last pending sequence,
        // then its head by the aggregate index (not two correlated subqueries per failing row;
        // PERFORMANCE.md).
        let (pending, age, leased, dead, dead_aggregates, blocked): (i64, f64, i64, i64, i64, i64) =
            sqlx::query_as(AssertSqlSafe(format!(
                "SELECT \
                   (SELECT count(*) FROM {t} WHERE {PENDING}), \
                   (SELECT coalesce(max(CAST({NOW_MS} - min(created_at) AS REAL) / 1000.0, 0.0), \
                                    0.0) FROM {t} WHERE {PENDING}), \
                   (SELECT count(*) FROM {t} WHERE {PENDING} AND claim_token IS NOT NULL \
                        AND next_attempt_at > {NOW_MS}), \
                   (SELECT count(*) FROM {t} WHERE dead_lettered_at IS NOT NULL), \
                   (SELECT count(*) FROM (SELECT DISTINCT aggregate_type, aggregate_id FROM {t} \
                        WHERE dead_lettered_at IS NOT NULL)), \
                   (SELECT count(*) FROM \
                        (SELECT aggregate_type, aggregate_id, min(sequence) AS head FROM {t} \
                         WHERE {PENDING} AND sequence IS NOT NULL \
                         GROUP BY aggregate_type, aggregate_id \
                         HAVING max(sequence) > min(sequence)) AS a \
                    JOIN {t} AS h ON h.aggregate_type = a.aggregate_type \
                        AND h.aggregate_id = a.aggregate_id AND h.sequence = a.head \
                    WHERE h.published_at IS NULL AND h.dead_lettered_at IS NULL \
                      AND h.last_error IS NOT NULL AND h.claim_token IS NULL)"
            )))
            .fetch_one(self.pool())
            .await
            .map_err(outbox_error)?;
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
        let rows: Vec<DeadLetterRow> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT {MESSAGE_COLUMNS}, max(CAST({NOW_MS} - created_at AS REAL) / 1000.0, 0.0), \
                    last_error, dead_lettered_at \
             FROM {t} WHERE {FILTER} ORDER BY dead_lettered_at, id LIMIT ?4"
        )))
        .bind(filter.aggregate_type.as_deref())
        .bind(filter.aggregate_id.as_deref())
        .bind(filter.event_type.as_deref())
        .bind(i64::from(limit))
        .fetch_all(self.pool())
        .await
        .map_err(outbox_error)?;
        rows.into_iter().map(dead_letter).collect()
    }

    async fn dead_letter(&self, id: Uuid) -> Result<Option<DeadLetter>, Error> {
        let t = self.table().quoted();
        let row: Option<DeadLetterRow> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT {MESSAGE_COLUMNS}, max(CAST({NOW_MS} - created_at AS REAL) / 1000.0, 0.0), \
                    last_error, dead_lettered_at \
             FROM {t} WHERE id = ?1 AND dead_lettered_at IS NOT NULL"
        )))
        .bind(id.to_string())
        .fetch_optional(self.pool())
        .await
        .map_err(outbox_error)?;
        row.map(dead_letter).transpose()
    }

    async fn dead_letter_ids(&self, filter: &DeadLetterFilter) -> Result<Vec<Uuid>, Error> {
        let t = self.table().quoted();
        let ids: Vec<String> = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT id FROM {t} WHERE {FILTER} ORDER BY dead_lettered_at, id"
        )))
        .bind(filter.aggregate_type.as_deref())
        .bind(filter.aggregate_id.as_deref())
        .bind(filter.event_type.as_deref())
        .fetch_all(self.pool())
        .await
        .map_err(outbox_error)?;
        ids.iter()
            .map(|id| {
                Uuid::parse_str(id).map_err(|e| corrupt(format!("id {id:?} is not a UUID: {e}")))
            })
            .collect()
    }

    async fn expired_counts(
        &self,
        published: Duration,
        dead_lettered: Option<Duration>,
    ) -> Result<ExpiredCounts, Error> {
        let t = self.table().quoted();
        let (published, dead): (i64, i64) = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT (SELECT count(*) FROM {t} WHERE published_at < {NOW_MS} - ?1), \
                    (SELECT count(*) FROM {t} WHERE ?2 IS NOT NULL \
                         AND dead_lettered_at < {NOW_MS} - ?2)"
        )))
        .bind(millis(published))
        .bind(dead_lettered.map(millis))
        .fetch_one(self.pool())
        .await
        .map_err(outbox_error)?;
        Ok(ExpiredCounts::new(count(published), count(dead)))
    }

    async fn discard(&self, ids: &[Uuid]) -> Result<u64, Error> {
        if ids.is_empty() {
            return Ok(0);
        }
        let t = self.table().quoted();
        Ok(sqlx::query(AssertSqlSafe(format!(
            "DELETE FROM {t} WHERE dead_lettered_at IS NOT NULL \
               AND id IN (SELECT value FROM json_each(?1))"
        )))
        .bind(ids_json(ids)?)
        .execute(self.pool())
        .await
        .map_err(outbox_error)?
        .rows_affected())
    }
}
