//! The Redis (L2) client of the operations: one per [`Operations`](super::Operations) and its
//! clones, not one per eviction.
//!
//! An admin router's operations use the client of the service they are mounted beside. The
//! operations of [`Operations::new`](super::Operations::new) (the command line's) connect
//! their own on the first eviction, and tell it to quit when their last clone is dropped:
//! before, each eviction connected a client and quit it at the end, so an eviction whose
//! future was dropped (an admin request cancelled by its client) left a connection task that
//! nothing ended.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use idempotency_cache_redis::RedisCache;
use idempotency_cache_redis::fred::interfaces::{ClientLike, KeysInterface};
use idempotency_cache_redis::fred::prelude::Client;
use idempotency_core::{BoxError, RecordId};

use super::OpsError;
use crate::Settings;
use crate::assemble::DistributedTier;

/// How long one entry's deletion may take, its connection included.
const DELETE_TIMEOUT: Duration = Duration::from_secs(5);

/// The operations' L2 client (cheap to clone: the clones share it).
#[derive(Clone)]
pub(super) struct L2(Arc<Tier>);

struct Tier {
    /// The deployment's key prefix, `None` when no L2 cache is configured.
    prefix: Option<String>,
    /// The client, once connected (or the service's, from the start).
    cache: tokio::sync::OnceCell<DistributedTier>,
    /// Whether the client is the operations' own, to quit when they are dropped.
    owned: bool,
    /// The runtime the own client was connected on (its connection task runs there): the
    /// one to quit it on.
    runtime: std::sync::OnceLock<tokio::runtime::Handle>,
    /// A service's client: set once the service quit it at its shutdown.
    closed: Option<Arc<AtomicBool>>,
}

impl std::fmt::Debug for L2 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("L2")
            .field("prefix", &self.0.prefix)
            .field("connected", &self.0.cache.initialized())
            .field("owned", &self.0.owned)
            .finish()
    }
}

impl L2 {
    /// The operations' own client for the deployment whose keys start with `prefix`,
    /// connected on first use.
    pub(super) fn own(prefix: Option<String>) -> Self {
        Self(Arc::new(Tier {
            prefix,
            cache: tokio::sync::OnceCell::new(),
            owned: true,
            runtime: std::sync::OnceLock::new(),
            closed: None,
        }))
    }

    /// A service's client, shared with it (never quit by the operations); `closed` is set
    /// once the service quit it at its shutdown.
    #[cfg(feature = "admin")]
    pub(super) fn shared(
        prefix: Option<String>,
        cache: DistributedTier,
        closed: Arc<AtomicBool>,
    ) -> Self {
        Self(Arc::new(Tier {
            prefix,
            cache: tokio::sync::OnceCell::new_with(Some(cache)),
            owned: false,
            runtime: std::sync::OnceLock::new(),
            closed: Some(closed),
        }))
    }

    /// Whether the service these operations share the client with has quit it (at its
    /// shutdown).
    pub(super) fn closed(&self) -> bool {
        self.0
            .closed
            .as_ref()
            .is_some_and(|closed| closed.load(Ordering::SeqCst))
    }

    /// The deployment's key prefix, when the L2 cache is configured.
    pub(super) fn prefix(&self) -> Option<&str> {
        self.0.prefix.as_deref()
    }

    /// The client, connected now if it was not yet; `None` when no L2 cache is configured.
    /// A configuration the client refuses (no secret, a bad URL) is an error, and the next
    /// call tries again.
    ///
    /// The connection is made in a task of its own, which stores the client even when the
    /// caller's future is dropped meanwhile: a client connected and then lost would never be
    /// told to quit.
    pub(super) async fn cache(&self, settings: &Settings) -> Result<Option<RedisCache>, OpsError> {
        if self.0.prefix.is_none() {
            return Ok(None);
        }
        if self.closed() {
            // Its deletion would wait for a client that never connects again, after the
            // record's: refused before anything is deleted.
            return Err(OpsError::ShuttingDown {
                operation: "keys evict",
                reason: "the service has shut down and quit its Redis client; nothing was \
                         deleted"
                    .to_owned(),
            });
        }
        if let Some(cache) = self.0.cache.get() {
            return Ok(cache.clone());
        }
        let tier = Arc::clone(&self.0);
        let config = settings.idempotency.distributed_cache.clone();
        let connect = tokio::spawn(async move {
            let prefix = tier.prefix.clone().unwrap_or_default();
            let cache = tier
                .cache
                .get_or_try_init(|| crate::assemble::redis_cache(&config, prefix))
                .await?
                .clone();
            if cache.is_some() {
                let _ = tier.runtime.set(tokio::runtime::Handle::current());
            }
            Ok::<_, crate::Error>(cache)
        });
        match connect.await {
            Ok(connected) => Ok(connected?),
            Err(failed) if failed.is_panic() => std::panic::resume_unwind(failed.into_panic()),
            Err(_) => Err(OpsError::ShuttingDown {
                operation: "keys evict",
                reason: "the runtime is shutting down: the Redis client was not connected"
                    .to_owned(),
            }),
        }
    }
}

/// The error of an entry's deletion that the service's shutdown left undone: it quit the
/// client after the eviction got it. Named by the entry's Redis key.
pub(super) fn quit(cache: &RedisCache, id: &RecordId) -> OpsError {
    OpsError::Cache {
        key: cache.key_for(id),
        evicted: true,
        source: "the service has shut down and quit its Redis client".into(),
    }
}

/// Deletes `id`'s entry with `cache`'s client; whether one was there. The error names the
/// entry's Redis key.
pub(super) async fn delete(cache: &RedisCache, id: &RecordId) -> Result<bool, OpsError> {
    let key = cache.key_for(id);
    let client = cache.client();
    let deleted = tokio::time::timeout(DELETE_TIMEOUT, async {
        client.wait_for_connect().await?;
        client.del::<i64, _>(key.as_str()).await
    })
    .await;
    let failed = |source: BoxError| OpsError::Cache {
        key: key.clone(),
        evicted: true,
        source,
    };
    let deleted = deleted
        .map_err(|elapsed| failed(Box::new(elapsed)))?
        .map_err(|e| failed(Box::new(e)))?;
    Ok(deleted > 0)
}

impl Drop for Tier {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        let Some(Some(cache)) = self.cache.get() else {
            return;
        };
        let client: Client = cache.client();
        // On the runtime the client runs on, wherever the operations are dropped. A runtime
        // shutting down ends the connection task itself.
        if let Some(runtime) = self.runtime.get() {
            runtime.spawn(async move {
                let _ = tokio::time::timeout(Duration::from_secs(1), client.quit()).await;
            });
        }
    }
}
