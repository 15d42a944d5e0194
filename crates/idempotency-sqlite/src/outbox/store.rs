//! The SPI implementations of [`SqliteOutbox`]: what the relay and operators call.

use std::time::Duration;

use idempotency_outbox::config::Ordering;
use idempotency_outbox::store::{
    ClaimRequest, Claimed, DeadLetters, Enqueue, Failure, Housekeeping, NoNotifications,
    OutboxStats, RelayStore,
};
use idempotency_outbox::{DeadLetter, Error, NewEvent};
use sqlx::SqliteConnection;
use uuid::Uuid;

use super::SqliteOutbox;
use super::error::outbox_error;
use super::row::{self, DeadLetterRow, MessageRow};
use crate::connect::BEGIN_IMMEDIATE;

impl Enqueue for SqliteOutbox {
    type Connection = SqliteConnection;

    async fn enqueue_all(
        &self,
        conn: &mut SqliteConnection,
        events: &[NewEvent],
    ) -> Result<Vec<Uuid>, Error> {
        SqliteOutbox::enqueue_all(self, conn, events).await
    }
}

/// How many due rows an ordered claim looks at before it walks the aggregates instead, on
/// top of its batch size: enough to fill a batch when most due rows are first of their
/// aggregate, few enough that a claim behind one aggregate's long backlog stays short.
const CLAIM_WINDOW: i64 = 256;

impl SqliteOutbox {
    /// The ids an ordered claim hands out (a JSON array, at most `limit`), under the caller's
    /// write lock. First the oldest `limit + CLAIM_WINDOW` due rows: when they hold `limit`
    /// rows that are first of their aggregate, or are all the due rows there are, those are the
    /// answer. Otherwise (a full window of rows waiting behind their aggregate's first) one
    /// walk over the aggregates with pending rows, an index probe or two each. Either way the
    /// cost does not grow with an aggregate's backlog, which the scan of every due row did.
    async fn ordered_candidates(
        &self,
        conn: &mut SqliteConnection,
        limit: u32,
    ) -> Result<String, Error> {
        let limit = i64::from(limit);
        let window = limit + CLAIM_WINDOW;
        let (seen, ids, found): (i64, String, i64) = sqlx::query_as(self.sql.claim_window.clone())
            .bind(limit)
            .bind(window)
            .fetch_one(&mut *conn)
            .await
            .map_err(outbox_error)?;
        if seen < window || found >= limit {
            return Ok(ids);
        }
        sqlx::query_scalar(self.sql.claim_heads.clone())
            .bind(limit)
            .fetch_one(&mut *conn)
            .await
            .map_err(outbox_error)
    }
}

impl RelayStore for SqliteOutbox {
    type Listener = NoNotifications;

    /// First a read (WAL: no lock taken or waited for): when no row is due, an idle poll ends
    /// there and request transactions never wait for it. Otherwise a short `BEGIN IMMEDIATE`
    /// transaction: it waits for the write lock (up to the busy timeout), picks the rows (in
    /// ordered mode the first pending row of each aggregate, without reading any aggregate's
    /// backlog row by row: see `ordered_candidates`), sets the lease and the fencing token on
    /// them in one `UPDATE ... RETURNING`, and commits. SQLite has
    /// a single writer, so no other claim can pick the same rows and nothing needs
    /// `SKIP LOCKED`. Messages come back oldest first. The same statement dead-letters the due
    /// rows already claimed `max_attempts` times.
    async fn claim(&self, request: &ClaimRequest) -> Result<Claimed, Error> {
        let due: bool = sqlx::query_scalar(self.sql.any_due.clone())
            .fetch_one(&self.pool)
            .await
            .map_err(outbox_error)?;
        if !due {
            return Ok(Claimed::default());
        }
        let mut tx = self
            .pool
            .begin_with(BEGIN_IMMEDIATE)
            .await
            .map_err(outbox_error)?;
        let query = match request.ordering {
            Ordering::Ordered => {
                let ids = self.ordered_candidates(&mut tx, request.limit).await?;
                sqlx::query_as(self.sql.claim_listed.clone()).bind(ids)
            }
            Ordering::Unordered => {
                sqlx::query_as(self.sql.claim_unordered.clone()).bind(i64::from(request.limit))
            }
        };
        let rows: Vec<MessageRow> = query
            .bind(row::millis(request.lease))
            .bind(request.token.to_string())
            .bind(i64::from(request.max_attempts))
            .fetch_all(&mut *tx)
            .await
            .map_err(outbox_error)?;
        tx.commit().await.map_err(outbox_error)?;
        let mut messages = rows
            .into_iter()
            .map(row::message)
            .collect::<Result<Vec<_>, _>>()?;
        // `RETURNING` order is unspecified; publish oldest first.
        messages.sort_by_key(|m| (m.created_at, m.id));
        Ok(Claimed::split(messages, request.max_attempts))
    }

    async fn mark_published(&self, token: Uuid, ids: &[Uuid]) -> Result<u64, Error> {
        if ids.is_empty() {
            return Ok(0);
        }
        Ok(sqlx::query(self.sql.mark_published.clone())
            .bind(row::ids_json(ids)?)
            .bind(token.to_string())
            .execute(&self.pool)
            .await
            .map_err(outbox_error)?
            .rows_affected())
    }

    async fn mark_failed(&self, token: Uuid, failures: &[Failure]) -> Result<u64, Error> {
        if failures.is_empty() {
            return Ok(0);
        }
        Ok(sqlx::query(self.sql.mark_failed.clone())
            .bind(row::failures_json(failures)?)
            .bind(token.to_string())
            .execute(&self.pool)
            .await
            .map_err(outbox_error)?
            .rows_affected())
    }

    /// Always `None`: SQLite has no `LISTEN`/`NOTIFY`, so relays poll every
    /// `relay.poll-interval` (whatever `relay.wake-up` says).
    async fn listen(&self) -> Result<Option<NoNotifications>, Error> {
        Ok(None)
    }
}

fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or_default()
}

impl Housekeeping for SqliteOutbox {
    /// Three counts through the partial indexes, on a read snapshot (no write lock).
    async fn stats(&self) -> Result<OutboxStats, Error> {
        let (pending, age, dead): (i64, f64, i64) = sqlx::query_as(self.sql.stats.clone())
            .fetch_one(&self.pool)
            .await
            .map_err(outbox_error)?;
        Ok(OutboxStats::new(count(pending), age, count(dead)))
    }

    /// One `DELETE` of at most `limit` rows, its own short write transaction.
    async fn delete_published(&self, older_than: Duration, limit: u32) -> Result<u64, Error> {
        Ok(sqlx::query(self.sql.delete_published.clone())
            .bind(row::millis(older_than))
            .bind(i64::from(limit))
            .execute(&self.pool)
            .await
            .map_err(outbox_error)?
            .rows_affected())
    }

    /// One `DELETE` of at most `limit` rows, its own short write transaction.
    async fn delete_dead_lettered(&self, older_than: Duration, limit: u32) -> Result<u64, Error> {
        Ok(sqlx::query(self.sql.delete_dead_lettered.clone())
            .bind(row::millis(older_than))
            .bind(i64::from(limit))
            .execute(&self.pool)
            .await
            .map_err(outbox_error)?
            .rows_affected())
    }
}

impl DeadLetters for SqliteOutbox {
    async fn dead_letters(&self, limit: u32) -> Result<Vec<DeadLetter>, Error> {
        let rows: Vec<DeadLetterRow> = sqlx::query_as(self.sql.dead_letters.clone())
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await
            .map_err(outbox_error)?;
        rows.into_iter().map(row::dead_letter).collect()
    }

    /// Due now, attempts reset, `last_error` kept until the next failure.
    async fn requeue(&self, ids: &[Uuid]) -> Result<u64, Error> {
        if ids.is_empty() {
            return Ok(0);
        }
        let ids = row::ids_json(ids)?;
        let late: Vec<String> = sqlx::query_scalar(self.sql.published_after.clone())
            .bind(&ids)
            .fetch_all(&self.pool)
            .await
            .map_err(outbox_error)?;
        if !late.is_empty() {
            let late = late
                .iter()
                .map(|id| {
                    Uuid::parse_str(id).map_err(|e| Error::Corrupt {
                        reason: format!("id {id:?} is not a UUID: {e}"),
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            return Err(Error::RequeueOutOfOrder { ids: late });
        }
        Ok(sqlx::query(self.sql.requeue.clone())
            .bind(ids)
            .execute(&self.pool)
            .await
            .map_err(outbox_error)?
            .rows_affected())
    }
}
