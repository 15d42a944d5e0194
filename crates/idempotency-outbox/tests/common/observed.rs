//! A store wrapper that observes the real outbox: claims counted, purges timed.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::time::{Duration, Instant};

use idempotency_outbox::Error;
use idempotency_outbox::store::{
    ClaimRequest, Claimed, Failure, Housekeeping, OutboxStats, RelayStore,
};
use idempotency_pg::PgOutbox;
use uuid::Uuid;

/// The real outbox, counting finished `claim` calls (each one is a worker wake-up that reached
/// the database) and recording when each `delete_published` (one per purge) was called.
#[derive(Clone)]
pub struct Observed {
    pub inner: PgOutbox,
    pub claims: Arc<AtomicU64>,
    pub purges: Arc<std::sync::Mutex<Vec<Instant>>>,
}

impl Observed {
    pub fn new(inner: PgOutbox) -> Self {
        Self {
            inner,
            claims: Arc::new(AtomicU64::new(0)),
            purges: Arc::new(std::sync::Mutex::new(Vec::new())),
        }
    }
}

impl RelayStore for Observed {
    type Listener = <PgOutbox as RelayStore>::Listener;

    async fn claim(&self, request: &ClaimRequest) -> Result<Claimed, Error> {
        let claimed = self.inner.claim(request).await;
        self.claims.fetch_add(1, AtomicOrdering::SeqCst);
        claimed
    }

    async fn mark_published(&self, token: Uuid, ids: &[Uuid]) -> Result<u64, Error> {
        self.inner.mark_published(token, ids).await
    }

    async fn mark_failed(&self, token: Uuid, failures: &[Failure]) -> Result<u64, Error> {
        self.inner.mark_failed(token, failures).await
    }

    async fn listen(&self) -> Result<Option<Self::Listener>, Error> {
        self.inner.listen().await
    }
}

impl Housekeeping for Observed {
    async fn stats(&self) -> Result<OutboxStats, Error> {
        self.inner.stats().await
    }

    async fn delete_published(&self, older_than: Duration, limit: u32) -> Result<u64, Error> {
        self.purges.lock().unwrap().push(Instant::now());
        self.inner.delete_published(older_than, limit).await
    }

    async fn delete_dead_lettered(&self, older_than: Duration, limit: u32) -> Result<u64, Error> {
        self.inner.delete_dead_lettered(older_than, limit).await
    }
}
