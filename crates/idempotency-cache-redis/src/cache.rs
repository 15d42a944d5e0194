//! [`RedisCache`]: the `DistributedCache` on fred.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use crate::config::{DistributedCacheConfig, WriteBehindConfig};
use fred::clients::Client;
use fred::error::ErrorKind;
use fred::interfaces::{ClientLike, KeysInterface};
use fred::prelude::Expiration;
use idempotency_core::{
    BoxError, CacheError, DistributedCache, FailurePolicy, IdempotencyRecord, RecordId,
};

use crate::breaker::{Breaker, BreakerState};
use crate::codec::{self, Decoded};
use crate::key::redis_key;
use crate::sign::Signer;
use crate::write_behind::{self, Entry, Queue};

/// Setting up the cache failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The Redis URL or client configuration is invalid.
    #[error("invalid Redis configuration")]
    Config(#[source] fred::error::Error),
    /// No node of a Redis Cluster URL accepted a connection at start-up.
    #[error("no node of the Redis Cluster {url} accepts a connection")]
    Unreachable {
        /// The URL, its password replaced by `***`.
        url: String,
    },
}

/// Counts of what went wrong, for the application to read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RedisCacheStats {
    /// Calls that did not finish within the timeout.
    pub timeouts: u64,
    /// Calls that failed in Redis or on the connection.
    pub errors: u64,
    /// Calls refused because the breaker was open.
    pub short_circuited: u64,
    /// Corrupt entries found (and deleted), forged ones included.
    pub corrupt: u64,
    /// Entries whose HMAC tag did not verify (written without the secret, or copied from
    /// another key), found and deleted; each is also counted in `corrupt`.
    pub forged: u64,
    /// Write-behind: entries `put` queued for the background writer. A batch that fails counts
    /// once in `timeouts`, `errors` or `short_circuited`, and its entries in `unwritten`.
    pub queued: u64,
    /// Write-behind: entries `put` wrote itself, waiting for Redis, because the queue was full
    /// (or its writer had stopped with its runtime).
    pub not_queued: u64,
    /// Write-behind: entries of batches that failed. Some of them may have reached Redis; the
    /// others are not cached, and replays of them read the database.
    pub unwritten: u64,
}

#[derive(Debug, Default)]
struct Counters {
    timeouts: AtomicU64,
    errors: AtomicU64,
    short_circuited: AtomicU64,
    corrupt: AtomicU64,
    forged: AtomicU64,
    queued: AtomicU64,
    not_queued: AtomicU64,
    unwritten: AtomicU64,
}

/// The L2 cache: shared between instances, on Redis through fred.
///
/// Works with any fred client the application already has (`Client`, `Pool`, a clustered or
/// sentinel client: anything that implements `KeysInterface`). Every call is bounded by
/// `timeout`; after `failure-threshold` consecutive failures a circuit breaker stops calling Redis
/// for `cool-down`, so a dead or hanging Redis costs at most one timeout per request, then none.
/// What a read failure means for the request is the `failure-policy` (see the crate docs). With
/// `write-behind` on, a `put` queues the entry and returns at once; a background task writes the
/// queue in batches ([`WriteBehindConfig`](crate::WriteBehindConfig)).
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use idempotency_cache_redis::RedisCache;
/// use idempotency_cache_redis::DistributedCacheConfig;
///
/// let cache = RedisCache::connect("redis://127.0.0.1:6379", &DistributedCacheConfig::default())?;
/// // IdempotencyService::builder(store).distributed_cache(cache).build()
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisCache<C = Client> {
    client: C,
    prefix: Arc<str>,
    ttl: Duration,
    timeout: Duration,
    policy: FailurePolicy,
    breaker: Arc<Breaker>,
    counters: Arc<Counters>,
    /// Tags entries with `secret` (see [`DistributedCacheConfig::secret`]).
    signer: Signer,
    /// The write-behind queue; `None` when it is off, and in the writer's own copy.
    write_behind: Option<Arc<Queue>>,
}

impl<C> RedisCache<C>
where
    C: KeysInterface + Clone + Send + Sync + 'static,
{
    /// A cache over an existing fred client, configured by `idempotency.distributed-cache`.
    ///
    /// Without [`secret`](DistributedCacheConfig::secret) the entries' tags have no key: they
    /// detect damage, not forgery, and whoever can write to the Redis can make the service
    /// replay a response of their choosing; a warning says so. The `idempotency` facade
    /// refuses an enabled cache without a secret.
    pub fn new(client: C, config: &DistributedCacheConfig) -> Self {
        if config.secret.is_none() {
            tracing::warn!(
                "distributed cache without a secret: its entries are not authenticated, and \
                 whoever can write to this Redis can forge replays; set \
                 idempotency.distributed-cache.secret"
            );
        }
        Self {
            signer: Signer::new(config.secret.as_ref()),
            client,
            prefix: Arc::from(config.key_prefix.as_str()),
            ttl: config.ttl,
            timeout: config.timeout,
            policy: config.failure_policy,
            breaker: Arc::new(Breaker::new(
                config.circuit_breaker.failure_threshold,
                config.circuit_breaker.cool_down,
                // A trial that runs is over after one timeout; one that has not reported after
                // the cool-down plus the timeout is held by a future nobody polls any more.
                config
                    .circuit_breaker
                    .cool_down
                    .saturating_add(config.timeout),
            )),
            counters: Arc::new(Counters::default()),
            write_behind: config
                .write_behind
                .enabled
                .then(|| Arc::new(Queue::new(config.write_behind.clone()))),
        }
    }

    /// The fred client.
    pub fn client(&self) -> &C {
        &self.client
    }

    /// The Redis key of a record.
    pub fn key_for(&self, id: &RecordId) -> String {
        redis_key(&self.prefix, id)
    }

    /// The circuit breaker's state.
    pub fn breaker_state(&self) -> BreakerState {
        self.breaker.state()
    }

    /// What went wrong so far.
    pub fn stats(&self) -> RedisCacheStats {
        RedisCacheStats {
            timeouts: self.counters.timeouts.load(Ordering::Relaxed),
            errors: self.counters.errors.load(Ordering::Relaxed),
            short_circuited: self.counters.short_circuited.load(Ordering::Relaxed),
            corrupt: self.counters.corrupt.load(Ordering::Relaxed),
            forged: self.counters.forged.load(Ordering::Relaxed),
            queued: self.counters.queued.load(Ordering::Relaxed),
            not_queued: self.counters.not_queued.load(Ordering::Relaxed),
            unwritten: self.counters.unwritten.load(Ordering::Relaxed),
        }
    }

    /// Runs one Redis call, made by `make`, through the breaker and the timeout.
    ///
    /// The call is made only once the breaker lets it through, and lives on the heap: a fred
    /// command future is about 5 KiB, and held inline it would make every future that awaits a
    /// cache (up to the HTTP handler's, which the server moves into a box per request) that much
    /// larger, cache hit or not.
    async fn call<T, F>(&self, make: impl FnOnce() -> F) -> Result<T, CacheError>
    where
        F: Future<Output = Result<T, fred::error::Error>>,
    {
        let Some(permit) = self.breaker.allow() else {
            self.counters
                .short_circuited
                .fetch_add(1, Ordering::Relaxed);
            return Err(CacheError::CircuitOpen);
        };
        // Cancelled at this `.await`, the permit is dropped unreported: a failure.
        match tokio::time::timeout(self.timeout, Box::pin(make())).await {
            Ok(Ok(value)) => {
                permit.success();
                Ok(value)
            }
            Ok(Err(error)) => {
                permit.failure();
                self.counters.errors.fetch_add(1, Ordering::Relaxed);
                Err(CacheError::Backend(Box::new(error)))
            }
            Err(_) => {
                permit.failure();
                self.counters.timeouts.fetch_add(1, Ordering::Relaxed);
                Err(CacheError::Timeout(self.timeout))
            }
        }
    }

    /// How long an entry may live, from now: the TTL, or less if its record expires sooner;
    /// in milliseconds, `None` when nothing is left of it.
    fn lifetime_ms(&self, expires_at: Option<SystemTime>) -> Option<i64> {
        let lifetime = match expires_at {
            Some(at) => at
                .duration_since(SystemTime::now())
                .unwrap_or(Duration::ZERO)
                .min(self.ttl),
            None => self.ttl,
        };
        let millis = i64::try_from(lifetime.as_millis()).unwrap_or(i64::MAX);
        (millis > 0).then_some(millis)
    }

    /// `SET key value PX lifetime`; nothing when the record has expired meanwhile. Takes the
    /// entry, so its key and value move into the command without a copy.
    async fn write(&self, entry: Entry) -> Result<(), fred::error::Error> {
        let Some(millis) = self.lifetime_ms(entry.expires_at) else {
            return Ok(());
        };
        self.client
            .set::<(), _, _>(
                entry.key,
                entry.value,
                Some(Expiration::PX(millis)),
                None,
                false,
            )
            .await
    }

    /// Starts the write-behind writer on `receiver`, in the caller's runtime. Without one the
    /// receiver is dropped, so every entry comes back to `put`, which writes it itself.
    fn start_writer(
        &self,
        receiver: tokio::sync::mpsc::Receiver<Entry>,
        config: WriteBehindConfig,
    ) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        // The writer's copy has no queue: the queue's sender lives in the caller's copies only,
        // so the writer ends once they are all gone.
        let writer = Self {
            write_behind: None,
            ..self.clone()
        };
        runtime.spawn(async move {
            let mut receiver = receiver;
            let mut batch = Vec::with_capacity(config.max_batch.get());
            while write_behind::next_batch(&mut receiver, &config, &mut batch).await {
                writer.write_batch(&mut batch).await;
            }
        });
    }

    /// Writes (and empties) a batch with one call: its `SET`s are sent together, under one
    /// timeout and one breaker permit. A failure (the first error ends the call) counts the
    /// whole batch as unwritten.
    async fn write_batch(&self, batch: &mut Vec<Entry>) {
        let entries = u64::try_from(batch.len()).unwrap_or(u64::MAX);
        let sets = batch.drain(..).map(|entry| self.write(entry));
        if let Err(error) = self.call(|| futures_util::future::try_join_all(sets)).await {
            self.counters
                .unwritten
                .fetch_add(entries, Ordering::Relaxed);
            tracing::warn!(entries, %error, "distributed cache write-behind failed");
        }
    }
}

impl<C> DistributedCache for RedisCache<C>
where
    C: KeysInterface + Clone + Send + Sync + 'static,
{
    async fn get(&self, id: &RecordId) -> Result<Option<IdempotencyRecord>, CacheError> {
        let key = self.key_for(id);
        let found = self.call(|| read(&self.client, &key)).await?;
        let corrupt: BoxError = match found {
            Found::Nothing => return Ok(None),
            Found::OtherType(error) => Box::new(error),
            Found::Value(bytes) => match String::from_utf8(bytes) {
                Err(error) => Box::new(error),
                Ok(value) => match codec::decode(id, &value, &self.signer) {
                    Decoded::Record(record) => return Ok(Some(record)),
                    Decoded::OtherVersion => return Ok(None),
                    Decoded::Corrupt(error) => Box::new(error),
                    Decoded::Forged => {
                        self.counters.forged.fetch_add(1, Ordering::Relaxed);
                        Box::new(Forged)
                    }
                },
            },
        };
        self.counters.corrupt.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            operation = id.operation.as_str(),
            error = %corrupt,
            "corrupt idempotency cache entry; deleting it"
        );
        let _: Result<i64, _> = self.call(|| self.client.del(key.as_str())).await;
        Err(CacheError::Corrupt(corrupt))
    }

    async fn put(&self, id: &RecordId, record: &IdempotencyRecord) -> Result<(), CacheError> {
        if self.lifetime_ms(record.expires_at).is_none() {
            return Ok(());
        }
        let Some(value) = codec::encode(id, record, &self.signer)
            .map_err(|e| CacheError::Corrupt(Box::new(e)))?
        else {
            return Ok(()); // PROCESSING: never cached
        };
        let entry = Entry {
            key: self.key_for(id),
            value,
            expires_at: record.expires_at,
        };
        let entry = match &self.write_behind {
            None => entry,
            Some(queue) => {
                let start = |receiver| self.start_writer(receiver, queue.config().clone());
                match queue.offer(entry, start) {
                    Ok(()) => {
                        self.counters.queued.fetch_add(1, Ordering::Relaxed);
                        return Ok(());
                    }
                    Err(refused) => {
                        self.counters.not_queued.fetch_add(1, Ordering::Relaxed);
                        refused
                    }
                }
            }
        };
        self.call(|| self.write(entry)).await
    }

    fn failure_policy(&self) -> FailurePolicy {
        self.policy
    }
}

/// An entry whose tag does not verify.
#[derive(Debug, thiserror::Error)]
#[error("the entry's tag does not verify (written without the secret, or for another record)")]
struct Forged;

/// What a `GET` found at a key.
enum Found {
    Nothing,
    /// The raw value: not necessarily UTF-8 if someone else wrote it.
    Value(Vec<u8>),
    /// The key holds a list, a hash, ... (Redis's `WRONGTYPE` reply).
    OtherType(fred::error::Error),
}

/// `GET key`. Redis's `WRONGTYPE` reply is an answer about the entry, not a failure of Redis:
/// it comes back as [`Found::OtherType`], so the breaker counts the call as a success. It is the
/// only `InvalidArgument` error a `GET` of a string key can get.
async fn read<C: KeysInterface>(client: &C, key: &str) -> Result<Found, fred::error::Error> {
    match client.get::<Option<Vec<u8>>, _>(key).await {
        Ok(value) => Ok(value.map_or(Found::Nothing, Found::Value)),
        Err(error) if *error.kind() == ErrorKind::InvalidArgument => Ok(Found::OtherType(error)),
        Err(error) => Err(error),
    }
}

impl<C> fmt::Debug for RedisCache<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisCache")
            .field("prefix", &self.prefix)
            .field("ttl", &self.ttl)
            .field("timeout", &self.timeout)
            .field("policy", &self.policy)
            .field("breaker", &self.breaker.state())
            .field("write_behind", &self.write_behind.is_some())
            .finish_non_exhaustive()
    }
}

/// Whether the client currently has a connection (for health checks).
pub fn is_connected<C: ClientLike>(client: &C) -> bool {
    client.is_connected()
}
