//! [`RedisCache`]: the `DistributedCache` on fred.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::config::{DistributedCacheConfig, WriteBehindConfig};
use crate::error::Error;
use fred::clients::Client;
use fred::clients::WithOptions;
use fred::error::ErrorKind;
use fred::interfaces::{ClientLike, KeysInterface};
use fred::prelude::{Expiration, Options};
use idempotency_core::{
    BoxError, CacheError, DistributedCache, FailurePolicy, IdempotencyRecord, RecordId,
};

use crate::breaker::{Breaker, BreakerState};
use crate::codec::{self, Decoded};
use crate::key::redis_key;
use crate::refresh::Refresh;
use crate::sign::Signer;
use crate::write_behind::{self, Entry, Queue};

/// The counter of write-behind entries, label `outcome`: `queued` (by `put`, for the writer),
/// `not_queued` (the queue was full: `put` wrote the entry itself), `unwritten` (in a batch that
/// failed) and `expired_in_queue` (dropped unwritten, its record expired while queued). The same
/// counts as [`RedisCacheStats`], sent to the `metrics` recorder the application installed (the
/// `idempotency` facade's Prometheus exporter): the service's own meters only see `put`, which
/// succeeds once the entry is queued.
pub const WRITE_BEHIND_METRIC: &str = "idempotency_cache_write_behind_entries_total";

/// The counter of circuit-breaker changes of state, labels `breaker` (`requests`: reads;
/// `writes`: the `put`s that write themselves and the write-behind writer) and `state` (the
/// state entered: `open`, `half_open`, `closed`). Each change is also logged once (see the crate
/// docs, "Logs during an outage").
pub const BREAKER_METRIC: &str = "idempotency_cache_breaker_transitions_total";

/// The counter of Redis outages as the cache's reads see them, label `state`: `lost` (a read
/// failed after one succeeded: logged once at `warn`) and `back` (a read succeeded after
/// failures: logged once at `info`). Failed writes open the breaker of writes instead
/// ([`BREAKER_METRIC`]). The calls that failed in between are counted in
/// [`RedisCacheStats`] and the service's `idempotency_cache_errors_total`, not logged.
pub const CONNECTION_METRIC: &str = "idempotency_cache_connection_changes_total";

/// Counts `n` write-behind entries with `outcome` in [`WRITE_BEHIND_METRIC`].
fn write_behind_metric(outcome: &'static str, n: u64) {
    if n > 0 {
        metrics::counter!(WRITE_BEHIND_METRIC, "outcome" => outcome).increment(n);
    }
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
    /// Write-behind: entries whose record expired while they were queued, dropped unwritten
    /// (without a call to Redis).
    pub expired_in_queue: u64,
}

#[derive(Debug, Default)]
struct Counters {
    /// Calls failed since the last one that succeeded (0 while Redis answers): the outage
    /// that [`CONNECTION_METRIC`] counts, logged when it starts and when it ends.
    failing: AtomicU64,
    timeouts: AtomicU64,
    errors: AtomicU64,
    short_circuited: AtomicU64,
    corrupt: AtomicU64,
    forged: AtomicU64,
    queued: AtomicU64,
    not_queued: AtomicU64,
    unwritten: AtomicU64,
    expired_in_queue: AtomicU64,
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
/// use idempotency_cache_redis::{CacheSecret, DistributedCacheConfig, RedisCache};
///
/// let config = DistributedCacheConfig {
///     // from your secret store, never from the repository
///     secret: Some(CacheSecret::new(std::env::var("IDEMPOTENCY_CACHE_SECRET")?)?),
///     ..DistributedCacheConfig::default()
/// };
/// let cache = RedisCache::connect("redis://127.0.0.1:6379", &config)?;
/// // IdempotencyService::builder(store).distributed_cache(cache).build()
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisCache<C = Client> {
    /// The client every call goes through. Shared by the cache's clones (the write-behind
    /// writer's too): a client made by [`connect`](RedisCache::connect) is replaced here when
    /// its connection task ends on an error (see `connect::supervise`).
    client: Arc<RwLock<C>>,
    prefix: Arc<str>,
    ttl: Duration,
    timeout: Duration,
    /// Every command's options: fred's own timeout, equal to `timeout` (see [`GRACE`]).
    options: Options,
    policy: FailurePolicy,
    /// The breaker of reads.
    breaker: Arc<Breaker>,
    /// The breaker of writes (the `put`s that write their entry themselves, the write-behind
    /// writer's batches): a write-path problem (a slow write, `OOM` or `READONLY` replies)
    /// never opens the breaker that guards reads.
    write_breaker: Arc<Breaker>,
    counters: Arc<Counters>,
    /// Tags entries with `secret` (see [`DistributedCacheConfig::secret`]).
    signer: Signer,
    /// The write-behind queue; `None` when it is off, and in the writer's own copy.
    write_behind: Option<Arc<Queue>>,
    /// On a cluster client made by [`connect`](RedisCache::connect): the slot map refresh
    /// that a timeout triggers (rate-limited).
    refresh: Option<Arc<Refresh>>,
}

/// How much longer than `timeout` a call may take before the cache drops it itself. Every
/// command carries fred's own timeout, equal to `timeout`, which fires first: it marks the
/// command as given up, so fred never sends it later (after a reconnection, a write of an
/// entry whose record may be gone by then). Dropping the command's future alone does not: fred
/// keeps it queued. This bound only catches a call that fred's timeout did not end.
const GRACE: Duration = Duration::from_millis(20);

/// A breaker as `config` says: a trial that runs is over after one timeout; one that has not
/// reported after the cool-down plus the timeout is held by a future nobody polls any more.
fn breaker(name: &'static str, config: &DistributedCacheConfig) -> Arc<Breaker> {
    Arc::new(Breaker::new(
        name,
        config.circuit_breaker.failure_threshold,
        config.circuit_breaker.cool_down,
        config
            .circuit_breaker
            .cool_down
            .saturating_add(config.timeout),
    ))
}

/// Milliseconds since the Unix epoch.
fn unix_millis(time: SystemTime) -> i64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

impl<C> RedisCache<C>
where
    C: KeysInterface + Clone + Send + Sync + 'static,
{
    /// A cache over an existing fred client, configured by `idempotency.distributed-cache`.
    ///
    /// [`Error::NoSecret`] without [`secret`](DistributedCacheConfig::secret): every entry
    /// is tagged with an HMAC keyed by it, and an entry whose tag does not verify is never
    /// replayed. Without a key, whoever can write to the Redis could make the service replay a
    /// response of their choosing.
    ///
    /// ```
    /// use idempotency_cache_redis::{CacheSecret, DistributedCacheConfig, Error, RedisCache};
    /// use idempotency_cache_redis::fred::prelude::Builder;
    ///
    /// let client = Builder::default_centralized().build()?; // not connected
    /// let refused = RedisCache::new(client.clone(), &DistributedCacheConfig::default());
    /// assert!(matches!(refused, Err(Error::NoSecret)));
    /// let config = DistributedCacheConfig {
    ///     secret: Some(CacheSecret::new("4f0c8a8e2b7d4c3e9a1f6b5d0e7c2a9b")?),
    ///     ..DistributedCacheConfig::default()
    /// };
    /// let cache = RedisCache::new(client, &config)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(client: C, config: &DistributedCacheConfig) -> Result<Self, Error> {
        let secret = config.secret.as_ref().ok_or(Error::NoSecret)?;
        if config.write_behind.enabled {
            config.write_behind.validate()?;
        }
        Ok(Self {
            signer: Signer::new(secret, &config.key_prefix),
            client: Arc::new(RwLock::new(client)),
            prefix: Arc::from(config.key_prefix.as_str()),
            ttl: config.ttl,
            timeout: config.timeout,
            options: Options {
                timeout: Some(config.timeout),
                ..Options::default()
            },
            policy: config.failure_policy,
            breaker: breaker("requests", config),
            write_breaker: breaker("writes", config),
            counters: Arc::new(Counters::default()),
            write_behind: config
                .write_behind
                .enabled
                .then(|| Arc::new(Queue::new(config.write_behind.clone()))),
            refresh: None,
        })
    }

    /// The cache with `refresh` run after timeouts.
    pub(crate) fn with_refresh(self, refresh: Refresh) -> Self {
        Self {
            refresh: Some(Arc::new(refresh)),
            ..self
        }
    }

    /// The client, every command of which carries fred's own timeout.
    fn commands(&self) -> WithOptions<C> {
        self.client().with_options(&self.options)
    }

    /// The fred client the cache calls now (a clone: fred's clients share their connection).
    /// A cache made by [`connect`](RedisCache::connect) replaces its client when fred's
    /// connection task ends on an error, so call this again rather than keep the client.
    pub fn client(&self) -> C {
        self.client
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The slot that holds the cache's client, for the supervisor that replaces it.
    pub(crate) fn client_slot(&self) -> Arc<RwLock<C>> {
        Arc::clone(&self.client)
    }

    /// The Redis key of a record.
    pub fn key_for(&self, id: &RecordId) -> String {
        redis_key(&self.prefix, id)
    }

    /// The state of the circuit breaker of reads, which guards the request path.
    pub fn breaker_state(&self) -> BreakerState {
        self.breaker.state()
    }

    /// The state of the circuit breaker of writes: the `put`s that write their entry
    /// themselves and the write-behind writer's batches (`Closed` while no write failed).
    pub fn write_breaker_state(&self) -> BreakerState {
        self.write_breaker.state()
    }

    /// Whether L2 serves: the request path's breaker is closed, and Redis answers a `PING`
    /// within `timeout`. For health checks: unlike the client's connection state
    /// ([`is_connected`]), it follows a cluster that recovered through redirections.
    ///
    /// ```no_run
    /// # async fn demo(cache: idempotency_cache_redis::RedisCache) {
    /// let cache_up = cache.is_healthy().await;
    /// # }
    /// ```
    pub async fn is_healthy(&self) -> bool {
        if !matches!(self.breaker.state(), BreakerState::Closed { .. }) {
            return false;
        }
        let commands = self.commands();
        let ping = async move { commands.ping::<()>(None).await };
        matches!(
            tokio::time::timeout(self.timeout + GRACE, ping).await,
            Ok(Ok(()))
        )
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
            expired_in_queue: self.counters.expired_in_queue.load(Ordering::Relaxed),
        }
    }

    /// Runs one Redis call, made by `make` on [`commands`](Self::commands), through `breaker`
    /// and the timeout.
    ///
    /// The call is made only once the breaker lets it through, and lives on the heap: a fred
    /// command future is about 5 KiB, and held inline it would make every future that awaits a
    /// cache (up to the HTTP handler's, which the server moves into a box per request) that much
    /// larger, cache hit or not. A timeout (fred's, or the cache's own [`GRACE`] later) also
    /// asks a cluster client for a fresh slot map (at most every few seconds): a master that
    /// hangs answers neither an error nor a redirection, and only a new map leaves it.
    async fn call<T, F>(
        &self,
        breaker: &Breaker,
        make: impl FnOnce(WithOptions<C>) -> F,
    ) -> Result<T, CacheError>
    where
        F: Future<Output = Result<T, fred::error::Error>>,
    {
        let Some(permit) = breaker.allow() else {
            self.counters
                .short_circuited
                .fetch_add(1, Ordering::Relaxed);
            return Err(CacheError::CircuitOpen);
        };
        let call = Box::pin(make(self.commands()));
        // Reads alone tell whether Redis is lost or back (logged once each, `CONNECTION_METRIC`):
        // a Redis that refuses writes (`OOM`, `READONLY`) but answers reads would otherwise be
        // lost at every failed write and back at the next read. Failed writes open the breaker
        // of writes, which logs its own changes of state.
        let reads = std::ptr::eq(breaker, &*self.breaker);
        // Cancelled at this `.await`, the permit is dropped unreported: a failure.
        match tokio::time::timeout(self.timeout + GRACE, call).await {
            Ok(Ok(value)) => {
                permit.success();
                if reads {
                    self.answered();
                }
                Ok(value)
            }
            Ok(Err(error)) if *error.kind() != ErrorKind::Timeout => {
                permit.failure();
                if reads {
                    self.failed(&error);
                }
                self.counters.errors.fetch_add(1, Ordering::Relaxed);
                Err(CacheError::Backend(Box::new(error)))
            }
            Ok(Err(_)) | Err(_) => {
                permit.failure();
                if reads {
                    self.failed(&format_args!("no answer within {:?}", self.timeout));
                }
                self.counters.timeouts.fetch_add(1, Ordering::Relaxed);
                if let Some(refresh) = &self.refresh {
                    refresh.after_timeout();
                }
                Err(CacheError::Timeout(self.timeout))
            }
        }
    }

    /// A call failed: the first failure after an answer starts an outage, logged once.
    fn failed(&self, error: &dyn fmt::Display) {
        if self.counters.failing.fetch_add(1, Ordering::Relaxed) == 0 {
            metrics::counter!(CONNECTION_METRIC, "state" => "lost").increment(1);
            tracing::warn!(
                %error,
                "distributed cache call failed: Redis is treated as down (requests read the \
                 database); further failures are counted (idempotency_cache_errors_total), not \
                 logged, until a call succeeds"
            );
        }
    }

    /// A call succeeded: it ends the outage, if there was one, logged once.
    fn answered(&self) {
        // A load first: the common case (no outage) writes nothing shared.
        if self.counters.failing.load(Ordering::Relaxed) == 0 {
            return;
        }
        let failed = self.counters.failing.swap(0, Ordering::Relaxed);
        if failed > 0 {
            metrics::counter!(CONNECTION_METRIC, "state" => "back").increment(1);
            tracing::info!(
                failed_calls = failed,
                "distributed cache call succeeded: Redis answers again"
            );
        }
    }

    /// When an entry written now expires, in milliseconds since the Unix epoch: after the TTL,
    /// or when its record expires if that is sooner; `None` when nothing is left of it.
    ///
    /// Absolute, so that a write that reaches Redis late (a reconnection, a queue) never lets
    /// an entry outlive its record.
    fn expiry_ms(&self, expires_at: Option<SystemTime>) -> Option<i64> {
        let now = SystemTime::now();
        let by_ttl = now
            .checked_add(self.ttl)
            .unwrap_or(now + Duration::from_secs(1 << 32));
        let at = expires_at.map_or(by_ttl, |at| at.min(by_ttl));
        (at > now).then(|| unix_millis(at))
    }

    /// `SET key value PXAT expiry`; nothing when the record has expired meanwhile. Takes the
    /// entry, so its key and value move into the command without a copy.
    async fn write(
        &self,
        commands: &WithOptions<C>,
        entry: Entry,
    ) -> Result<(), fred::error::Error> {
        let Some(at) = self.expiry_ms(entry.expires_at) else {
            return Ok(());
        };
        commands
            .set::<(), _, _>(
                entry.key,
                entry.value,
                Some(Expiration::PXAT(at)),
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
    /// timeout and one permit of the breaker of writes. Entries whose record expired while
    /// queued are dropped first: a batch left empty makes no call, so it can neither take nor
    /// close the breaker's trial. A failure (the first error ends the call) counts the whole
    /// batch as unwritten.
    async fn write_batch(&self, batch: &mut Vec<Entry>) {
        let queued = batch.len();
        batch.retain(|entry| self.expiry_ms(entry.expires_at).is_some());
        let expired = count(queued - batch.len());
        self.counters
            .expired_in_queue
            .fetch_add(expired, Ordering::Relaxed);
        write_behind_metric("expired_in_queue", expired);
        if batch.is_empty() {
            return;
        }
        let entries = count(batch.len());
        let pending = &mut *batch;
        let result = self
            .call(&self.write_breaker, |commands| async move {
                let sets = pending.drain(..).map(|entry| self.write(&commands, entry));
                futures_util::future::try_join_all(sets).await
            })
            .await;
        batch.clear();
        if let Err(error) = result {
            self.counters
                .unwritten
                .fetch_add(entries, Ordering::Relaxed);
            write_behind_metric("unwritten", entries);
            // Counted; an outage is logged once by `call` and the breaker, not per batch.
            tracing::debug!(entries, %error, "distributed cache write-behind failed");
        }
    }
}

impl<C> DistributedCache for RedisCache<C>
where
    C: KeysInterface + Clone + Send + Sync + 'static,
{
    async fn get(&self, id: &RecordId) -> Result<Option<IdempotencyRecord>, CacheError> {
        let key = self.key_for(id);
        let key = key.as_str();
        let found = self
            .call(&self.breaker, |commands| async move {
                read(&commands, key).await
            })
            .await?;
        let corrupt: BoxError = match found {
            Found::Nothing => return Ok(None),
            Found::OtherType(error) => Box::new(error),
            Found::Value(bytes) => match String::from_utf8(bytes) {
                Err(error) => Box::new(error),
                Ok(value) => match codec::decode(id, &value, &self.signer) {
                    Decoded::Record(record) => return Ok(live(record)),
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
        // A write: through the breaker of writes (a Redis refusing writes must not open the
        // breaker of reads, nor be logged lost and back at each corrupt entry).
        let _: Result<i64, _> = self
            .call(&self.write_breaker, |commands| async move {
                commands.del(key).await
            })
            .await;
        Err(CacheError::Corrupt(corrupt))
    }

    async fn put(&self, id: &RecordId, record: &IdempotencyRecord) -> Result<(), CacheError> {
        if self.expiry_ms(record.expires_at).is_none() {
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
                        write_behind_metric("queued", 1);
                        return Ok(());
                    }
                    Err(refused) => {
                        self.counters.not_queued.fetch_add(1, Ordering::Relaxed);
                        write_behind_metric("not_queued", 1);
                        refused
                    }
                }
            }
        };
        // Writes have their own breaker: `OOM` or `READONLY` replies to `SET`s, while `GET`s
        // are answered, must not open the breaker of reads (under fail-fast, every request
        // would be refused).
        self.call(&self.write_breaker, |commands| async move {
            self.write(&commands, entry).await
        })
        .await
    }

    fn failure_policy(&self) -> FailurePolicy {
        self.policy
    }
}

/// `record`, or `None` once it has expired: an entry never outlives its record, even one
/// written late with a relative expiry by an older release.
fn live(record: IdempotencyRecord) -> Option<IdempotencyRecord> {
    match record.expires_at {
        Some(at) if at <= SystemTime::now() => None,
        _ => Some(record),
    }
}

/// `n` as a counter increment.
fn count(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
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
