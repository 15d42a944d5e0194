//! [`IdempotencyMiddleware`]: the per-request flow of the layer.

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use idempotency_core::ResultSerializer;
use idempotency_core::cache::{DistributedCache, LocalCache};
use idempotency_core::fingerprint::short_hash;
use idempotency_core::trace;
use idempotency_core::{
    Acquire, Claim, IdempotencyMetrics, IdempotencyStore, InFlightPolicy, Level, LockWait,
    RecordId, StoreError, Tx, TxMark,
};
use tower::Service;
use tracing::Instrument;

use super::Shared;
use super::optimistic::{ClaimFirst, InsertFn, Mode};
use super::replay::{Answer, Keyed, failed};
use super::tx::TxSlot;
use crate::error::Error;
use crate::problem::Problem;
use crate::scope::ScopeSource;

type Core = idempotency_core::Error;

/// The service [`IdempotencyLayer`](crate::IdempotencyLayer) wraps a route in.
pub struct IdempotencyMiddleware<I, S, L, D, M, Z, Src, Mo = ClaimFirst> {
    inner: I,
    shared: Arc<Shared<S, L, D, M, Z>>,
    scope: PhantomData<fn() -> (Src, Mo)>,
}

impl<I, S, L, D, M, Z, Src, Mo> IdempotencyMiddleware<I, S, L, D, M, Z, Src, Mo> {
    pub(super) fn new(inner: I, shared: Arc<Shared<S, L, D, M, Z>>) -> Self {
        Self {
            inner,
            shared,
            scope: PhantomData,
        }
    }
}

impl<I: Clone, S, L, D, M, Z, Src, Mo> Clone for IdempotencyMiddleware<I, S, L, D, M, Z, Src, Mo> {
    fn clone(&self) -> Self {
        Self::new(self.inner.clone(), Arc::clone(&self.shared))
    }
}

impl<I, S, L, D, M, Z, Src, Mo> fmt::Debug for IdempotencyMiddleware<I, S, L, D, M, Z, Src, Mo> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyMiddleware")
            .finish_non_exhaustive()
    }
}

impl<I, S, L, D, M, Z, Src, Mo> Service<Request>
    for IdempotencyMiddleware<I, S, L, D, M, Z, Src, Mo>
where
    I: Service<Request, Response = Response, Error = Infallible> + Clone + Send + 'static,
    I::Future: Send + 'static,
    S: IdempotencyStore,
    L: LocalCache,
    D: DistributedCache,
    M: IdempotencyMetrics,
    Z: ResultSerializer,
    Src: ScopeSource<()>,
    Mo: Mode<S>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        // The clone is not ready; the service that was polled ready handles this request.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let shared = Arc::clone(&self.shared);
        Box::pin(async move {
            if !shared.settings.handles(&request) {
                return passed_through(inner, request).await;
            }
            let (keyed, request, span) = match shared.prepare::<Src>(request).await {
                Ok(prepared) => prepared,
                Err(response) => return Ok(response),
            };
            let (answer, response) = shared
                .answer(inner, request, keyed, Mo::insert_completed())
                .instrument(span.clone())
                .await;
            answer.record(&span);
            Ok(response)
        })
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
    /// Key, scope, operation, body and fingerprint; or the response that refuses the request.
    pub(super) async fn prepare<Src: ScopeSource<()>>(
        &self,
        request: Request,
    ) -> Result<(Keyed, Request, tracing::Span), Response> {
        let settings = &self.settings;
        let (mut parts, body) = request.into_parts();
        let key = settings
            .key(&parts.headers)
            .map_err(IntoResponse::into_response)?;
        let scope = Src::scope(&mut parts, &())
            .await
            .map_err(IntoResponse::into_response)?;
        let (route, operation) = settings
            .operation(&parts)
            .map_err(IntoResponse::into_response)?;
        let span = tracing::info_span!(
            "idempotency",
            operation = operation.as_str(),
            key_hash = %short_hash(key.as_str()),
            outcome = tracing::field::Empty,
            tier = tracing::field::Empty,
        );
        remote_parent(&span, &parts.headers);
        let body = settings.buffer(body).instrument(span.clone()).await?;
        settings
            .refuse_too_deep(&parts, &body)
            .map_err(|too_deep| crate::json::too_deep_problem(too_deep).into_response())?;
        let (fingerprint, previous_fingerprint, malformed_json) = span
            .in_scope(|| {
                settings.fingerprint(self.service.fingerprint_strategy(), &parts, &route, &body)
            })
            .map_err(IntoResponse::into_response)?;
        let keyed = Keyed {
            id: RecordId::new(operation, scope, key),
            fingerprint,
            previous_fingerprint,
            malformed_json,
        };
        Ok((keyed, Request::from_parts(parts, Body::from(body)), span))
    }

    async fn answer<I>(
        &self,
        inner: I,
        request: Request,
        keyed: Keyed,
        optimistic: Option<InsertFn<S>>,
    ) -> (Answer, Response)
    where
        I: Service<Request, Response = Response, Error = Infallible>,
    {
        let service = &self.service;
        let store = service.store();
        let config = service.config();
        let op = keyed.id.operation.as_str();
        if config.enabled {
            match self.replay_early(&keyed).await {
                Ok(Some(answer)) => return answer,
                Ok(None) => {}
                Err(error) => return (Answer::Failed, error.into_response()),
            }
        }
        // Counted before a connection is taken, released when the answer is ready.
        let entered = config
            .enabled
            .then(|| self.waiters.enter(&keyed.id, self.settings.max_waiters));
        if let Some(None) = entered {
            service.metrics().in_flight(op);
            return (
                Answer::InFlight,
                Error::from(Core::InFlight).into_response(),
            );
        }
        let mut tx = match Tx::<S>::begin(store).await {
            Ok(tx) => tx,
            Err(error) => return failed(Core::Store(error)),
        };
        if !config.enabled {
            return self.run(inner, request, tx, None).await;
        }
        if let Some(insert) = optimistic {
            return self.run_optimistic(inner, request, tx, keyed, insert).await;
        }
        let claim = self.claim_of(&keyed);
        let metrics = service.metrics();
        let attempts = config.max_acquire_attempts.max(1);
        for _ in 0..attempts {
            let started = Instant::now();
            let acquired = store
                .acquire(tx.connection(), &claim)
                .instrument(trace::store_span(S::DB_SYSTEM, "acquire", "INSERT"))
                .await;
            metrics.acquire_wait(op, started.elapsed());
            match acquired {
                Ok(Acquire::Acquired) => {
                    metrics.acquired(op);
                    return self.run(inner, request, tx, Some(keyed)).await;
                }
                Ok(Acquire::Exists) => {
                    metrics.acquire_conflict(op);
                    let found = store
                        .find(tx.connection(), &keyed.id)
                        .instrument(trace::store_span(S::DB_SYSTEM, "find", "SELECT"))
                        .await;
                    match found {
                        Ok(Some(record)) => {
                            rollback(tx).await;
                            let record = Arc::new(record);
                            let answer = self.replay(&keyed, &record, Level::Persistence);
                            if matches!(answer.0, Answer::Replayed(_)) {
                                self.fill_caches(&keyed.id, record).await;
                            }
                            return answer;
                        }
                        Ok(None) => {
                            tracing::debug!("record vanished between insert and find; retrying");
                        }
                        Err(error) => {
                            rollback(tx).await;
                            return failed(Core::Store(error));
                        }
                    }
                }
                Err(StoreError::LockTimeout(_)) => {
                    metrics.in_flight(op);
                    rollback(tx).await;
                    return (
                        Answer::InFlight,
                        Error::from(Core::InFlight).into_response(),
                    );
                }
                Err(error) => {
                    rollback(tx).await;
                    return failed(Core::Store(error));
                }
            }
        }
        rollback(tx).await;
        failed(Core::AcquireExhausted { attempts })
    }

    /// The claim of `keyed`: its operation's TTL and the in-flight policy's wait.
    pub(super) fn claim_of<'a>(&self, keyed: &'a Keyed) -> Claim<'a> {
        let config = self.service.config();
        Claim {
            id: &keyed.id,
            fingerprint: &keyed.fingerprint,
            ttl: config
                .operation_ttls
                .get(keyed.id.operation.as_str())
                .copied()
                .unwrap_or(config.default_ttl),
            wait: match config.in_flight {
                InFlightPolicy::Wait { timeout: None } => LockWait::Unbounded,
                InFlightPolicy::Wait {
                    timeout: Some(timeout),
                } => LockWait::Timeout(timeout),
                InFlightPolicy::Reject => LockWait::NoWait,
            },
        }
    }

    /// Runs the handler with the transaction, then stores and commits, or rolls back.
    async fn run<I>(
        &self,
        mut inner: I,
        mut request: Request,
        mut tx: Tx<S>,
        keyed: Option<Keyed>,
    ) -> (Answer, Response)
    where
        I: Service<Request, Response = Response, Error = Infallible>,
    {
        // What the handler adds to the `Tx` (hooks, nested claims, a failed store statement)
        // goes with its statements if they are rolled back to the savepoint.
        let mark = match &keyed {
            Some(_) => match tx.savepoint(self.service.store()).await {
                Ok(mark) => Some(mark),
                Err(error) => {
                    rollback(tx).await;
                    return failed(Core::Store(error));
                }
            },
            None => None,
        };
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
        if !self.stores(keyed.as_ref(), &response) {
            rollback(tx).await;
            return (Answer::NotStored, response);
        }
        let (parts, body) = response.into_parts();
        let body = match self.capture(body).await {
            Ok(body) => body,
            Err(unstorable) => {
                let op = keyed.as_ref().map_or("", |k| k.id.operation.as_str());
                unstorable.report(op, "rolled back and answered 500");
                rollback(tx).await;
                return (Answer::Failed, Problem::internal().into_response());
            }
        };
        match self.commit(tx, keyed, mark, &parts, &body).await {
            Ok(()) => (
                Answer::Executed,
                Response::from_parts(parts, Body::from(body)),
            ),
            Err(error) => (Answer::Failed, error.into_response()),
        }
    }

    /// Stores the response on the record (when there is one) and commits.
    async fn commit(
        &self,
        mut tx: Tx<S>,
        keyed: Option<Keyed>,
        mark: Option<TxMark>,
        parts: &axum::http::response::Parts,
        body: &Bytes,
    ) -> Result<(), Error> {
        let Some(keyed) = keyed else {
            return Ok(Tx::commit(tx).await.map_err(Core::Store)?);
        };
        let outcome = match self.outcome(parts, body) {
            Ok(outcome) => outcome,
            Err(error) => {
                rollback(tx).await;
                return Err(error);
            }
        };
        let record = match self.complete(&mut tx, &keyed, mark, &outcome).await {
            Ok(record) => record,
            Err(error) => {
                rollback(tx).await;
                return Err(Core::Store(error).into());
            }
        };
        self.after_stored(&mut tx, &keyed.id, record, false);
        tx.commit().await.map_err(Core::Store)?;
        Ok(())
    }
}

/// A request the layer does not handle (its method is not one of the layer's), as the route
/// answers it.
pub(super) async fn passed_through<I>(
    mut inner: I,
    request: Request,
) -> Result<Response, Infallible>
where
    I: Service<Request, Response = Response, Error = Infallible>,
{
    inner.call(request).await
}

impl<S, L, D, M, Z> Shared<S, L, D, M, Z>
where
    S: IdempotencyStore,
{
    /// Stores the outcome. When the handler caught a failed statement that aborted the
    /// transaction (PostgreSQL: "insert, catch the unique violation, answer 422") and answered
    /// a 4xx, the transaction returns to the savepoint taken before the handler, which undoes
    /// the handler's statements, and the outcome is stored there: the answer is stored on every
    /// backend alike. Any other answer on an aborted transaction (a 2xx whose writes were lost)
    /// fails, and the request is rolled back and answered 500. What the handler added to the
    /// `Tx` since the savepoint (`mark`: after-commit hooks, nested claims, a failed store
    /// statement) goes with its statements.
    async fn complete(
        &self,
        tx: &mut Tx<S>,
        keyed: &Keyed,
        mark: Option<TxMark>,
        outcome: &idempotency_core::StoredOutcome,
    ) -> Result<idempotency_core::IdempotencyRecord, StoreError> {
        let store = self.service.store();
        // The layer's span (current here), for the span link of later replays.
        let execution_span = trace::SpanRef::current();
        let completed = store
            .complete(tx.connection(), &keyed.id, outcome, execution_span)
            .instrument(trace::store_span(S::DB_SYSTEM, "complete", "UPDATE"))
            .await;
        let error = match completed {
            Ok(record) => return Ok(record),
            Err(error) => error,
        };
        // Only a client error describes the request whatever the handler's statements did; a
        // success whose statements were lost with the aborted transaction is not stored.
        if !matches!(outcome, idempotency_core::StoredOutcome::Rejected { .. }) {
            return Err(error);
        }
        let Some(mark) = mark else {
            return Err(error);
        };
        if !tx
            .rollback_to_savepoint(store, mark, &error)
            .await
            .unwrap_or(false)
        {
            return Err(error);
        }
        let record = store
            .complete(tx.connection(), &keyed.id, outcome, execution_span)
            .instrument(trace::store_span(S::DB_SYSTEM, "complete", "UPDATE"))
            .await?;
        tracing::warn!(
            operation = keyed.id.operation.as_str(),
            %error,
            "the handler's transaction was aborted by a failed statement: its statements were \
             rolled back and its response stored"
        );
        Ok(record)
    }
}

/// A request's W3C context becomes the parent of the layer's span when the span has no
/// OpenTelemetry parent of its own (no enclosing server span that extracted it already). One
/// `traceparent` header, valid by the W3C rules; anything else (absent, repeated, malformed)
/// is ignored and the span starts a new trace.
fn remote_parent(span: &tracing::Span, headers: &axum::http::HeaderMap) {
    if trace::current_context().is_some() {
        return;
    }
    let single = |name: &str| {
        let mut values = headers.get_all(name).iter();
        match (values.next(), values.next()) {
            (Some(value), None) => value.to_str().ok(),
            _ => None,
        }
    };
    trace::set_remote_parent(span, single(trace::TRACEPARENT), single(trace::TRACESTATE));
}

pub(super) async fn rollback<S: IdempotencyStore>(tx: Tx<S>) {
    if let Err(error) = tx.rollback().await {
        tracing::warn!(%error, "rollback failed");
    }
}
