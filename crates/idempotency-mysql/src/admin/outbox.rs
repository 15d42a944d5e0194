//! [`OutboxAdmin`] for [`MysqlOutbox`].

use std::time::Duration;

use idempotency_outbox::admin::{DeadLetterFilter, ExpiredCounts, OutboxAdmin, OutboxStatus};
use idempotency_outbox::{DeadLetter, Error};
use sqlx::AssertSqlSafe;
use uuid::Uuid;

use crate::CHUNK;
use crate::MysqlOutbox;
use crate::clock::{NOW, micros};
use crate::outbox::outbox_error;
use crate::outbox::row::{DeadLetterRow, dead_letter};
use crate::outbox::statements::MESSAGE_COLUMNS;

const PENDING: &str = "published_at IS NULL AND dead_lettered_at IS NULL";

/// The filter's conditions on `o`: each value is bound twice.
const FILTER: &str = "o.dead_lettered_at IS NOT NULL \
     AND (? IS NULL OR o.aggregate_type = ?) \
     AND (? IS NULL OR o.aggregate_id = ?) \
     AND (? IS NULL OR o.event_type = ?)";

fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or_default()
}

type Query<'q, O> = sqlx::query::QueryAs<'q, sqlx::MySql, O, sqlx::mysql::MySqlArguments>;

fn bind_filter<'q, O>(mut query: Query<'q, O>, filter: &'q DeadLetterFilter) -> Query<'q, O> {
    for value in [
        &filter.aggregate_type,
        &filter.aggregate_id,
        &filter.event_type,
    ] {
        query = query.bind(value.as_deref()).bind(value.as_deref());
    }
    query
}

impl OutboxAdmin for MysqlOutbox {
    async fn status(&self) -> Result<OutboxStatus, Error> {
        let t = self.table().quoted();
        // The blocked aggregates in one pass: each aggregate's first and last pending sequence,
        // then its head by the aggregate index (not two correlated subqueries per failing row;
        // PERFORMANCE.md).
        let (pending, age, leased, dead, dead_aggregates, blocked): (i64, f64, i64, i64, i64, i64) =
            sqlx::query_as(AssertSqlSafe(format!(
                "SELECT \
                   (SELECT count(*) FROM {t} WHERE {PENDING}), \
                   (SELECT COALESCE(TIMESTAMPDIFF(MICROSECOND, MIN(created_at), {NOW}) / 1e6, 0e0) \
                        FROM {t} WHERE {PENDING}), \
                   (SELECT count(*) FROM {t} WHERE {PENDING} AND claim_token IS NOT NULL \
                        AND next_attempt_at > {NOW}), \
                   (SELECT count(*) FROM {t} WHERE dead_lettered_at IS NOT NULL), \
                   (SELECT count(DISTINCT aggregate_type, aggregate_id) FROM {t} \
                        WHERE dead_lettered_at IS NOT NULL), \
                   (SELECT count(*) FROM \
                        (SELECT aggregate_type, aggregate_id, MIN(sequence) AS head FROM {t} \
                         WHERE {PENDING} AND sequence IS NOT NULL \
                         GROUP BY aggregate_type, aggregate_id \
                         HAVING MAX(sequence) > MIN(sequence)) AS a \
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
        let sql = format!(
            "SELECT {MESSAGE_COLUMNS}, o.last_error, o.dead_lettered_at FROM {t} AS o \
             WHERE {FILTER} ORDER BY o.dead_lettered_at, o.id LIMIT ?"
        );
        let rows: Vec<DeadLetterRow> = bind_filter(sqlx::query_as(AssertSqlSafe(sql)), filter)
            .bind(i64::from(limit))
            .fetch_all(self.pool())
            .await
            .map_err(outbox_error)?;
        rows.into_iter().map(dead_letter).collect()
    }

    async fn dead_letter(&self, id: Uuid) -> Result<Option<DeadLetter>, Error> {
        let t = self.table().quoted();
        let row: Option<DeadLetterRow> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT {MESSAGE_COLUMNS}, o.last_error, o.dead_lettered_at FROM {t} AS o \
             WHERE o.id = ? AND o.dead_lettered_at IS NOT NULL"
        )))
        .bind(id)
        .fetch_optional(self.pool())
        .await
        .map_err(outbox_error)?;
        row.map(dead_letter).transpose()
    }

    async fn dead_letter_ids(&self, filter: &DeadLetterFilter) -> Result<Vec<Uuid>, Error> {
        let t = self.table().quoted();
        let sql =
            format!("SELECT o.id FROM {t} AS o WHERE {FILTER} ORDER BY o.dead_lettered_at, o.id");
        let rows: Vec<(Uuid,)> = bind_filter(sqlx::query_as(AssertSqlSafe(sql)), filter)
            .fetch_all(self.pool())
            .await
            .map_err(outbox_error)?;
        Ok(rows.into_iter().map(|(id,)| id).collect())
    }

    async fn expired_counts(
        &self,
        published: Duration,
        dead_lettered: Option<Duration>,
    ) -> Result<ExpiredCounts, Error> {
        let t = self.table().quoted();
        let (published, dead): (i64, i64) = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT (SELECT count(*) FROM {t} \
                         WHERE published_at < {NOW} - INTERVAL ? MICROSECOND), \
                    (SELECT count(*) FROM {t} WHERE ? IS NOT NULL \
                         AND dead_lettered_at < {NOW} - INTERVAL ? MICROSECOND)"
        )))
        .bind(micros(published))
        .bind(dead_lettered.map(micros))
        .bind(dead_lettered.map(micros))
        .fetch_one(self.pool())
        .await
        .map_err(outbox_error)?;
        Ok(ExpiredCounts::new(count(published), count(dead)))
    }

    async fn discard(&self, ids: &[Uuid]) -> Result<u64, Error> {
        let t = self.table().quoted();
        let mut deleted = 0;
        for chunk in ids.chunks(CHUNK) {
            let marks = vec!["?"; chunk.len()].join(", ");
            let mut query = sqlx::query(AssertSqlSafe(format!(
                "DELETE FROM {t} WHERE dead_lettered_at IS NOT NULL AND id IN ({marks})"
            )));
            for id in chunk {
                query = query.bind(id);
            }
            deleted += query
                .execute(self.pool())
                .await
                .map_err(outbox_error)?
                .rows_affected();
        }
        Ok(deleted)
    }
}
