//! [`IdempotencyMiddleware`]: the per-request flow of the layer.

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::Request;
use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};
use idempotency_core::cache::{DistributedCache, FailurePolicy, LocalCache};
use idempotency_core::fingerprint::short_hash;
use idempotency_core::{
    Acquire, CacheError, Claim, Fingerprint, IdempotencyMetrics, IdempotencyRecord,
    IdempotencyStore, InFlightPolicy, Level, LockWait, RecordId, StoreError, StoredOutcome, Tx,
};
use tower::Service;
use tracing::Instrument;

use super::Shared;
use super::tx::TxSlot;
use crate::error::Error;
use crate::header::IDEMPOTENT_REPLAYED;
use crate::problem::Problem;
use crate::scope::ScopeSource;
use crate::stored::StoredResponse;

type Core = idempotency_core::Error;

/// The service [`IdempotencyLayer`](crate::IdempotencyLayer) wraps a route in.
pub struct IdempotencyMiddleware<I, S, L, D, M, Z, Src> {
    inner: I,
    shared: Arc<Shared<S, L, D, M, Z>>,
    scope: PhantomData<fn() -> Src>,
}

impl<I, S, L, D, M, Z, Src> IdempotencyMiddleware<I, S, L, D, M, Z, Src> {
    pub(super) fn new(inner: I, shared: Arc<Shared<S, L, D, M, Z>>) -> Self {
        Self {
            inner,
            shared,
            scope: PhantomData,
        }
    }
}

impl<I: Clone, S, L, D, M, Z, Src> Clone for IdempotencyMiddleware<I, S, L, D, M, Z, Src> {
    fn clone(&self) -> Self {
        Self::new(self.inner.clone(), Arc::clone(&self.shared))
    }
}

impl<I, S, L, D, M, Z, Src> fmt::Debug for IdempotencyMiddleware<I, S, L, D, M, Z, Src> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyMiddleware")
            .finish_non_exhaustive()
    }
}

impl<I, S, L, D, M, Z, Src> Service<Request> for IdempotencyMiddleware<I, S, L, D, M, Z, Src>
where
    I: Service<Request, Response = Response, Error = Infallible> + Clone + Send + 'static,
    I::Future: Send + 'static,
    S: IdempotencyStore,
    L: LocalCache,
    D: DistributedCache,
    M: IdempotencyMetrics,
    Z: Send + Sync + 'static,
    Src: ScopeSource<()>,
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
            let (keyed, request, span) = match shared.prepare::<Src>(request).await {
                Ok(prepared) => prepared,
                Err(response) => return Ok(response),
            };
            let (answer, response) = shared
                .answer(inner, request, keyed)
                .instrument(span.clone())
                .await;
            answer.record(&span);
            Ok(response)
        })
    }
}

/// What answered a request, for the span.
#[derive(Clone, Copy)]
pub(super) enum Answer {
    Executed,
    NotStored,
    Fenced,
    Replayed(Level),
    Conflict,
    InFlight,
    Failed,
}

impl Answer {
    pub(super) fn record(self, span: &tracing::Span) {
        let (outcome, tier) = match self {
            Self::Executed => ("executed", "handler"),
            Self::NotStored => ("not-stored", "handler"),
            Self::Fenced => ("fenced", "handler"),
            Self::Replayed(level) => ("replayed", level.as_str()),
            Self::Conflict => ("conflict", "persistence"),
            Self::InFlight => ("in-flight", "persistence"),
            Self::Failed => ("error", "none"),
        };
        span.record("outcome", outcome);
        span.record("tier", tier);
    }
}

/// One request's identity.
pub(super) struct Keyed {
    pub(super) id: RecordId,
    pub(super) fingerprint: Fingerprint,
}

impl<S, L, D, M, Z> Shared<S, L, D, M, Z>
where
    S: IdempotencyStore,
    L: LocalCache,
    D: DistributedCache,
    M: IdempotencyMetrics,
    Z: Send + Sync + 'static,
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
        let body = settings.buffer(body).instrument(span.clone()).await?;
        let fingerprint = span
            .in_scope(|| settings.fingerprint(&parts, &route, &body))
            .map_err(IntoResponse::into_response)?;
        let keyed = Keyed {
            id: RecordId::new(operation, scope, key),
            fingerprint,
        };
        Ok((keyed, Request::from_parts(parts, Body::from(body)), span))
    }

    async fn answer<I>(&self, inner: I, request: Request, keyed: Keyed) -> (Answer, Response)
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
        let mut tx = match Tx::<S>::begin(store).await {
            Ok(tx) => tx,
            Err(error) => return failed(Core::Store(error)),
        };
        if !config.enabled {
            return self.run(inner, request, tx, None).await;
        }
        let claim = Claim {
            id: &keyed.id,
            fingerprint: &keyed.fingerprint,
            ttl: config
                .operation_ttls
                .get(op)
                .copied()
                .unwrap_or(config.default_ttl),
            wait: match config.in_flight {
                InFlightPolicy::Wait { timeout: None } => LockWait::Unbounded,
                InFlightPolicy::Wait {
                    timeout: Some(timeout),
                } => LockWait::Timeout(timeout),
                InFlightPolicy::Reject => LockWait::NoWait,
            },
        };
        let metrics = service.metrics();
        let attempts = config.max_acquire_attempts.max(1);
        for _ in 0..attempts {
            let started = Instant::now();
            let acquired = store.acquire(tx.connection(), &claim).await;
            metrics.acquire_wait(op, started.elapsed());
            match acquired {
                Ok(Acquire::Acquired) => {
                    metrics.acquired(op);
                    return self.run(inner, request, tx, Some(keyed)).await;
                }
                Ok(Acquire::Exists) => {
                    metrics.acquire_conflict(op);
                    match store.find(tx.connection(), &keyed.id).await {
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

    /// The caches, then (with `lookup_before_acquire`) the committed record.
    async fn replay_early(&self, keyed: &Keyed) -> Result<Option<(Answer, Response)>, Error> {
        if let Some(answer) = self.replay_cached(keyed).await? {
            return Ok(Some(answer));
        }
        let service = &self.service;
        let id = &keyed.id;
        if !service.config().lookup_before_acquire {
            return Ok(None);
        }
        let Some(record) = service.store().lookup(id).await.map_err(Core::Store)? else {
            return Ok(None);
        };
        let record = Arc::new(record);
        let answer = self.replay(keyed, &record, Level::Persistence);
        if matches!(answer.0, Answer::Replayed(_)) {
            self.fill_caches(id, record).await;
        }
        Ok(Some(answer))
    }

    /// L1, then L2 (an L2 hit is copied to L1).
    pub(super) async fn replay_cached(
        &self,
        keyed: &Keyed,
    ) -> Result<Option<(Answer, Response)>, Error> {
        let service = &self.service;
        let id = &keyed.id;
        if let Some(record) = service.local_cache().get(id) {
            return Ok(Some(self.replay(keyed, &record, Level::Local)));
        }
        match service.distributed_cache().get(id).await {
            Ok(Some(record)) => {
                let record = Arc::new(record);
                let answer = self.replay(keyed, &record, Level::Distributed);
                if matches!(answer.0, Answer::Replayed(_)) {
                    service.local_cache().put(id, record);
                }
                Ok(Some(answer))
            }
            Ok(None) => Ok(None),
            Err(error) => self.cache_read_failed(id, error).map(|()| None),
        }
    }

    fn cache_read_failed(&self, id: &RecordId, error: CacheError) -> Result<(), Error> {
        let op = id.operation.as_str();
        self.service
            .metrics()
            .cache_error(op, Level::Distributed, &error);
        let fail_fast = self.service.distributed_cache().failure_policy()
            == FailurePolicy::FailFast
            && !matches!(error, CacheError::Corrupt(_));
        tracing::warn!(operation = op, %error, fail_fast, "distributed cache read failed");
        if fail_fast {
            return Err(Core::Cache(error).into());
        }
        Ok(())
    }

    /// Answers a stored record: the stored response, or 422 / 409.
    pub(super) fn replay(
        &self,
        keyed: &Keyed,
        record: &IdempotencyRecord,
        level: Level,
    ) -> (Answer, Response) {
        let metrics = self.service.metrics();
        let op = keyed.id.operation.as_str();
        metrics.lookup_hit(op, level);
        if record.fingerprint != keyed.fingerprint {
            metrics.payload_conflict(op);
            return (
                Answer::Conflict,
                Error::from(Core::PayloadConflict).into_response(),
            );
        }
        let payload = match &record.outcome {
            Some(StoredOutcome::Completed { payload }) => Some(payload),
            Some(StoredOutcome::Rejected { details, .. }) => details.as_ref(),
            None => {
                metrics.in_flight(op);
                return (
                    Answer::InFlight,
                    Error::from(Core::InFlight).into_response(),
                );
            }
        };
        let stored = payload
            .ok_or("no stored response")
            .map_err(Error::internal)
            .and_then(|text| serde_json::from_str::<StoredResponse>(text).map_err(Error::internal));
        match stored {
            Ok(stored) => {
                metrics.replayed(op, record.status());
                let mut response = stored.into_response();
                response.headers_mut().insert(
                    IDEMPOTENT_REPLAYED.clone(),
                    HeaderValue::from_static("true"),
                );
                (Answer::Replayed(level), response)
            }
            Err(error) => {
                tracing::error!(operation = op, "stored record holds no readable response");
                (Answer::Failed, error.into_response())
            }
        }
    }

    /// Runs the handler with the transaction, then stores and commits, or rolls back.
    async fn run<I>(
        &self,
        mut inner: I,
        mut request: Request,
        tx: Tx<S>,
        keyed: Option<Keyed>,
    ) -> (Answer, Response)
    where
        I: Service<Request, Response = Response, Error = Infallible>,
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
        let status = response.status();
        if !self.settings.statuses.stores(status) {
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
        match self.commit(tx, keyed, &parts, &body).await {
            Ok(()) => (
                Answer::Executed,
                Response::from_parts(parts, Body::from(body)),
            ),
            Err(error) => (Answer::Failed, error.into_response()),
        }
    }

    /// The whole response body, when it can be stored: an exact length within the limit.
    /// Otherwise why not, and the body when it was not consumed.
    pub(super) async fn capture(&self, body: Body) -> Result<Bytes, Unstorable> {
        let max = self.settings.max_response_body;
        match body.size_hint().exact() {
            None => return Err(Unstorable::new("streaming", Some(body))),
            Some(len) if len > max as u64 => {
                return Err(Unstorable::new("too-large", Some(body)));
            }
            Some(_) => {}
        }
        axum::body::to_bytes(body, max)
            .await
            .map_err(|_| Unstorable::new("unreadable", None))
    }

    /// The stored form of a response: `COMPLETED`, or `REJECTED` with code `HTTP_<status>` for
    /// a 4xx.
    pub(super) fn outcome(
        &self,
        parts: &axum::http::response::Parts,
        body: &Bytes,
    ) -> Result<StoredOutcome, Error> {
        let stored = StoredResponse::from_parts(
            parts.status,
            &parts.headers,
            body.clone(),
            &self.settings.headers,
        );
        let payload = serde_json::to_string(&stored).map_err(Error::internal)?;
        Ok(if parts.status.is_client_error() {
            StoredOutcome::Rejected {
                code: format!("HTTP_{}", parts.status.as_u16()),
                details: Some(payload),
            }
        } else {
            StoredOutcome::Completed { payload }
        })
    }

    /// Stores the response on the record (when there is one) and commits.
    async fn commit(
        &self,
        mut tx: Tx<S>,
        keyed: Option<Keyed>,
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
        let store = self.service.store();
        let record = match store.complete(tx.connection(), &keyed.id, &outcome).await {
            Ok(record) => record,
            Err(error) => {
                rollback(tx).await;
                return Err(Core::Store(error).into());
            }
        };
        tx.commit().await.map_err(Core::Store)?;
        let op = keyed.id.operation.as_str();
        self.service.metrics().persisted(op, outcome.status());
        self.fill_caches(&keyed.id, Arc::new(record)).await;
        Ok(())
    }

    /// Writes a committed terminal record to L2, then L1; failures are logged and counted.
    pub(super) async fn fill_caches(&self, id: &RecordId, record: Arc<IdempotencyRecord>) {
        if !record.is_terminal() {
            return;
        }
        let service = &self.service;
        if let Err(error) = service.distributed_cache().put(id, &record).await {
            let op = id.operation.as_str();
            service
                .metrics()
                .cache_error(op, Level::Distributed, &error);
            tracing::warn!(operation = op, %error, "distributed cache write failed");
        }
        service.local_cache().put(id, record);
    }
}

pub(super) fn failed(error: Core) -> (Answer, Response) {
    (Answer::Failed, Error::from(error).into_response())
}

async fn rollback<S: IdempotencyStore>(tx: Tx<S>) {
    if let Err(error) = tx.rollback().await {
        tracing::warn!(%error, "rollback failed");
    }
}

/// A response the layer cannot store.
pub(super) struct Unstorable {
    pub(super) reason: &'static str,
    /// The body, when it was not consumed.
    pub(super) body: Option<Body>,
}

impl Unstorable {
    fn new(reason: &'static str, body: Option<Body>) -> Self {
        Self { reason, body }
    }

    /// The warning and the `idempotency.layer.unstored` count.
    pub(super) fn report(&self, operation: &str, then: &'static str) {
        tracing::warn!(
            operation,
            reason = self.reason,
            "response cannot be stored; {then}"
        );
        metrics::counter!(
            "idempotency.layer.unstored",
            "operation" => operation.to_owned(),
            "reason" => self.reason
        )
        .increment(1);
    }
}
