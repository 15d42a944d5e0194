//! Answering from a stored record: the caches, the committed record, and the replay itself.

use std::sync::Arc;

use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};
use idempotency_core::ResultSerializer;
use idempotency_core::cache::{DistributedCache, FailurePolicy, LocalCache};
use idempotency_core::{
    CacheError, Fingerprint, IdempotencyMetrics, IdempotencyRecord, IdempotencyService,
    IdempotencyStore, Level, RecordId, StoredOutcome, Tx,
};

use idempotency_core::trace;
use tracing::Instrument;

use super::Shared;
use crate::error::Error;
use crate::header::IDEMPOTENT_REPLAYED;
use crate::stored::StoredResponse;

type Core = idempotency_core::Error;

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
    /// The previous algorithm's fingerprint, while a transition accepts it.
    pub(super) previous_fingerprint: Option<Fingerprint>,
    /// The body is declared JSON and is not: a 4xx answer to it is the refusal of the body,
    /// never stored.
    pub(super) malformed_json: bool,
}

impl Keyed {
    /// Whether a record stored with `stored` is this request.
    pub(super) fn matches(&self, stored: &Fingerprint) -> bool {
        *stored == self.fingerprint || self.previous_fingerprint.as_ref() == Some(stored)
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
    /// The caches, then (with `lookup_before_acquire`) the committed record.
    pub(super) async fn replay_early(
        &self,
        keyed: &Keyed,
    ) -> Result<Option<(Answer, Response)>, Error> {
        if let Some(answer) = self.replay_cached(keyed).await? {
            return Ok(Some(answer));
        }
        if !self.service.config().lookup_before_acquire {
            return Ok(None);
        }
        self.replay_stored(keyed).await
    }

    /// The committed record, read outside any transaction.
    pub(super) async fn replay_stored(
        &self,
        keyed: &Keyed,
    ) -> Result<Option<(Answer, Response)>, Error> {
        let service = &self.service;
        let id = &keyed.id;
        // Boxed: the lookup acquires a pooled connection, a large future (see `Tx::begin`).
        let lookup = service.store().lookup(id).instrument(trace::store_span(
            S::DB_SYSTEM,
            "lookup",
            "SELECT",
        ));
        let Some(record) = Box::pin(lookup).await.map_err(Core::Store)? else {
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
        let hit = trace::cache_span("local", "get").in_scope(|| {
            let hit = service.local_cache().get(id);
            tracing::Span::current().record("idempotency.cache.hit", hit.is_some());
            hit
        });
        if let Some(record) = hit {
            return Ok(Some(self.replay_local(keyed, &record)));
        }
        let span = trace::cache_span("distributed", "get");
        let found = service
            .distributed_cache()
            .get(id)
            .instrument(span.clone())
            .await;
        span.record("idempotency.cache.hit", matches!(found, Ok(Some(_))));
        match found {
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
        // Counted; the cache logs its outages once per change of state, not per call.
        tracing::debug!(operation = op, %error, fail_fast, "distributed cache read failed");
        if fail_fast {
            return Err(Core::Cache(error).into());
        }
        Ok(())
    }

    /// Answers a record from L1: as [`replay`](Self::replay), with the stored response read
    /// once per cached record and kept ([`PreparedReplays`](super::prepared::PreparedReplays)).
    fn replay_local(&self, keyed: &Keyed, record: &Arc<IdempotencyRecord>) -> (Answer, Response) {
        if keyed.matches(&record.fingerprint)
            && let Some(stored) = self.prepared.get(record)
        {
            let op = keyed.id.operation.as_str();
            let metrics = self.service.metrics();
            metrics.lookup_hit(op, Level::Local);
            metrics.replayed(op, record.status());
            link_to_execution(record);
            return (Answer::Replayed(Level::Local), replayed(stored));
        }
        self.replay_with(keyed, record, Level::Local, |stored| {
            self.prepared.put(record, stored);
        })
    }

    /// Answers a stored record: the stored response, or 422 / 409.
    pub(super) fn replay(
        &self,
        keyed: &Keyed,
        record: &IdempotencyRecord,
        level: Level,
    ) -> (Answer, Response) {
        self.replay_with(keyed, record, level, |_| {})
    }

    /// [`replay`](Self::replay), handing the response it read to `read` before answering it.
    fn replay_with(
        &self,
        keyed: &Keyed,
        record: &IdempotencyRecord,
        level: Level,
        read: impl FnOnce(&StoredResponse),
    ) -> (Answer, Response) {
        let metrics = self.service.metrics();
        let op = keyed.id.operation.as_str();
        metrics.lookup_hit(op, level);
        if !keyed.matches(&record.fingerprint) {
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
            .and_then(|text| {
                self.service
                    .serializer()
                    .deserialize::<StoredResponse>(text)
                    .map_err(Error::internal)
            });
        match stored {
            Ok(stored) => {
                metrics.replayed(op, record.status());
                link_to_execution(record);
                // The allow-list again: a record from a cache or a store someone else can
                // write replays only the headers this layer would have stored.
                let stored = stored.retain_headers(&self.settings.headers);
                read(&stored);
                (Answer::Replayed(level), replayed(stored))
            }
            Err(error) => {
                tracing::error!(operation = op, "stored record holds no readable response");
                (Answer::Failed, error.into_response())
            }
        }
    }

    /// Writes a committed terminal record to L2, then L1; failures are logged and counted.
    pub(super) async fn fill_caches(&self, id: &RecordId, record: Arc<IdempotencyRecord>) {
        fill_caches(&self.service, id, record).await;
    }

    /// Registers what follows the commit of the record the layer stored in `tx`: counting it
    /// (`persisted`, and `acquired` for the optimistic mode, which claims with the commit) as
    /// a first hook ([`Tx::after_commit_first`]), so that a hook of the handler's
    /// (`IdempotentTx`) that hangs, or a request dropped meanwhile, cannot lose the count of
    /// a committed record; then filling the caches as an ordinary hook, after the handler's,
    /// which a slow cache write must not hold back.
    pub(super) fn after_stored(
        &self,
        tx: &mut Tx<S>,
        id: &RecordId,
        record: IdempotencyRecord,
        acquired: bool,
    ) {
        let (service, op, status) = (self.service.clone(), id.operation.clone(), record.status());
        tx.after_commit_first(async move {
            if acquired {
                service.metrics().acquired(op.as_str());
            }
            service.metrics().persisted(op.as_str(), status);
        });
        let (service, id) = (self.service.clone(), id.clone());
        tx.after_commit(async move { fill_caches(&service, &id, Arc::new(record)).await });
    }
}

/// Links the replay's (the layer's) span to the span that stored the response, on every
/// replay, from whichever tier.
fn link_to_execution(record: &IdempotencyRecord) {
    if let Some(execution) = &record.execution_span {
        trace::link_to_execution(&tracing::Span::current(), execution);
    }
}

/// Writes a terminal record to L2, then L1 (a failed L2 write is counted and logged).
async fn fill_caches<S, L, D, M, Z>(
    service: &IdempotencyService<S, L, D, M, Z>,
    id: &RecordId,
    record: Arc<IdempotencyRecord>,
) where
    S: IdempotencyStore,
    L: LocalCache,
    D: DistributedCache,
    M: IdempotencyMetrics,
    Z: ResultSerializer,
{
    if !record.is_terminal() {
        return;
    }
    let put = service
        .distributed_cache()
        .put(id, &record)
        .instrument(trace::cache_span("distributed", "put"))
        .await;
    if let Err(error) = put {
        let op = id.operation.as_str();
        service
            .metrics()
            .cache_error(op, Level::Distributed, &error);
        // Counted; the cache logs its outages once per change of state, not per call.
        tracing::debug!(operation = op, %error, "distributed cache write failed");
    }
    service.local_cache().put(id, record);
}

/// A stored response as a replay answers it: with `Idempotent-Replayed: true`.
fn replayed(stored: StoredResponse) -> Response {
    let mut response = stored.into_response();
    response.headers_mut().insert(
        IDEMPOTENT_REPLAYED.clone(),
        HeaderValue::from_static("true"),
    );
    response
}

pub(super) fn failed(error: Core) -> (Answer, Response) {
    (Answer::Failed, Error::from(error).into_response())
}
