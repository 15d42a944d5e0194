//! `execute_optimistic`: run first, write the terminal record once, at the end.

use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use serde::de::DeserializeOwned;

use tracing::Instrument;

use super::execute::{Prepared, execute_span, mark, traced};
use super::{Call, IdempotencyService};
use crate::cache::{DistributedCache, LocalCache};
use crate::error::Error;
use crate::fingerprint::Fingerprints;
use crate::key::RecordId;
use crate::metrics::IdempotencyMetrics;
use crate::result::{ExecutionResult, Origin, Outcome};
use crate::serializer::ResultSerializer;
use crate::store::{Claim, IdempotencyStore, InsertCompleted, StoreError};
use crate::trace::{self, SpanOutcome};
use crate::tx::Tx;

impl<S, L, D, M, Z> IdempotencyService<S, L, D, M, Z>
where
    S: InsertCompleted,
    L: LocalCache,
    D: DistributedCache,
    M: IdempotencyMetrics,
    Z: ResultSerializer,
{
    /// Runs `action`, then writes the terminal record in the same transaction with one insert:
    /// one statement fewer per first execution than [`execute`](Self::execute), which claims the
    /// key with a `PROCESSING` record first and completes it after the action.
    ///
    /// **Only for actions whose every effect is in this database transaction.** Two concurrent
    /// duplicates may both run the action; the second one's insert then waits for the first
    /// transaction, finds the key taken, rolls back everything it did and replays the winner's
    /// outcome. An action that fails while a duplicate committed (for example on a unique business
    /// key) also replays the winner. Replays of an already committed key run the action too (and
    /// roll it back) unless a cache or `lookup_before_acquire` answers first, so enable one of
    /// them. Use [`execute`](Self::execute) for anything with effects outside the database (a
    /// payment provider, an e-mail): a duplicate never runs the action while another request
    /// holds the key, nor after an outcome committed.
    ///
    /// **The in-flight policy does not bound the action.** `in-flight.policy` and
    /// `in-flight.timeout` bound only the final insert's wait for the key. A duplicate whose
    /// action touches rows that the holder's transaction has locked waits on them as long as
    /// the holder holds them, under `reject` as under `wait`, before the key is ever looked at.
    /// Bound that wait in the transaction (`SET LOCAL lock_timeout` on PostgreSQL,
    /// `innodb_lock_wait_timeout` on MySQL), or use [`execute`](Self::execute), which claims
    /// the key before the action.
    pub fn execute_optimistic<R, T, E, A>(
        &self,
        call: Call<'_, R>,
        action: A,
    ) -> impl Future<Output = Result<Outcome<T>, E>>
    where
        R: Serialize + ?Sized,
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        A: AsyncFnOnce(&mut S::Connection) -> Result<ExecutionResult<T>, E>,
    {
        traced(execute_span(&call), self.optimistic_untraced(call, action))
    }

    async fn optimistic_untraced<R, T, E, A>(
        &self,
        call: Call<'_, R>,
        action: A,
    ) -> Result<Outcome<T>, E>
    where
        R: Serialize + ?Sized,
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        A: AsyncFnOnce(&mut S::Connection) -> Result<ExecutionResult<T>, E>,
    {
        let inner = &*self.inner;
        let Some(Prepared {
            id,
            fingerprint,
            ttl,
        }) = inner.prepare(call)?
        else {
            let mut tx = self.begin().await.map_err(Error::Store)?;
            let result = action(tx.connection()).await?;
            tx.commit().await.map_err(Error::Store)?;
            return Ok(Outcome::new(result, Origin::Executed));
        };
        let op = id.operation.as_str();
        let early = if inner.config.lookup_before_acquire {
            self.replay_committed(&id, &fingerprint).await?
        } else {
            inner.replay_cached(&id, &fingerprint).await?
        };
        if let Some(outcome) = early {
            return Ok(outcome);
        }

        let mut tx = self.begin().await.map_err(Error::Store)?;
        let result = match action(tx.connection()).await {
            Ok(result) => result,
            Err(error) => {
                rollback(tx).await;
                // A duplicate that committed first may be why the action failed: its outcome
                // wins, and the key was taken, as for an insert that found it.
                return match self.replay_committed(&id, &fingerprint).await {
                    Ok(Some(outcome)) => {
                        inner.metrics.acquire_conflict(op);
                        Ok(outcome)
                    }
                    Err(Error::PayloadConflict) => {
                        inner.metrics.acquire_conflict(op);
                        Err(Error::PayloadConflict.into())
                    }
                    Ok(None) | Err(_) => Err(error),
                };
            }
        };
        let stored = inner.encode(&result)?;
        let claim = Claim {
            id: &id,
            fingerprint: &fingerprint.current,
            ttl,
            wait: inner.lock_wait(),
        };
        let started = Instant::now();
        let inserted = inner
            .store
            .insert_completed(tx.connection(), &claim, &stored, trace::SpanRef::current())
            .instrument(trace::store_span(
                S::DB_SYSTEM,
                "insert_completed",
                "INSERT",
            ))
            .await;
        tracing::Span::current()
            .record("idempotency.wait_ms", started.elapsed().as_secs_f64() * 1e3);
        inner.metrics.acquire_wait(op, started.elapsed());
        match inserted {
            Ok(Some(record)) => {
                mark(
                    match stored.status() {
                        crate::RecordStatus::Rejected => SpanOutcome::Rejected,
                        _ => SpanOutcome::Executed,
                    },
                    "action",
                );
                let service = Arc::clone(&self.inner);
                let status = stored.status();
                let record = Arc::new(record);
                let hook_id = id.clone();
                // Counted by a hook of its own, before the caches are filled: a call dropped
                // while an L2 write hangs has its record committed, and counted.
                let counted = Arc::clone(&service);
                let hook_op = hook_id.operation.clone();
                tx.after_commit_first(async move {
                    counted.metrics.persisted(hook_op.as_str(), status);
                    counted.metrics.acquired(hook_op.as_str());
                });
                tx.after_commit(async move { service.fill_caches(&hook_id, record).await });
                match tx.commit().await {
                    Ok(()) => Ok(Outcome::new(result, Origin::Executed)),
                    // SERIALIZABLE on PostgreSQL: a duplicate may have committed first.
                    Err(error @ StoreError::Conflict(_)) => {
                        self.committed_or(&id, &fingerprint, error).await
                    }
                    Err(error) => Err(Error::Store(error).into()),
                }
            }
            Ok(None) => {
                inner.metrics.acquire_conflict(op);
                rollback(tx).await;
                match self.replay_committed(&id, &fingerprint).await? {
                    Some(outcome) => Ok(outcome),
                    None => Err(Error::AcquireExhausted { attempts: 1 }.into()),
                }
            }
            Err(StoreError::LockTimeout(_)) => {
                inner.metrics.in_flight(op);
                mark(SpanOutcome::InFlight, crate::Level::Persistence.as_str());
                rollback(tx).await;
                Err(Error::InFlight.into())
            }
            // A serialization failure (PostgreSQL under REPEATABLE READ or SERIALIZABLE: a
            // duplicate's record committed after this transaction's snapshot), a deadlock, or a
            // caught failed statement that aborted the transaction (PostgreSQL: 25P02, perhaps
            // on the duplicate's row): a committed outcome answers, as for a key found taken.
            Err(error)
                if matches!(error, StoreError::Conflict(_))
                    || inner.store.aborted_before(&error) =>
            {
                rollback(tx).await;
                self.committed_or(&id, &fingerprint, error).await
            }
            Err(error) => {
                rollback(tx).await;
                Err(Error::Store(error).into())
            }
        }
    }

    /// After a conflict that rolled the transaction back: the committed outcome (counted as a
    /// key found taken), or the conflict (retryable) when there is none.
    async fn committed_or<T, E>(
        &self,
        id: &RecordId,
        fingerprint: &Fingerprints,
        conflict: StoreError,
    ) -> Result<Outcome<T>, E>
    where
        T: DeserializeOwned,
        E: From<Error>,
    {
        let committed = self.replay_committed(id, fingerprint).await;
        if matches!(committed, Ok(Some(_)) | Err(Error::PayloadConflict)) {
            // The key was taken, as for an insert that found it.
            self.inner.metrics.acquire_conflict(id.operation.as_str());
        }
        match committed? {
            Some(outcome) => Ok(outcome),
            None => Err(Error::Store(conflict).into()),
        }
    }
}

async fn rollback<S: IdempotencyStore>(tx: Tx<S>) {
    if let Err(error) = tx.rollback().await {
        tracing::warn!(error = %error, "rollback failed");
    }
}
