//! The SPI implementations of [`MysqlOutbox`]: what the relay and operators call.

use std::ops::DerefMut;
use std::time::Duration;

use idempotency_outbox::config::Ordering;
use idempotency_outbox::store::{
    ClaimRequest, Claimed, DeadLetters, Enqueue, Failure, Housekeeping, NoNotifications,
    OutboxStats, RelayStore,
};
use idempotency_outbox::{DeadLetter, Error, NewEvent};
use sqlx::pool::PoolConnection;
use sqlx::{Connection, MySql, MySqlConnection, SqlStr};
use uuid::Uuid;

use super::MysqlOutbox;
use super::error::outbox_error;
use super::row::{self, ClaimRow, DeadLetterRow, MessageRow};
use crate::CHUNK;
use crate::MysqlTransaction;
use crate::clock::micros;
use crate::connect::{self, BEGIN_READ_COMMITTED, begin_read_committed};

impl Enqueue for MysqlOutbox {
    type Connection = MySqlConnection;

    async fn enqueue_all(
        &self,
        conn: &mut MySqlConnection,
        events: &[NewEvent],
    ) -> Result<Vec<Uuid>, Error> {
        MysqlOutbox::enqueue_all(self, conn, events).await
    }
}

/// The transaction a claim runs in: this crate's own ([`MysqlTransaction`]), or sqlx's on the
/// connection that holds the single-relay lock.
trait ClaimTx: DerefMut<Target = MySqlConnection> + Send {
    /// Commits it.
    fn commit(self) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
}

impl ClaimTx for MysqlTransaction {
    fn commit(self) -> impl Future<Output = Result<(), sqlx::Error>> + Send {
        MysqlTransaction::commit(self)
    }
}

impl ClaimTx for sqlx::Transaction<'_, MySql> {
    fn commit(self) -> impl Future<Output = Result<(), sqlx::Error>> + Send {
        sqlx::Transaction::commit(self)
    }
}

/// Marks a pooled connection to be closed, not returned to the pool, when the guard is dropped
/// while still `armed`: a statement on it may have been cut off with its answer on the wire.
struct CloseIfDropped<'a> {
    conn: &'a mut PoolConnection<MySql>,
    armed: bool,
}

impl Drop for CloseIfDropped<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.conn.close_on_drop();
        }
    }
}

impl MysqlOutbox {
    /// One short READ COMMITTED transaction, `tx`: `SELECT ... FOR UPDATE SKIP LOCKED` of
    /// the due rows (rows another claim is taking are passed over, never waited for; READ
    /// COMMITTED takes no gap locks, so enqueuing transactions never wait for a claim), then
    /// one `UPDATE` that leases them, or dead-letters those already claimed `max_attempts`
    /// times.
    async fn claim_on(
        &self,
        mut tx: impl ClaimTx,
        request: &ClaimRequest,
    ) -> Result<Claimed, Error> {
        let sql = match request.ordering {
            Ordering::Ordered => self.sql.claim_ordered.clone(),
            Ordering::Unordered => self.sql.claim_unordered.clone(),
        };
        let candidates: Vec<ClaimRow> = sqlx::query_as(sql)
            .bind(i64::from(request.limit))
            .fetch_all(&mut *tx)
            .await
            .map_err(outbox_error)?;
        // A row a dead relay left unmarked may be the message that kills relays: it is leased
        // alone, so it costs only its own attempts and not those of a whole batch. The other
        // candidates' locks go with the commit.
        let suspect = candidates.iter().position(|row| row.10 != 0);
        let rows: Vec<MessageRow> = candidates
            .into_iter()
            .enumerate()
            .filter(|(i, _)| suspect.is_none_or(|s| s == *i))
            .map(|(_, r)| (r.0, r.1, r.2, r.3, r.4, r.5, r.6, r.7, r.8, r.9))
            .collect();
        if rows.is_empty() {
            tx.commit().await.map_err(outbox_error)?;
            return Ok(Claimed::default());
        }
        let max = i64::from(request.max_attempts);
        let mut lease = sqlx::query(self.sql.lease(rows.len()))
            .bind(max)
            .bind(request.token)
            .bind(max)
            .bind(micros(request.lease))
            .bind(max)
            .bind(max);
        for row in &rows {
            lease = lease.bind(row.0);
        }
        lease.execute(&mut *tx).await.map_err(outbox_error)?;
        tx.commit().await.map_err(outbox_error)?;
        let mut messages = rows
            .into_iter()
            .map(row::claimed)
            .collect::<Result<Vec<_>, _>>()?;
        messages.sort_by_key(|m| (m.created_at, m.id));
        Ok(Claimed::split(messages, request.max_attempts))
    }

    /// Ids of rows `older_than` past `select` (published or dead-lettered), skipping locked
    /// ones, deleted in the same short READ COMMITTED transaction.
    async fn delete_before(
        &self,
        select: SqlStr,
        older_than: Duration,
        limit: u32,
    ) -> Result<u64, Error> {
        let mut tx = begin_read_committed(&self.pool)
            .await
            .map_err(outbox_error)?;
        let ids: Vec<Uuid> = sqlx::query_scalar(select)
            .bind(micros(older_than))
            .bind(i64::from(limit))
            .fetch_all(&mut *tx)
            .await
            .map_err(outbox_error)?;
        let mut deleted = 0;
        for chunk in ids.chunks(CHUNK) {
            let mut delete = sqlx::query(self.sql.delete(chunk.len()));
            for id in chunk {
                delete = delete.bind(id);
            }
            deleted += delete
                .execute(&mut *tx)
                .await
                .map_err(outbox_error)?
                .rows_affected();
        }
        tx.commit().await.map_err(outbox_error)?;
        Ok(deleted)
    }
}

impl RelayStore for MysqlOutbox {
    type Listener = NoNotifications;

    /// See `claim_on`. In the single-relay mode
    /// ([`with_single_relay`](MysqlOutbox::with_single_relay)) the claim runs on the
    /// connection holding `GET_LOCK(name, 0)`, and returns nothing while another process
    /// holds the lock. Messages come back oldest first.
    async fn claim(&self, request: &ClaimRequest) -> Result<Claimed, Error> {
        let Some(single) = &self.single_relay else {
            // Safe to cancel (a worker aborted at the shutdown deadline): a `START TRANSACTION`
            // whose answer nobody reads is rolled back before its connection returns to the
            // pool.
            let tx = begin_read_committed(&self.pool)
                .await
                .map_err(outbox_error)?;
            return self.claim_on(tx, request).await;
        };
        let mut holder = single.holder.lock().await;
        let mut conn = match holder.take() {
            Some(conn) => conn,
            None => {
                let mut conn = self.pool.acquire().await.map_err(outbox_error)?;
                // Until the answer is read, the connection may hold the lock: dropped before
                // that (a worker aborted at the shutdown deadline), or failed, it is closed,
                // not returned to the pool, where it would keep the lock with no relay behind
                // it and every relay's claim would come back empty. The server releases the
                // lock with the session.
                let mut guard = CloseIfDropped {
                    conn: &mut conn,
                    armed: true,
                };
                let taken: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, 0)")
                    .bind(&single.name)
                    .fetch_one(&mut **guard.conn)
                    .await
                    .map_err(outbox_error)?;
                guard.armed = false;
                drop(guard);
                if taken != Some(1) {
                    return Ok(Claimed::default());
                }
                tracing::info!(lock = %single.name, "this relay holds the single-relay lock");
                conn
            }
        };
        // The lock's connection never goes back to the pool. Dropped before the claim ended (a
        // worker aborted at the shutdown deadline), it is closed: a statement cut off on the
        // wire may leave it out of step with the server (see `MysqlTransaction`), and the
        // lock goes with the session, for any relay to take at its next claim.
        let mut guard = CloseIfDropped {
            conn: &mut conn,
            armed: true,
        };
        let claimed = match guard.conn.begin_with(BEGIN_READ_COMMITTED).await {
            Ok(tx) => self.claim_on(tx, request).await,
            Err(error) => Err(outbox_error(error)),
        };
        guard.armed = false;
        drop(guard);
        if claimed.is_ok() {
            *holder = Some(conn);
        } else {
            // The lock may have gone with the session: close the connection (the server
            // releases whatever it held) and compete for the lock again at the next claim.
            let _ = conn.detach().close().await;
        }
        claimed
    }

    async fn mark_published(&self, token: Uuid, ids: &[Uuid]) -> Result<u64, Error> {
        let mut updated = 0;
        for chunk in ids.chunks(CHUNK) {
            let mut query = sqlx::query(self.sql.mark_published(chunk.len())).bind(token);
            for id in chunk {
                query = query.bind(id);
            }
            updated += query
                .execute(&self.pool)
                .await
                .map_err(outbox_error)?
                .rows_affected();
        }
        Ok(updated)
    }

    async fn mark_failed(&self, token: Uuid, failures: &[Failure]) -> Result<u64, Error> {
        if failures.is_empty() {
            return Ok(0);
        }
        let mut tx = connect::begin(&self.pool).await.map_err(outbox_error)?;
        let mut updated = 0;
        for failure in failures {
            updated += sqlx::query(self.sql.mark_failed.clone())
                .bind(&failure.error)
                .bind(micros(failure.retry_in))
                .bind(failure.dead_letter)
                .bind(failure.transient)
                .bind(failure.id)
                .bind(token)
                .execute(&mut *tx)
                .await
                .map_err(outbox_error)?
                .rows_affected();
        }
        tx.commit().await.map_err(outbox_error)?;
        Ok(updated)
    }

    /// `None`: MySQL has no notifications; relays poll.
    async fn listen(&self) -> Result<Option<NoNotifications>, Error> {
        Ok(None)
    }
}

impl Housekeeping for MysqlOutbox {
    async fn stats(&self) -> Result<OutboxStats, Error> {
        let (pending, age, dead): (i64, f64, i64) = sqlx::query_as(self.sql.stats.clone())
            .fetch_one(&self.pool)
            .await
            .map_err(outbox_error)?;
        Ok(OutboxStats::new(
            u64::try_from(pending).unwrap_or_default(),
            age,
            u64::try_from(dead).unwrap_or_default(),
        ))
    }

    async fn delete_published(&self, older_than: Duration, limit: u32) -> Result<u64, Error> {
        self.delete_before(self.sql.published_before.clone(), older_than, limit)
            .await
    }

    async fn delete_dead_lettered(&self, older_than: Duration, limit: u32) -> Result<u64, Error> {
        self.delete_before(self.sql.dead_lettered_before.clone(), older_than, limit)
            .await
    }
}

impl DeadLetters for MysqlOutbox {
    async fn dead_letters(&self, limit: u32) -> Result<Vec<DeadLetter>, Error> {
        let rows: Vec<DeadLetterRow> = sqlx::query_as(self.sql.dead_letters.clone())
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await
            .map_err(outbox_error)?;
        rows.into_iter().map(row::dead_letter).collect()
    }

    async fn requeue(&self, ids: &[Uuid]) -> Result<u64, Error> {
        let mut late: Vec<Uuid> = Vec::new();
        for chunk in ids.chunks(CHUNK) {
            let mut query = sqlx::query_scalar::<_, Uuid>(self.sql.published_after(chunk.len()));
            for id in chunk {
                query = query.bind(id);
            }
            late.extend(query.fetch_all(&self.pool).await.map_err(outbox_error)?);
        }
        if !late.is_empty() {
            return Err(Error::RequeueOutOfOrder { ids: late });
        }
        let mut requeued = 0;
        for chunk in ids.chunks(CHUNK) {
            let mut query = sqlx::query(self.sql.requeue(chunk.len()));
            for id in chunk {
                query = query.bind(id);
            }
            requeued += query
                .execute(&self.pool)
                .await
                .map_err(outbox_error)?
                .rows_affected();
        }
        Ok(requeued)
    }
}
