//! The layer's optimistic mode: the handler first, then the terminal record in one insert.

use std::future::Future;
use std::pin::Pin;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use idempotency_core::ResultSerializer;
use idempotency_core::cache::{DistributedCache, LocalCache};
use idempotency_core::store::InsertCompleted;
use idempotency_core::trace::{self, SpanRef};
use idempotency_core::{
    Claim, IdempotencyMetrics, IdempotencyRecord, IdempotencyStore, StoreError, StoredOutcome, Tx,
};
use tower::Service;
use tracing::Instrument;

use super::replay::{Answer, Keyed, failed};
use super::service::rollback;
use super::tx::TxSlot;
use super::{IdempotencyLayer, Shared};
use crate::error::Error;
use crate::problem::Problem;

type Core = idempotency_core::Error;

/// [`InsertCompleted::insert_completed`] of a store, boxed: what the optimistic mode calls.
pub(super) type InsertFn<S> = for<'a> fn(
    &'a S,
    &'a mut <S as IdempotencyStore>::Connection,
    &'a Claim<'a>,
    &'a StoredOutcome,
    Option<SpanRef>,
) -> Pin<
    Box<dyn Future<Output = Result<Option<IdempotencyRecord>, StoreError>> + Send + 'a>,
>;

fn insert_completed<'a, S: InsertCompleted>(
    store: &'a S,
    conn: &'a mut S::Connection,
    claim: &'a Claim<'a>,
    outcome: &'a StoredOutcome,
    execution_span: Option<SpanRef>,
) -> Pin<Box<dyn Future<Output = Result<Option<IdempotencyRecord>, StoreError>> + Send + 'a>> {
    Box::pin(store.insert_completed(conn, claim, outcome, execution_span))
}

/// How an [`IdempotencyLayer`] runs a first execution: [`ClaimFirst`] (the default) or
/// [`Optimistic`]. Sealed: the two modes are the layer's own.
pub trait Mode<S: IdempotencyStore>: sealed::Sealed<S> {}

impl<S: IdempotencyStore, T: sealed::Sealed<S>> Mode<S> for T {}

pub(super) mod sealed {
    use super::{IdempotencyStore, InsertFn};

    /// What a mode tells the middleware; not nameable outside the crate.
    pub trait Sealed<S: IdempotencyStore> {
        /// The optimistic mode's insert; `None` in claim-first mode.
        fn insert_completed() -> Option<InsertFn<S>>;
    }
}

/// The default mode of [`IdempotencyLayer`]: the key is claimed with a `PROCESSING` record
/// before the handler runs, so a duplicate never runs the handler while the first request holds
/// the key, nor after its response committed. Five statements per first execution on
/// PostgreSQL around the handler's own (`BEGIN`, the claim, a savepoint, the completion,
/// `COMMIT`).
#[derive(Debug, Clone, Copy, Default)]
pub struct ClaimFirst;

/// The mode [`IdempotencyLayer::optimistic`] selects: the handler runs first and the response
/// is stored with one insert at the end, as
/// [`IdempotencyService::execute_optimistic`](idempotency_core::IdempotencyService::execute_optimistic)
/// does: three statements around the handler's own on PostgreSQL (`BEGIN`, the insert,
/// `COMMIT`), two fewer than [`ClaimFirst`] (no claim, no savepoint).
#[derive(Debug, Clone, Copy, Default)]
pub struct Optimistic;

impl<S: IdempotencyStore> sealed::Sealed<S> for ClaimFirst {
    fn insert_completed() -> Option<InsertFn<S>> {
        None
    }
}

impl<S: InsertCompleted> sealed::Sealed<S> for Optimistic {
    fn insert_completed() -> Option<InsertFn<S>> {
        Some(insert_completed::<S>)
    }
}

impl<S, L, D, M, Z, Src> IdempotencyLayer<S, L, D, M, Z, Src, ClaimFirst> {
    /// Runs the handler first and stores its response with one insert at the end, in the same
    /// transaction: on PostgreSQL `BEGIN`, the handler's statements, the insert and `COMMIT`,
    /// two statements fewer than the default mode ([`ClaimFirst`]), which claims the key
    /// before the handler and takes a savepoint after the claim.
    ///
    /// **Only for handlers whose every effect is in the transaction** (`IdempotentTx`: rows,
    /// outbox events). Concurrent duplicates may all run the handler: up to
    /// [`max_waiters_per_key`](Self::max_waiters_per_key) + 1 at once per key and process
    /// (`max_waiters_per_key(0)`: one). The first insert of the record wins; every other one
    /// waits for the winner's transaction, finds the key taken, rolls back everything its
    /// handler did and answers the winner's stored response (or `422 idempotency-key-reused`
    /// when the winner sent another payload), also when its insert failed on a serialization
    /// failure (PostgreSQL under `REPEATABLE READ` or `SERIALIZABLE`: its snapshot predates the
    /// winner's commit). An answer that is not stored (a `5xx`, a `409` "already exists" the
    /// handler gave on the winner's business row) is answered as is unless a committed record
    /// exists for the key: then that record answers
    /// (the winner's response, a `422` for another payload, or `409 request-in-flight` for a
    /// claim a claim-first or leased layer holds during a rollout). A duplicate's handler may
    /// also wait on row locks the first transaction holds, under any in-flight policy: the
    /// policy bounds only the final insert's wait; bound that wait in the transaction
    /// (`SET LOCAL lock_timeout` on PostgreSQL). Replays of a committed key run the handler too
    /// (and roll it back) unless a cache or `lookup_before_acquire` answers them first, so
    /// enable one. A handler that calls a payment provider or sends an e-mail must keep the
    /// default mode: a duplicate never runs the handler while the first request holds the key.
    ///
    /// A handler that caught a failed statement on PostgreSQL (a unique violation answered as
    /// `422`) left its transaction aborted: its statements are rolled back and its `4xx` is
    /// stored in a new transaction, as the default mode stores it after rolling back to its
    /// savepoint. Any other answer on an aborted transaction (a `201` whose writes were lost)
    /// is rolled back and answered `500`, nothing stored. The meter `acquired` counts the
    /// records inserted and committed (in the default mode: the keys claimed before the
    /// handler), and `acquire_conflict` the inserts or commits that lost the key to a committed
    /// duplicate.
    ///
    /// ```no_run
    /// use axum::{Router, http::StatusCode, routing::post};
    /// use idempotency_axum::{IdempotencyLayer, IdempotentTx, TenantHeader};
    /// use idempotency_core::IdempotencyService;
    /// use idempotency_pg::PgStore;
    ///
    /// async fn create(mut tx: IdempotentTx<PgStore>) -> StatusCode {
    ///     // only statements on `&mut *tx`: a concurrent duplicate may run them too, then
    ///     // rolls them back
    ///     # let _ = &mut *tx;
    ///     StatusCode::CREATED
    /// }
    ///
    /// # fn app(pool: idempotency_pg::sqlx::PgPool) -> Router {
    /// let service = IdempotencyService::new(PgStore::new(pool));
    /// Router::new()
    ///     .route("/orders", post(create))
    ///     .route_layer(IdempotencyLayer::new(service).scope::<TenantHeader>().optimistic())
    /// # }
    /// ```
    pub fn optimistic(self) -> IdempotencyLayer<S, L, D, M, Z, Src, Optimistic>
    where
        S: InsertCompleted,
    {
        IdempotencyLayer {
            shared: self.shared,
            scope: std::marker::PhantomData,
        }
    }
}

impl<S, L, D, M, Z> Shared<S, L, D, M, Z>
where
    S: IdempotencyStore,
    L: LocalCache,
    D: DistributedCache,
    M: IdempotencyMetrics,
    Z: ResultSerializer,
{
    /// The optimistic first execution: the handler in `tx`, then the insert of its stored
    /// response, then `COMMIT`.
    pub(super) async fn run_optimistic<I>(
        &self,
        mut inner: I,
        mut request: Request,
        tx: Tx<S>,
        keyed: Keyed,
        insert: InsertFn<S>,
    ) -> (Answer, Response)
    where
        I: Service<Request, Response = Response, Error = std::convert::Infallible>,
    {
        let slot = TxSlot::new(tx);
        request.extensions_mut().insert(slot.clone());
        let response = match inner.call(request).await {
            Ok(response) => response,
            Err(never) => match never {},
        };
        let Some(tx) = slot.reclaim() else {
            tracing::error!(
                "the handler kept the IdempotentTx beyond the request; nothing was committed"
            );
            return (Answer::Failed, Problem::internal().into_response());
        };
        if !self.stores(Some(&keyed), &response) {
            rollback(tx).await;
            // A duplicate that committed first may be why the handler answered so (a 5xx, a
            // 409 on the winner's business row): its answer wins.
            return match self.replay_stored(&keyed).await {
                Ok(Some(answer)) => self.taken(&keyed, answer),
                Ok(None) | Err(_) => (Answer::NotStored, response),
            };
        }
        let (parts, body) = response.into_parts();
        let body = match self.capture(body).await {
            Ok(body) => body,
            Err(unstorable) => {
                unstorable.report(keyed.id.operation.as_str(), "rolled back and answered 500");
                rollback(tx).await;
                return (Answer::Failed, Problem::internal().into_response());
            }
        };
        let outcome = match self.outcome(&parts, &body) {
            Ok(outcome) => outcome,
            Err(error) => {
                rollback(tx).await;
                return (Answer::Failed, error.into_response());
            }
        };
        self.store_optimistic(tx, &keyed, &outcome, insert, parts, body)
            .await
    }

    /// Inserts the terminal record in `tx` and commits. When the key is taken, answers the
    /// committed record; when the handler's failed statement had aborted `tx` and the answer
    /// is a `4xx`, stores it once more in a new transaction.
    async fn store_optimistic(
        &self,
        mut tx: Tx<S>,
        keyed: &Keyed,
        outcome: &StoredOutcome,
        insert: InsertFn<S>,
        parts: axum::http::response::Parts,
        body: Bytes,
    ) -> (Answer, Response) {
        let store = self.service.store();
        let metrics = self.service.metrics();
        let op = keyed.id.operation.as_str();
        let claim = self.claim_of(keyed);
        // The layer's span (current here), for the span link of later replays.
        let execution_span = SpanRef::current();
        let mut aborted = None;
        loop {
            let started = Instant::now();
            let inserted = insert(store, tx.connection(), &claim, outcome, execution_span)
                .instrument(trace::store_span(
                    S::DB_SYSTEM,
                    "insert_completed",
                    "INSERT",
                ))
                .await;
            // Once per request: not for the insert whose transaction had been aborted before
            // it, which is tried again at once.
            let again = aborted.is_none()
                && matches!(outcome, StoredOutcome::Rejected { .. })
                && matches!(&inserted, Err(error) if store.aborted_before(error));
            if !again {
                metrics.acquire_wait(op, started.elapsed());
            }
            match inserted {
                Ok(Some(record)) => {
                    self.after_stored(&mut tx, &keyed.id, record, true);
                    match tx.commit().await {
                        Ok(()) => {}
                        // SERIALIZABLE on PostgreSQL: a duplicate may have committed first.
                        Err(error @ StoreError::Conflict(_)) => {
                            return self.answer_committed(keyed, error).await;
                        }
                        Err(error) => return failed(Core::Store(error)),
                    }
                    if let Some(error) = aborted {
                        tracing::warn!(
                            operation = op,
                            %error,
                            "the handler's transaction was aborted by a failed statement: its \
                             statements were rolled back and its response stored"
                        );
                    }
                    return (
                        Answer::Executed,
                        Response::from_parts(parts, Body::from(body)),
                    );
                }
                Ok(None) => {
                    metrics.acquire_conflict(op);
                    rollback(tx).await;
                    // Read outside the transaction, whose snapshot (MySQL's repeatable read,
                    // taken at the handler's first read) may predate the winner's commit.
                    return match self.replay_stored(keyed).await {
                        Ok(Some(answer)) => answer,
                        // Deleted (expired) between the insert and the read: nothing to answer,
                        // and the handler's writes are gone; the retry runs it again.
                        Ok(None) => failed(Core::AcquireExhausted { attempts: 1 }),
                        Err(error) => (Answer::Failed, error.into_response()),
                    };
                }
                Err(StoreError::LockTimeout(_)) => {
                    metrics.in_flight(op);
                    rollback(tx).await;
                    return (
                        Answer::InFlight,
                        Error::from(Core::InFlight).into_response(),
                    );
                }
                Err(error) if again => {
                    rollback(tx).await;
                    tx = match Tx::<S>::begin(store).await {
                        Ok(tx) => tx,
                        Err(error) => return failed(Core::Store(error)),
                    };
                    aborted = Some(error);
                }
                // A serialization failure (PostgreSQL under REPEATABLE READ or SERIALIZABLE: a
                // duplicate's record committed after this transaction's snapshot), a deadlock,
                // or a transaction aborted under another answer (a success whose writes were
                // lost) or again after the retry: a committed record answers, as for a key
                // found taken; without one, nothing is stored.
                Err(error)
                    if matches!(error, StoreError::Conflict(_)) || store.aborted_before(&error) =>
                {
                    rollback(tx).await;
                    return self.answer_committed(keyed, error).await;
                }
                Err(error) => {
                    rollback(tx).await;
                    return failed(Core::Store(error));
                }
            }
        }
    }

    /// After a conflict that rolled the transaction back: the committed record's answer
    /// (counted as a key found taken), or the conflict (retryable) when there is none.
    async fn answer_committed(&self, keyed: &Keyed, conflict: StoreError) -> (Answer, Response) {
        match self.replay_stored(keyed).await {
            Ok(Some(answer)) => self.taken(keyed, answer),
            Ok(None) => failed(Core::Store(conflict)),
            Err(error) => (Answer::Failed, error.into_response()),
        }
    }

    /// A loser's answer from the committed record: counted as a key found taken (as for an
    /// insert that found it) when the record answers it, replayed or as a payload conflict.
    fn taken(&self, keyed: &Keyed, answer: (Answer, Response)) -> (Answer, Response) {
        if matches!(answer.0, Answer::Replayed(_) | Answer::Conflict) {
            self.service
                .metrics()
                .acquire_conflict(keyed.id.operation.as_str());
        }
        answer
    }
}
