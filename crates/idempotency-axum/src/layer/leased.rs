//! Leased mode: for handlers whose effects are outside the database. The claim commits at once
//! with a lease and a fencing token; the response is stored with the token at the end.

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use idempotency_core::ResultSerializer;
use idempotency_core::cache::{DistributedCache, LocalCache};
use idempotency_core::lease::{FencingToken, LeaseClaim, LeasedClaims};
use idempotency_core::trace;
use idempotency_core::{Claim, IdempotencyMetrics, InFlightPolicy, Level, LockWait, RecordId};
use tower::{Layer, Service};
use tracing::Instrument;

use super::replay::{Answer, Keyed, failed};
use super::{IdempotencyLayer, Shared};
use crate::error::RETRY_AFTER_IN_FLIGHT;
use crate::problem::{Problem, ProblemKind};
use crate::scope::ScopeSource;

type Core = idempotency_core::Error;

/// The first pause between two looks at a key in flight; it doubles up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(20);
const MAX_PAUSE: Duration = Duration::from_millis(500);

/// [`IdempotencyLayer`] in leased mode, from [`IdempotencyLayer::leased`].
pub struct LeasedIdempotencyLayer<S, L, D, M, Z, Src> {
    inner: IdempotencyLayer<S, L, D, M, Z, Src>,
    lease: Duration,
}

impl<S, L, D, M, Z, Src> IdempotencyLayer<S, L, D, M, Z, Src> {
    /// Leased mode, for handlers whose effects are outside the database (a payment provider
    /// call): the claim commits at once as `PROCESSING` with a lease of `lease` and a fencing
    /// token; a duplicate answers `409 request-in-flight` with `Retry-After` (or waits, under
    /// the service's `wait` in-flight policy); the response is stored with the token at the
    /// end. A holder that dies leaves its claim until the lease expires; the next request with
    /// the same key and payload then takes the key over. `lease` must exceed the handler's
    /// longest run: a holder still running past it can be taken over, and its late completion
    /// is refused.
    ///
    /// The handler gets no transaction ([`IdempotentTx`](crate::IdempotentTx) answers 500).
    /// The store needs [`LeasedClaims`], prepared once with
    /// [`prepare_leases`](LeasedClaims::prepare_leases) (or, on `schema.mode: validate` with
    /// the migrations applied, checked with the store's `validate_leases`). The guarantees
    /// differ from the transactional mode: see RELIABILITY.md.
    pub fn leased(self, lease: Duration) -> LeasedIdempotencyLayer<S, L, D, M, Z, Src> {
        LeasedIdempotencyLayer { inner: self, lease }
    }
}

impl<S, L, D, M, Z, Src> Clone for LeasedIdempotencyLayer<S, L, D, M, Z, Src> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            lease: self.lease,
        }
    }
}

impl<S, L, D, M, Z, Src> fmt::Debug for LeasedIdempotencyLayer<S, L, D, M, Z, Src> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeasedIdempotencyLayer")
            .field("layer", &self.inner)
            .field("lease", &self.lease)
            .finish()
    }
}

impl<I, S, L, D, M, Z, Src> Layer<I> for LeasedIdempotencyLayer<S, L, D, M, Z, Src> {
    type Service = LeasedMiddleware<I, S, L, D, M, Z, Src>;

    fn layer(&self, inner: I) -> Self::Service {
        LeasedMiddleware {
            inner,
            shared: Arc::clone(&self.inner.shared),
            lease: self.lease,
            scope: PhantomData,
        }
    }
}

/// The service [`LeasedIdempotencyLayer`] wraps a route in.
pub struct LeasedMiddleware<I, S, L, D, M, Z, Src> {
    inner: I,
    shared: Arc<Shared<S, L, D, M, Z>>,
    lease: Duration,
    scope: PhantomData<fn() -> Src>,
}

impl<I: Clone, S, L, D, M, Z, Src> Clone for LeasedMiddleware<I, S, L, D, M, Z, Src> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
            lease: self.lease,
            scope: PhantomData,
        }
    }
}

impl<I, S, L, D, M, Z, Src> fmt::Debug for LeasedMiddleware<I, S, L, D, M, Z, Src> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeasedMiddleware")
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

impl<I, S, L, D, M, Z, Src> Service<Request> for LeasedMiddleware<I, S, L, D, M, Z, Src>
where
    I: Service<Request, Response = Response, Error = Infallible> + Clone + Send + 'static,
    I::Future: Send + 'static,
    S: LeasedClaims,
    L: LocalCache,
    D: DistributedCache,
    M: IdempotencyMetrics,
    Z: ResultSerializer,
    Src: ScopeSource<()>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let shared = Arc::clone(&self.shared);
        let lease = self.lease;
        Box::pin(async move {
            if !shared.settings.handles(&request) {
                return super::service::passed_through(inner, request).await;
            }
            let (keyed, request, span) = match shared.prepare::<Src>(request).await {
                Ok(prepared) => prepared,
                Err(response) => return Ok(response),
            };
            let (answer, response) = shared
                .answer_leased(inner, request, keyed, lease)
                .instrument(span.clone())
                .await;
            answer.record(&span);
            Ok(response)
        })
    }
}

impl<S, L, D, M, Z> Shared<S, L, D, M, Z>
where
    S: LeasedClaims,
    L: LocalCache,
    D: DistributedCache,
    M: IdempotencyMetrics,
    Z: ResultSerializer,
{
    async fn answer_leased<I>(
        self: &Arc<Self>,
        mut inner: I,
        request: Request,
        keyed: Keyed,
        lease: Duration,
    ) -> (Answer, Response)
    where
        I: Service<Request, Response = Response, Error = Infallible> + Send + 'static,
        I::Future: Send + 'static,
    {
        if !self.service.config().enabled {
            return (Answer::NotStored, call(&mut inner, request).await);
        }
        match self.replay_cached(&keyed).await {
            Ok(Some(answer)) => return answer,
            Ok(None) => {}
            Err(error) => return (Answer::Failed, error.into_response()),
        }
        // Counted before the claim, released when the answer is ready: a duplicate beyond the
        // holder and `max_waiters_per_key` waiters answers at once, instead of polling the
        // store until the holder is done (each poll a statement on the shared pool).
        let Some(_entered) = self.waiters.enter(&keyed.id, self.settings.max_waiters) else {
            self.service
                .metrics()
                .in_flight(keyed.id.operation.as_str());
            let problem = Problem::new(ProblemKind::InFlight)
                .with_detail("A request with this Idempotency-Key is still being processed; retry later with the same key.")
                .with_retry_after(Duration::from_secs(RETRY_AFTER_IN_FLIGHT));
            return (Answer::InFlight, problem.into_response());
        };
        let token = match self.claim(&keyed, lease).await {
            Ok(token) => token,
            Err(answer) => return answer,
        };
        // From here on the claim is committed: the handler and the storing of its response run
        // in a task of their own, so that a client that goes away (the request future dropped)
        // does not cancel them halfway, after an effect and before its record. The answer is
        // still what the client would have got.
        let shared = Arc::clone(self);
        let run = async move {
            let response = call(&mut inner, request).await;
            shared.finish(&keyed, token, response).await
        };
        match tokio::spawn(run.in_current_span()).await {
            Ok(answer) => answer,
            Err(error) => {
                tracing::error!(%error, "the handler did not finish; the claim stays until its lease expires");
                (Answer::Failed, Problem::internal().into_response())
            }
        }
    }

    /// Claims the key, waiting for a live lease as the in-flight policy says; a terminal record
    /// (or another payload) is answered at once.
    async fn claim(
        &self,
        keyed: &Keyed,
        lease: Duration,
    ) -> Result<FencingToken, (Answer, Response)> {
        let service = &self.service;
        let config = service.config();
        let op = keyed.id.operation.as_str();
        let mut claim = Claim {
            id: &keyed.id,
            fingerprint: &keyed.fingerprint,
            ttl: config
                .operation_ttls
                .get(op)
                .copied()
                .unwrap_or(config.default_ttl),
            wait: LockWait::NoWait,
        };
        let deadline = match config.in_flight {
            InFlightPolicy::Reject => Some(Instant::now()),
            // A wait too long to have an end on this clock has none.
            InFlightPolicy::Wait { timeout } => timeout.and_then(|t| Instant::now().checked_add(t)),
        };
        let mut pause = FIRST_PAUSE;
        loop {
            let started = Instant::now();
            let claimed = service
                .store()
                .claim_leased(&claim, lease)
                .instrument(trace::store_span(S::DB_SYSTEM, "claim_leased", "INSERT"))
                .await;
            service.metrics().acquire_wait(op, started.elapsed());
            let (record, left) = match claimed {
                Ok(LeaseClaim::Acquired { token, takeover }) => {
                    service.metrics().acquired(op);
                    if takeover {
                        tracing::warn!(operation = op, "took over an expired lease");
                    }
                    return Ok(token);
                }
                Ok(LeaseClaim::Exists { record, lease_left }) => {
                    (record, lease_left.unwrap_or_default())
                }
                Err(error) => return Err(failed(Core::Store(error))),
            };
            if !record.is_terminal()
                && left.is_zero()
                && keyed.matches(&record.fingerprint)
                && *claim.fingerprint != record.fingerprint
            {
                // An expired claim of this request under the previous fingerprint algorithm
                // (a transition accepts it): take it over with the fingerprint it carries.
                claim.fingerprint = keyed
                    .previous_fingerprint
                    .as_ref()
                    .unwrap_or(&keyed.fingerprint);
                continue;
            }
            if record.is_terminal() || !keyed.matches(&record.fingerprint) {
                let record = Arc::new(record);
                let answer = self.replay(keyed, &record, Level::Persistence);
                if matches!(answer.0, Answer::Replayed(_)) {
                    self.fill_caches(&keyed.id, record).await;
                }
                return Err(answer);
            }
            let now = Instant::now();
            if deadline.is_some_and(|deadline| now >= deadline) {
                service.metrics().in_flight(op);
                let problem = Problem::new(ProblemKind::InFlight)
                    .with_detail("A request with this Idempotency-Key is still being processed; retry later with the same key.")
                    .with_retry_after(left.max(Duration::from_secs(RETRY_AFTER_IN_FLIGHT)));
                return Err((Answer::InFlight, problem.into_response()));
            }
            let mut sleep = pause.min(left.max(FIRST_PAUSE));
            if let Some(deadline) = deadline {
                sleep = sleep.min(deadline - now);
            }
            tokio::time::sleep(sleep).await;
            pause = (pause * 2).min(MAX_PAUSE);
        }
    }

    /// Stores the response with the token, or releases the claim when it is not stored.
    async fn finish(
        &self,
        keyed: &Keyed,
        token: FencingToken,
        response: Response,
    ) -> (Answer, Response) {
        let store = self.service.store();
        let id = &keyed.id;
        let op = id.operation.as_str();
        if !self.stores(Some(keyed), &response) {
            self.release(id, token).await;
            return (Answer::NotStored, response);
        }
        let (parts, body) = response.into_parts();
        let body = match self.capture(body).await {
            Ok(body) => body,
            Err(unstorable) => {
                unstorable.report(op, "answered, claim released");
                self.release(id, token).await;
                return match unstorable.body {
                    Some(body) => (Answer::NotStored, Response::from_parts(parts, body)),
                    None => (Answer::Failed, Problem::internal().into_response()),
                };
            }
        };
        let answered = || Response::from_parts(parts.clone(), Body::from(body.clone()));
        let outcome = match self.outcome(&parts, &body) {
            Ok(outcome) => outcome,
            Err(error) => {
                tracing::error!(operation = op, %error, "response not encoded; claim released");
                self.release(id, token).await;
                return (Answer::NotStored, answered());
            }
        };
        // The layer's span (current here: the task runs in it), for the span link of replays.
        let completed = store
            .complete_leased(id, token, &outcome, trace::SpanRef::current())
            .instrument(trace::store_span(S::DB_SYSTEM, "complete_leased", "UPDATE"))
            .await;
        match completed {
            Ok(Some(record)) => {
                self.service.metrics().persisted(op, outcome.status());
                self.fill_caches(id, Arc::new(record)).await;
                (Answer::Executed, answered())
            }
            Ok(None) => {
                // The lease expired under this holder and another request took the key over:
                // its outcome is the stored one. This response is still what happened here.
                tracing::warn!(
                    operation = op,
                    "the lease was taken over while the handler ran; its response was not stored"
                );
                metrics::counter!("idempotency_layer_fenced_total", "operation" => op.to_owned())
                    .increment(1);
                (Answer::Fenced, answered())
            }
            Err(error) => {
                // The claim stays until its lease expires; a retry then runs the handler again.
                tracing::error!(operation = op, %error, "response not stored; the claim stays until its lease expires");
                (Answer::NotStored, answered())
            }
        }
    }

    async fn release(&self, id: &RecordId, token: FencingToken) {
        let released = self
            .service
            .store()
            .release_leased(id, token)
            .instrument(trace::store_span(S::DB_SYSTEM, "release_leased", "DELETE"))
            .await;
        if let Err(error) = released {
            tracing::warn!(
                operation = id.operation.as_str(),
                %error,
                "claim not released; it stays until its lease expires"
            );
        }
    }
}

async fn call<I>(inner: &mut I, request: Request) -> Response
where
    I: Service<Request, Response = Response, Error = Infallible>,
{
    match inner.call(request).await {
        Ok(response) => response,
        Err(never) => match never {},
    }
}
