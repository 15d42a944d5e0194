//! The SPI implementations of [`PgOutbox`].

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::outbox::PgOutbox;
use crate::outbox::error::outbox_error;
use crate::outbox::listen::PgNotificationListener;
use crate::outbox::partitions::{self, Expiry};
use crate::pooler::Own;
use idempotency_outbox::Error;
use idempotency_outbox::config::Ordering;
use idempotency_outbox::store::{
    ClaimRequest, Claimed, DeadLetters, Enqueue, Failure, Housekeeping, OutboxStats, RelayStore,
};
use idempotency_outbox::{DeadLetter, NewEvent, OutboxMessage};

pub(crate) type MessageRow = (
    Uuid,
    String,
    String,
    Option<i64>,
    String,
    String,
    String,
    DateTime<Utc>,
    i32,
    f64,
);

pub(crate) fn message(row: MessageRow) -> Result<OutboxMessage, Error> {
    let (
        id,
        aggregate_type,
        aggregate_id,
        sequence,
        event_type,
        payload,
        headers,
        created_at,
        attempts,
        age,
    ) = row;
    let headers: BTreeMap<String, String> =
        serde_json::from_str(&headers).map_err(|e| Error::Corrupt {
            reason: format!("headers of {id} are not a JSON object of strings: {e}"),
        })?;
    Ok(OutboxMessage::new(
        id,
        aggregate_type,
        aggregate_id,
        sequence,
        event_type,
        payload,
        headers,
        created_at,
        u32::try_from(attempts).unwrap_or_default(),
    )
    .with_age_at_claim(age))
}

fn limit(n: u32) -> i64 {
    i64::from(n)
}

/// The ordered claim's transaction: it may use neither a sort nor a sequential scan. The claim
/// is written as index probes and bounded index ranges (see `statements::claim_ordered`);
/// these settings keep the planner from choosing anything else for them whatever the
/// statistics say.
///
/// Without statistics (a table never analysed: a burst before autovacuum's first `ANALYZE`)
/// both partial indexes look almost empty, their costs tie, and the planner may look a head
/// up through the pending index and a sort: a scan of the whole backlog for every candidate
/// (a claim on a 60,000-row backlog ran for over ten minutes). A plan cached while the table
/// was small can do the same, so the claim is planned again at every call (an unnamed
/// statement; half a millisecond, several on a partitioned outbox, which plans every
/// partition). Both settings end with the transaction; the `BEGIN` carries them, so the
/// claim costs two round trips more than a bare statement: `BEGIN`, the claim, `COMMIT`.
///
/// READ COMMITTED whatever `default_transaction_isolation` says (see
/// [`Own::read_committed`](crate::pooler::Own::read_committed)).
const INDEX_BOUNDED: &str = "BEGIN ISOLATION LEVEL READ COMMITTED; \
                             SET LOCAL enable_sort = off; SET LOCAL enable_seqscan = off";

/// A claimed row: the message, then where the ordered claim's walk over the aggregates found
/// it (its lap and its place in that lap; `NULL` for a row from the window, and in the
/// unordered claim).
type ClaimRow = (
    Uuid,
    String,
    String,
    Option<i64>,
    String,
    String,
    String,
    DateTime<Utc>,
    i32,
    f64,
    Option<i32>,
    Option<i64>,
);

type ClaimQuery = sqlx::query::QueryAs<
    'static,
    sqlx::Postgres,
    ClaimRow,
    <sqlx::Postgres as sqlx::Database>::Arguments,
>;

fn claim_query(sql: sqlx::SqlStr, persistent: bool, request: &ClaimRequest) -> ClaimQuery {
    sqlx::query_as(sql)
        .persistent(persistent)
        .bind(limit(request.limit))
        .bind(request.lease)
        .bind(request.token)
        .bind(i32::try_from(request.max_attempts).unwrap_or(i32::MAX))
}

/// Where the next ordered claim starts its walk over the aggregates: after the last
/// aggregate the previous walk handed a row out of, so that every aggregate gets its turn
/// (the walk runs in key order, and stops once it has a batch). Shared by the clones of an
/// outbox, so by every worker of a relay; `None` until a walk handed something out.
#[derive(Debug, Default)]
pub(crate) struct WalkStart(std::sync::Mutex<Option<(String, String)>>);

impl WalkStart {
    /// The aggregate to start after (`''`, `''`: from the first).
    fn get(&self) -> (String, String) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
            .unwrap_or_default()
    }

    /// Moves the start after the last aggregate of `rows` that the walk found, if any.
    fn advance(&self, rows: &[ClaimRow]) {
        let last = rows
            .iter()
            .filter_map(|row| Some(((row.10?, row.11?), row)))
            .max_by_key(|(place, _)| *place);
        if let Some((_, row)) = last {
            *self
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) =
                Some((row.1.clone(), row.2.clone()));
        }
    }
}

fn claimed(row: ClaimRow) -> Result<OutboxMessage, Error> {
    let (a, b, c, d, e, f, g, h, i, j, _, _) = row;
    message((a, b, c, d, e, f, g, h, i, j))
}

impl Enqueue for PgOutbox {
    type Connection = PgConnection;

    async fn enqueue_all(
        &self,
        conn: &mut PgConnection,
        events: &[NewEvent],
    ) -> Result<Vec<Uuid>, Error> {
        PgOutbox::enqueue_all(self, conn, events).await
    }
}

impl RelayStore for PgOutbox {
    type Listener = PgNotificationListener;

    async fn claim(&self, request: &ClaimRequest) -> Result<Claimed, Error> {
        let rows: Vec<ClaimRow> = match request.ordering {
            Ordering::Ordered => {
                // In a transaction of its own that rules out plans that are not index-bounded
                // (`INDEX_BOUNDED`), planned again at every call (an unnamed statement).
                let (after_type, after_id) = self.walk_start.get();
                let mut tx = crate::begin::begin_with(&self.pool, INDEX_BOUNDED)
                    .await
                    .map_err(outbox_error)?;
                let rows = claim_query(self.sql.claim_ordered.clone(), false, request)
                    .bind(after_type)
                    .bind(after_id)
                    .fetch_all(&mut *tx)
                    .await
                    .map_err(outbox_error)?;
                tx.commit().await.map_err(outbox_error)?;
                self.walk_start.advance(&rows);
                rows
            }
            Ordering::Unordered => {
                // READ COMMITTED: a row another worker leased after the claim's snapshot is
                // skipped, not a serialization failure (the `BEGIN` and `COMMIT` round trips
                // are per batch, not per message).
                let mut own = Own::read_committed(&self.pool)
                    .await
                    .map_err(outbox_error)?;
                let rows =
                    claim_query(self.sql.claim_unordered.clone(), self.persistent(), request)
                        .fetch_all(&mut *own)
                        .await
                        .map_err(outbox_error)?;
                own.finish().await.map_err(outbox_error)?;
                rows
            }
        };
        let messages = rows
            .into_iter()
            .map(claimed)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Claimed::split(messages, request.max_attempts))
    }

    async fn mark_published(&self, token: Uuid, ids: &[Uuid]) -> Result<u64, Error> {
        let mut own = self.own().await?;
        let marked = sqlx::query(self.sql.mark_published.clone())
            .persistent(self.persistent())
            .bind(ids)
            .bind(token)
            .execute(&mut *own)
            .await
            .map_err(outbox_error)?
            .rows_affected();
        own.finish().await.map_err(outbox_error)?;
        Ok(marked)
    }

    async fn mark_failed(&self, token: Uuid, failures: &[Failure]) -> Result<u64, Error> {
        let ids: Vec<Uuid> = failures.iter().map(|f| f.id).collect();
        // PostgreSQL's text refuses NUL (`22021`): one in any text would fail the whole mark.
        let cleaned: Vec<Option<String>> = failures
            .iter()
            .map(|f| {
                f.error
                    .contains('\0')
                    .then(|| f.error.replace('\0', "\u{fffd}"))
            })
            .collect();
        let errors: Vec<&str> = failures
            .iter()
            .zip(&cleaned)
            .map(|(f, cleaned)| cleaned.as_deref().unwrap_or(f.error.as_str()))
            .collect();
        let delays: Vec<i64> = failures
            .iter()
            .map(|f| i64::try_from(f.retry_in.as_micros()).unwrap_or(i64::MAX))
            .collect();
        let dead: Vec<bool> = failures.iter().map(|f| f.dead_letter).collect();
        let transient: Vec<bool> = failures.iter().map(|f| f.transient).collect();
        let mut own = self.own().await?;
        let marked = sqlx::query(self.sql.mark_failed.clone())
            .persistent(self.persistent())
            .bind(&ids)
            .bind(&errors)
            .bind(&delays)
            .bind(&dead)
            .bind(token)
            .bind(&transient)
            .execute(&mut *own)
            .await
            .map_err(outbox_error)?
            .rows_affected();
        own.finish().await.map_err(outbox_error)?;
        Ok(marked)
    }

    async fn listen(&self) -> Result<Option<PgNotificationListener>, Error> {
        let Some(channel) = &self.channel else {
            return Ok(None);
        };
        let pool = match (&self.listen_pool, self.pooler) {
            (Some(pool), _) => pool,
            (None, crate::Pooler::Transaction) => {
                tracing::warn!(
                    channel = channel.as_str(),
                    "the outbox's pool is behind a pooler in transaction mode, where LISTEN \
                     does not hold: no wake-up by notification, the relay polls (give the \
                     outbox a direct pool with `with_listen_pool`)"
                );
                return Ok(None);
            }
            (None, _) => &self.pool,
        };
        PgNotificationListener::connect(pool, channel)
            .await
            .map(Some)
    }
}

impl Housekeeping for PgOutbox {
    async fn stats(&self) -> Result<OutboxStats, Error> {
        let mut own = self.own().await?;
        let (pending, age, dead): (i64, f64, i64) = sqlx::query_as(self.sql.stats.clone())
            .persistent(self.persistent())
            .fetch_one(&mut *own)
            .await
            .map_err(outbox_error)?;
        own.finish().await.map_err(outbox_error)?;
        Ok(OutboxStats::new(
            u64::try_from(pending).unwrap_or_default(),
            age,
            u64::try_from(dead).unwrap_or_default(),
        ))
    }

    async fn delete_published(&self, older_than: Duration, limit_: u32) -> Result<u64, Error> {
        if self.partitioning.is_some() {
            return partitions::delete_expired_rows(
                &self.pool,
                self.pooler,
                &self.table,
                Expiry::Published,
                older_than,
                limit_,
            )
            .await;
        }
        let mut own = Own::read_committed(&self.pool)
            .await
            .map_err(outbox_error)?;
        let deleted = sqlx::query(self.sql.delete_published.clone())
            .persistent(self.persistent())
            .bind(older_than)
            .bind(limit(limit_))
            .execute(&mut *own)
            .await
            .map_err(outbox_error)?
            .rows_affected();
        own.finish().await.map_err(outbox_error)?;
        Ok(deleted)
    }

    async fn delete_dead_lettered(&self, older_than: Duration, limit_: u32) -> Result<u64, Error> {
        if self.partitioning.is_some() {
            return partitions::delete_expired_rows(
                &self.pool,
                self.pooler,
                &self.table,
                Expiry::DeadLettered,
                older_than,
                limit_,
            )
            .await;
        }
        let mut own = Own::read_committed(&self.pool)
            .await
            .map_err(outbox_error)?;
        let deleted = sqlx::query(self.sql.delete_dead_lettered.clone())
            .persistent(self.persistent())
            .bind(older_than)
            .bind(limit(limit_))
            .execute(&mut *own)
            .await
            .map_err(outbox_error)?
            .rows_affected();
        own.finish().await.map_err(outbox_error)?;
        Ok(deleted)
    }

    async fn prepare_storage(&self) -> Result<u32, Error> {
        self.prepare_partitions().await
    }

    async fn drop_expired(
        &self,
        published: Duration,
        dead_lettered: Option<Duration>,
    ) -> Result<u32, Error> {
        self.drop_expired_partitions(published, dead_lettered).await
    }
}

pub(crate) type DeadLetterRow = (
    Uuid,
    String,
    String,
    Option<i64>,
    String,
    String,
    String,
    DateTime<Utc>,
    i32,
    f64,
    Option<String>,
    DateTime<Utc>,
);

/// A dead letter from its row.
pub(crate) fn dead_letter(row: DeadLetterRow) -> Result<DeadLetter, Error> {
    let (a, b, c, d, e, f, g, h, i, j, last_error, at) = row;
    Ok(DeadLetter::new(
        message((a, b, c, d, e, f, g, h, i, j))?,
        last_error,
        at,
    ))
}

impl DeadLetters for PgOutbox {
    async fn dead_letters(&self, limit_: u32) -> Result<Vec<DeadLetter>, Error> {
        let mut own = self.own().await?;
        let rows: Vec<DeadLetterRow> = sqlx::query_as(self.sql.dead_letters.clone())
            .persistent(self.persistent())
            .bind(limit(limit_))
            .fetch_all(&mut *own)
            .await
            .map_err(outbox_error)?;
        own.finish().await.map_err(outbox_error)?;
        rows.into_iter().map(dead_letter).collect()
    }

    async fn requeue(&self, ids: &[Uuid]) -> Result<u64, Error> {
        let mut own = self.own().await?;
        let late: Vec<Uuid> = sqlx::query_scalar(self.sql.published_after.clone())
            .persistent(self.persistent())
            .bind(ids)
            .fetch_all(&mut *own)
            .await
            .map_err(outbox_error)?;
        own.finish().await.map_err(outbox_error)?;
        if !late.is_empty() {
            return Err(Error::RequeueOutOfOrder { ids: late });
        }
        let mut own = self.own().await?;
        let requeued = sqlx::query(self.sql.requeue.clone())
            .persistent(self.persistent())
            .bind(ids)
            .execute(&mut *own)
            .await
            .map_err(outbox_error)?
            .rows_affected();
        own.finish().await.map_err(outbox_error)?;
        Ok(requeued)
    }
}

impl PgOutbox {
    /// A connection for a statement on its own (see [`Own`]).
    pub(crate) async fn own(&self) -> Result<Own, Error> {
        Own::open(&self.pool, self.pooler)
            .await
            .map_err(outbox_error)
    }
}
