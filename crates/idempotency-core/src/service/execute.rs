//! The `execute` flow: fingerprint, caches, optional find, acquire, run, store, cache after commit.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::Instrument;

use super::{Call, IdempotencyService, InFlightPolicy, Inner};
use crate::cache::{DistributedCache, FailurePolicy, LocalCache};
use crate::error::Error;
use crate::fingerprint::{Fingerprints, short_hash};
use crate::key::{Operation, RecordId};
use crate::metrics::IdempotencyMetrics;
use crate::record::{IdempotencyRecord, RecordStatus, StoredOutcome};
use crate::result::{ExecutionResult, Level, Origin, Outcome, Rejection};
use crate::serializer::{MAX_REJECTION_CODE_LEN, ResultSerializer, SerializationError};
use crate::store::{Acquire, Claim, IdempotencyStore, LockWait, StoreError};
use crate::trace::{self, SpanOutcome};
use crate::tx::Tx;

/// The span of one `execute`: operation, scope, a hash of the key (never the key), and, once
/// known, the outcome, the tier that answered and the wait for a concurrent holder.
pub(super) fn execute_span<R: ?Sized>(call: &Call<'_, R>) -> tracing::Span {
    tracing::info_span!(
        "idempotency.execute",
        idempotency.operation = call.operation,
        idempotency.scope = call.scope.as_str(),
        idempotency.key_hash = %short_hash(call.key.as_str()),
        idempotency.outcome = tracing::field::Empty,
        idempotency.tier = tracing::field::Empty,
        idempotency.wait_ms = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    )
}

/// Records the outcome and the answering tier on the current (`execute`) span.
pub(super) fn mark(outcome: SpanOutcome, tier: &'static str) {
    let span = tracing::Span::current();
    span.record("idempotency.outcome", outcome.as_str());
    span.record("idempotency.tier", tier);
}

/// Runs `future` in `span`; an error marks the span's status.
pub(super) fn traced<T, E>(
    span: tracing::Span,
    future: impl Future<Output = Result<T, E>>,
) -> impl Future<Output = Result<T, E>> {
    use futures_util::FutureExt;
    // The closure runs inside the instrumented poll, where `span` is the current span. No
    // async fn here: its arguments would be kept beside the future they are moved into, and an
    // `execute` future larger than `future_size.rs` allows.
    future
        .inspect(|result| {
            if result.is_err() {
                tracing::Span::current().record("otel.status_code", "ERROR");
            }
        })
        .instrument(span)
}

/// A call whose operation is valid and whose request is fingerprinted.
pub(super) struct Prepared {
    pub(super) id: RecordId,
    pub(super) fingerprint: Fingerprints,
    pub(super) ttl: Option<Duration>,
}

impl<S, L, D, M, Z> IdempotencyService<S, L, D, M, Z>
where
    S: IdempotencyStore,
    L: LocalCache,
    D: DistributedCache,
    M: IdempotencyMetrics,
    Z: ResultSerializer,
{
    /// Runs `action` at most once for the call's key, in a transaction the service begins and
    /// commits. See [`execute_in`](Self::execute_in) for the steps.
    ///
    /// A replay from a cache (or, with `lookup_before_acquire`, from the committed record) needs
    /// no transaction at all: the transaction begins only when the key must be acquired. On any
    /// error the transaction is rolled back: the action's changes and the record go away
    /// together, and a retry with the same key runs from scratch.
    pub fn execute<R, T, E, A>(
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
        traced(execute_span(&call), self.execute_untraced(call, action))
    }

    async fn execute_untraced<R, T, E, A>(
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
        // Bad input is refused before any I/O.
        let prepared = inner.prepare(call)?;
        if let Some(prepared) = &prepared {
            let early = if inner.config.lookup_before_acquire {
                self.replay_committed(&prepared.id, &prepared.fingerprint)
                    .await?
            } else {
                inner
                    .replay_cached(&prepared.id, &prepared.fingerprint)
                    .await?
            };
            if let Some(outcome) = early {
                return Ok(outcome);
            }
        }
        let mut tx = self.begin().await.map_err(Error::Store)?;
        let result = match prepared {
            Some(prepared) => self.acquire_and_run(&mut tx, prepared, action).await,
            None => action(tx.connection())
                .await
                .map(|r| Outcome::new(r, Origin::Executed)),
        };
        match result {
            Ok(outcome) => {
                tx.commit().await.map_err(Error::Store)?;
                Ok(outcome)
            }
            Err(error) => {
                if let Err(rollback) = tx.rollback().await {
                    tracing::warn!(error = %rollback, "rollback after a failed execute failed");
                }
                Err(error)
            }
        }
    }

    /// Runs `action` at most once for the call's key, inside the caller's transaction `tx`.
    ///
    /// 1. Fingerprints the request (RFC 8785 canonical JSON, hashed).
    /// 2. Looks the key up in L1, then L2 (an L2 hit is copied to L1).
    /// 3. Optionally (`lookup_before_acquire`) looks it up in the store.
    /// 4. Inserts a `PROCESSING` record. If the key exists, replays the committed outcome; if a
    ///    concurrent transaction holds it, waits for it within the in-flight policy.
    /// 5. Runs `action` on the transaction's connection and stores its outcome (success or
    ///    rejection) on the record. An `Err` from the action is returned as is: the caller must
    ///    roll back, which removes the record too (a `tx.commit()` instead rolls back and
    ///    returns [`StoreError::UnfinishedClaim`](crate::StoreError::UnfinishedClaim), so a
    ///    `PROCESSING` record never commits).
    /// 6. Registers the cache writes on `tx`: they happen after `tx.commit()` succeeds.
    ///
    /// A replay checks the fingerprint first: the same key with another payload is
    /// [`Error::PayloadConflict`]. After any error the transaction may be unusable (PostgreSQL
    /// aborts it after a failed statement): roll it back. A store statement that failed here
    /// poisons `tx`, so a `tx.commit()` rolls back and returns
    /// [`StoreError::Poisoned`](crate::StoreError::Poisoned) instead of committing half of it.
    pub async fn execute_in<R, T, E, A>(
        &self,
        tx: &mut Tx<S>,
        call: Call<'_, R>,
        action: A,
    ) -> Result<Outcome<T>, E>
    where
        R: Serialize + ?Sized,
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        A: AsyncFnOnce(&mut S::Connection) -> Result<ExecutionResult<T>, E>,
    {
        traced(
            execute_span(&call),
            self.execute_in_untraced(tx, call, action),
        )
        .await
    }

    async fn execute_in_untraced<R, T, E, A>(
        &self,
        tx: &mut Tx<S>,
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
        let Some(prepared) = inner.prepare(call)? else {
            let result = action(tx.connection()).await?;
            return Ok(Outcome::new(result, Origin::Executed));
        };
        if let Some(outcome) = inner
            .replay_cached(&prepared.id, &prepared.fingerprint)
            .await?
        {
            return Ok(outcome);
        }
        if inner.config.lookup_before_acquire {
            let found = inner
                .store
                .find(tx.connection(), &prepared.id)
                .instrument(trace::store_span(S::DB_SYSTEM, "find", "SELECT"))
                .await;
            if let Some(record) = tx.watch(found).map_err(Error::from)? {
                return Ok(self.replay_stored(tx, prepared.id, record, &prepared.fingerprint)?);
            }
        }
        self.acquire_and_run(tx, prepared, action).await
    }

    /// Step 4 and on: the acquire loop, then the action.
    async fn acquire_and_run<T, E, A>(
        &self,
        tx: &mut Tx<S>,
        prepared: Prepared,
        action: A,
    ) -> Result<Outcome<T>, E>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        A: AsyncFnOnce(&mut S::Connection) -> Result<ExecutionResult<T>, E>,
    {
        let inner = &*self.inner;
        let Prepared {
            id,
            fingerprint,
            ttl,
        } = prepared;
        let op = id.operation.as_str();
        let claim = Claim {
            id: &id,
            fingerprint: &fingerprint.current,
            ttl,
            wait: inner.lock_wait(),
        };
        let attempts = inner.config.max_acquire_attempts.max(1);
        for _ in 0..attempts {
            let started = Instant::now();
            // Counted before the insert is sent, undone when the store answers that it took
            // nothing: a caller's future dropped while the insert is on the wire leaves a claim
            // this `Tx` cannot see, and its commit must refuse it as any unfinished claim.
            tx.claim_started();
            let acquired = inner
                .store
                .acquire(tx.connection(), &claim)
                .instrument(trace::store_span(S::DB_SYSTEM, "acquire", "INSERT"))
                .await;
            let waited = started.elapsed();
            inner.metrics.acquire_wait(op, waited);
            tracing::Span::current().record("idempotency.wait_ms", waited.as_secs_f64() * 1e3);
            let acquired = tx.watch(acquired);
            if !matches!(acquired, Ok(Acquire::Acquired)) {
                tx.claim_completed();
            }
            match acquired {
                Ok(Acquire::Acquired) => {
                    inner.metrics.acquired(op);
                    return self.run(tx, id, fingerprint, action).await;
                }
                Ok(Acquire::Exists) => {
                    inner.metrics.acquire_conflict(op);
                    let found = inner
                        .store
                        .find(tx.connection(), &id)
                        .instrument(trace::store_span(S::DB_SYSTEM, "find", "SELECT"))
                        .await;
                    if let Some(record) = tx.watch(found).map_err(Error::from)? {
                        return Ok(self.replay_stored(tx, id, record, &fingerprint)?);
                    }
                    tracing::debug!(
                        operation = op,
                        "record vanished between insert and find; retrying"
                    );
                }
                Err(StoreError::LockTimeout(_)) => {
                    inner.metrics.in_flight(op);
                    mark(SpanOutcome::InFlight, Level::Persistence.as_str());
                    return Err(Error::InFlight.into());
                }
                Err(error) => return Err(Error::Store(error).into()),
            }
        }
        Err(Error::AcquireExhausted { attempts }.into())
    }

    /// Caches, then a committed-record lookup outside any transaction; `None` when nothing is
    /// stored yet.
    pub(super) async fn replay_committed<T: DeserializeOwned>(
        &self,
        id: &RecordId,
        fingerprint: &Fingerprints,
    ) -> Result<Option<Outcome<T>>, Error> {
        let inner = &*self.inner;
        if let Some(outcome) = inner.replay_cached(id, fingerprint).await? {
            return Ok(Some(outcome));
        }
        // Boxed like `Tx::begin`: the lookup acquires a pooled connection, a large future.
        let lookup =
            inner
                .store
                .lookup(id)
                .instrument(trace::store_span(S::DB_SYSTEM, "lookup", "SELECT"));
        let Some(record) = Box::pin(lookup).await? else {
            return Ok(None);
        };
        if !record.is_terminal() {
            inner.metrics.in_flight(id.operation.as_str());
            mark(SpanOutcome::InFlight, Level::Persistence.as_str());
            return Err(Error::InFlight);
        }
        let record = Arc::new(record);
        let outcome = inner.replay(id, &record, fingerprint, Level::Persistence)?;
        inner.fill_caches(id, record).await;
        Ok(Some(outcome))
    }

    /// Step 5 and 6: run the action, store its outcome, schedule the cache writes.
    async fn run<T, E, A>(
        &self,
        tx: &mut Tx<S>,
        id: RecordId,
        fingerprint: Fingerprints,
        action: A,
    ) -> Result<Outcome<T>, E>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        A: AsyncFnOnce(&mut S::Connection) -> Result<ExecutionResult<T>, E>,
    {
        let inner = &*self.inner;
        let result = action(tx.connection()).await?;
        let stored = inner.encode(&result)?;
        // The execute span (current here), for the span link of later replays.
        let completed = inner
            .store
            .complete(tx.connection(), &id, &stored, trace::SpanRef::current())
            .instrument(trace::store_span(S::DB_SYSTEM, "complete", "UPDATE"))
            .await;
        let record = tx.watch(completed).map_err(Error::from)?;
        tx.claim_completed();
        if record.fingerprint != fingerprint.current {
            tx.poison();
            return Err(Error::Store(StoreError::Corrupt {
                reason: "completed record carries another fingerprint".to_owned(),
            })
            .into());
        }
        let status = stored.status();
        mark(
            match status {
                RecordStatus::Rejected => SpanOutcome::Rejected,
                _ => SpanOutcome::Executed,
            },
            "action",
        );
        // Counted first among the hooks (the caller's hooks registered before `execute_in`
        // may hang); the caches are filled in turn, after those.
        let service = Arc::clone(&self.inner);
        let op = id.operation.clone();
        tx.after_commit_first(async move { service.metrics.persisted(op.as_str(), status) });
        let service = Arc::clone(&self.inner);
        let record = Arc::new(record);
        tx.after_commit(async move { service.fill_caches(&id, record).await });
        Ok(Outcome::new(result, Origin::Executed))
    }

    /// Replays a record found in the store; fills the caches after the commit.
    fn replay_stored<T: DeserializeOwned>(
        &self,
        tx: &mut Tx<S>,
        id: RecordId,
        record: IdempotencyRecord,
        fingerprint: &Fingerprints,
    ) -> Result<Outcome<T>, Error> {
        let inner = &*self.inner;
        if !record.is_terminal() {
            // Only visible if a PROCESSING record was committed, which the store contract forbids.
            inner.metrics.in_flight(id.operation.as_str());
            mark(SpanOutcome::InFlight, Level::Persistence.as_str());
            return Err(Error::InFlight);
        }
        let record = Arc::new(record);
        let outcome = inner.replay(&id, &record, fingerprint, Level::Persistence)?;
        let service = Arc::clone(&self.inner);
        tx.after_commit(async move {
            service.fill_caches(&id, record).await;
        });
        Ok(outcome)
    }
}

impl<S, L, D, M, Z> Inner<S, L, D, M, Z>
where
    S: IdempotencyStore,
    L: LocalCache,
    D: DistributedCache,
    M: IdempotencyMetrics,
    Z: ResultSerializer,
{
    /// Validates the operation and, when the service is enabled, fingerprints the request.
    /// `None` means idempotency is disabled: run the action as is.
    pub(super) fn prepare<R: Serialize + ?Sized>(
        &self,
        call: Call<'_, R>,
    ) -> Result<Option<Prepared>, Error> {
        let operation = Operation::new(call.operation)?;
        if !self.config.enabled {
            return Ok(None);
        }
        let fingerprint = self.fingerprint_of(call.request)?;
        let ttl = self.ttl_for(&call);
        if let Some(ttl) = ttl
            && ttl > super::MAX_TTL
        {
            return Err(Error::InvalidTtl {
                ttl,
                max: super::MAX_TTL,
            });
        }
        let id = RecordId::new(operation, call.scope, call.key);
        tracing::debug!(
            operation = id.operation.as_str(),
            key_hash = %short_hash(id.key.as_str()),
            "idempotent call"
        );
        Ok(Some(Prepared {
            id,
            fingerprint,
            ttl,
        }))
    }

    pub(super) fn fingerprint_of<R: Serialize + ?Sized>(
        &self,
        request: &R,
    ) -> Result<Fingerprints, Error> {
        let request = serde_json::to_value(request)
            .map_err(|e| Error::Fingerprint(crate::FingerprintError::Serialize(e)))?;
        Ok(Fingerprints {
            current: self.fingerprint.fingerprint(&request)?,
            previous: self.fingerprint.previous_fingerprint(&request)?,
        })
    }

    /// Step 2: L1, then L2 (an L2 hit is copied to L1). A failing L2 is a miss under
    /// `fail-open`, an error under `fail-fast` (a corrupt entry is a miss under both).
    pub(super) async fn replay_cached<T: DeserializeOwned>(
        &self,
        id: &RecordId,
        fingerprint: &Fingerprints,
    ) -> Result<Option<Outcome<T>>, Error> {
        let hit = trace::cache_span("local", "get").in_scope(|| {
            let hit = self.local.get(id);
            tracing::Span::current().record("idempotency.cache.hit", hit.is_some());
            hit
        });
        if let Some(record) = hit {
            return self
                .replay(id, &record, fingerprint, Level::Local)
                .map(Some);
        }
        let op = id.operation.as_str();
        let span = trace::cache_span("distributed", "get");
        let found = self.distributed.get(id).instrument(span.clone()).await;
        span.record("idempotency.cache.hit", matches!(found, Ok(Some(_))));
        match found {
            Ok(Some(record)) => {
                let record = Arc::new(record);
                let outcome = self.replay(id, &record, fingerprint, Level::Distributed)?;
                trace::cache_span("local", "put").in_scope(|| self.local.put(id, record));
                Ok(Some(outcome))
            }
            Ok(None) => Ok(None),
            Err(error) => {
                self.metrics.cache_error(op, Level::Distributed, &error);
                let fail_fast = self.distributed.failure_policy() == FailurePolicy::FailFast
                    && !matches!(error, crate::CacheError::Corrupt(_));
                // Counted; the cache logs its outages once per change of state, not per call.
                tracing::debug!(operation = op, error = %error, fail_fast, "distributed cache read failed");
                if fail_fast {
                    Err(Error::Cache(error))
                } else {
                    Ok(None)
                }
            }
        }
    }

    pub(super) fn ttl_for<R: ?Sized>(&self, call: &Call<'_, R>) -> Option<Duration> {
        match call.ttl {
            Some(ttl) => ttl,
            None => self
                .config
                .operation_ttls
                .get(call.operation)
                .copied()
                .unwrap_or(self.config.default_ttl),
        }
    }

    pub(super) fn lock_wait(&self) -> LockWait {
        match self.config.in_flight {
            InFlightPolicy::Wait { timeout: None } => LockWait::Unbounded,
            InFlightPolicy::Wait {
                timeout: Some(timeout),
            } => LockWait::Timeout(timeout),
            InFlightPolicy::Reject => LockWait::NoWait,
        }
    }

    /// The stored form of `result`; refuses a rejection code that cannot be stored and stored
    /// text nested deeper than [`MAX_JSON_DEPTH`](crate::MAX_JSON_DEPTH), before any write.
    pub(super) fn encode<T: Serialize>(
        &self,
        result: &ExecutionResult<T>,
    ) -> Result<StoredOutcome, Error> {
        Ok(match result {
            ExecutionResult::Success(value) => StoredOutcome::Completed {
                payload: self.stored_text(value)?,
            },
            ExecutionResult::Rejected(rejection) => StoredOutcome::Rejected {
                code: {
                    let len = rejection.code().chars().count();
                    if len == 0 || len > MAX_REJECTION_CODE_LEN {
                        return Err(SerializationError::RejectionCode { len }.into());
                    }
                    rejection.code().to_owned()
                },
                details: rejection
                    .details()
                    .map(|details| self.stored_text(details))
                    .transpose()?,
            },
        })
    }

    /// The serializer's text of `value`, checked against [`MAX_JSON_DEPTH`](crate::MAX_JSON_DEPTH)
    /// as it will be stored (a wrapping serializer's envelope counts).
    fn stored_text<T: Serialize + ?Sized>(&self, value: &T) -> Result<String, SerializationError> {
        let text = self.serializer.serialize(value)?;
        crate::check_json_depth(&text)?;
        Ok(text)
    }

    /// Checks the fingerprint and decodes a terminal record.
    pub(super) fn replay<T: DeserializeOwned>(
        &self,
        id: &RecordId,
        record: &Arc<IdempotencyRecord>,
        fingerprint: &Fingerprints,
        level: Level,
    ) -> Result<Outcome<T>, Error> {
        let op = id.operation.as_str();
        self.metrics.lookup_hit(op, level);
        if !fingerprint.accepts(&record.fingerprint) {
            self.metrics.payload_conflict(op);
            mark(SpanOutcome::Conflict, level.as_str());
            tracing::debug!(operation = op, level = level.as_str(), "payload conflict");
            return Err(Error::PayloadConflict);
        }
        // A success whose stored text is what serde_json writes for its value keeps the record,
        // so that an HTTP answer sends the stored bytes instead of serializing the value again.
        let mut stored_json = false;
        let result = match &record.outcome {
            Some(StoredOutcome::Completed { payload }) => {
                stored_json = self.serializer.stores_plain_json()
                    && crate::serializer::is_compact_json(payload);
                ExecutionResult::Success(self.serializer.deserialize(payload)?)
            }
            Some(StoredOutcome::Rejected { code, details }) => {
                let details = details
                    .as_deref()
                    .map(|text| self.serializer.deserialize(text))
                    .transpose()?;
                ExecutionResult::Rejected(Rejection::from_parts(code.clone(), details))
            }
            None => {
                self.metrics.in_flight(op);
                mark(SpanOutcome::InFlight, level.as_str());
                return Err(Error::InFlight);
            }
        };
        self.metrics.replayed(op, record.status());
        mark(SpanOutcome::Replayed, level.as_str());
        if let Some(execution) = &record.execution_span {
            trace::link_to_execution(&tracing::Span::current(), execution);
        }
        tracing::debug!(operation = op, level = level.as_str(), "replayed");
        let outcome = Outcome::new(result, Origin::Replayed { from: level });
        Ok(if stored_json {
            outcome.with_stored_json(Arc::clone(record))
        } else {
            outcome
        })
    }

    /// Writes a terminal record to L2, then L1. Never fails: a cache write error is counted
    /// (and logged at `debug`), because the record is already committed.
    pub(super) async fn fill_caches(&self, id: &RecordId, record: Arc<IdempotencyRecord>) {
        if !record.is_terminal() {
            return;
        }
        let put = self
            .distributed
            .put(id, &record)
            .instrument(trace::cache_span("distributed", "put"))
            .await;
        if let Err(error) = put {
            self.metrics
                .cache_error(id.operation.as_str(), Level::Distributed, &error);
            // Counted; the cache logs its outages once per change of state, not per call.
            tracing::debug!(operation = id.operation.as_str(), error = %error, "distributed cache write failed");
        }
        trace::cache_span("local", "put").in_scope(|| self.local.put(id, record));
    }
}
