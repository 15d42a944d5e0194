//! [`Idempotency`]: the service assembled from [`Settings`], with its background tasks.

use std::time::Duration;

use idempotency_core::cleanup::{CleanupJob, CleanupSchedule};
use idempotency_core::config::{InFlightConfig, InFlightPolicyKind, Pooler};
use idempotency_core::{IdempotencyService, ServiceOptions};

use crate::Error;
use crate::backend::Database;
use crate::settings::Settings;
#[cfg(feature = "outbox")]
use idempotency_outbox::config::OutboxConfig;

/// The L1 tier of the assembled service: moka when `local-cache.enabled` (feature `moka`).
#[cfg(feature = "moka")]
pub type LocalTier = Option<idempotency_cache_moka::MokaCache>;
/// The L1 tier of the assembled service: none (feature `moka` is off).
#[cfg(not(feature = "moka"))]
pub type LocalTier = idempotency_core::NoCache;

/// The L2 tier of the assembled service: Redis when `distributed-cache.enabled` (feature
/// `redis`).
#[cfg(feature = "redis")]
pub type DistributedTier = Option<idempotency_cache_redis::RedisCache>;
/// The L2 tier of the assembled service: none (feature `redis` is off).
#[cfg(not(feature = "redis"))]
pub type DistributedTier = idempotency_core::NoCache;

/// The metrics of the assembled service: the `metrics` facade, each handle registered once
/// with the global recorder that [`metrics::install`](crate::metrics::install) sets up
/// (feature `metrics`).
#[cfg(feature = "metrics")]
pub type Meters = idempotency_metrics::CachedMetrics;
/// The metrics of the assembled service: none (feature `metrics` is off).
#[cfg(not(feature = "metrics"))]
pub type Meters = idempotency_core::NoopMetrics;

/// The idempotency service the facade assembles over the store `S`.
pub type Service<S> = IdempotencyService<S, LocalTier, DistributedTier, Meters>;

/// The outbox publisher given to `Builder::publisher` (feature `outbox`), or none.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoPublisher;

#[cfg(feature = "outbox")]
impl idempotency_outbox::Publisher for NoPublisher {
    fn destination(&self) -> &str {
        "none"
    }

    async fn publish(
        &self,
        _message: &idempotency_outbox::OutboxMessage,
    ) -> Result<idempotency_outbox::Ack, idempotency_outbox::PublishError> {
        // Never reached: the builder refuses to start a relay without a publisher.
        Err(idempotency_outbox::PublishError::new(
            idempotency_outbox::PublishErrorKind::Unavailable,
            "no publisher was given to the idempotency builder",
        ))
    }
}

/// Assembles [`Idempotency`] from [`Settings`] when there is more to give than a pool: an
/// outbox publisher, the Prometheus handle for the `/metrics` route.
///
/// ```no_run
/// # #[cfg(all(feature = "postgres", feature = "outbox", feature = "metrics"))]
/// # async fn demo(pool: sqlx::PgPool, publisher: idempotency::outbox::LoggingPublisher) -> Result<(), Box<dyn std::error::Error>> {
/// use idempotency::{Builder, Settings};
///
/// let settings = Settings::load("config/orders.yaml")?;
/// let idempotency = Builder::new(&settings)
///     .publisher(publisher)
///     .prometheus(idempotency::metrics::install()?)
///     .build(pool)
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Builder<'a, P = NoPublisher> {
    settings: &'a Settings,
    publisher: Option<P>,
    #[cfg(feature = "metrics")]
    prometheus: Option<idempotency_metrics::prometheus::PrometheusHandle>,
}

/// The service, wired from the configuration, and its background tasks (cleanup job, outbox
/// relay) with one [`shutdown`](Self::shutdown).
///
/// ```no_run
/// # #[cfg(feature = "sqlite")]
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use idempotency::{Idempotency, Settings};
///
/// let settings = Settings::load("config/orders.yaml")?;
/// // WAL, a busy timeout, and no connection back into the pool while a transaction is open
/// let pool = idempotency::sqlite::open_pool(idempotency::sqlite::connect_options("orders.db")?).await?;
/// let idempotency = Idempotency::from_config(&settings, pool).await?;
/// let service = idempotency.service().clone(); // give it to the handlers
/// // ... serve ...
/// idempotency.shutdown().await;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Idempotency<D: Database> {
    service: Service<D::Store>,
    settings: Settings,
    pool: D,
    cleanup: crate::health::CleanupSlot,
    #[cfg(feature = "outbox")]
    outbox: Option<D::Outbox>,
    #[cfg(feature = "outbox")]
    relay: Option<idempotency_outbox::RelayHandle>,
    #[cfg(feature = "metrics")]
    prometheus: Option<idempotency_metrics::prometheus::PrometheusHandle>,
    /// The Redis key prefix of this deployment, when the L2 cache is configured (for the
    /// admin router's operations).
    #[cfg(feature = "redis")]
    #[cfg_attr(not(feature = "admin"), allow(dead_code))]
    cache_prefix: Option<String>,
    /// Set by [`shutdown`](Self::shutdown) before it quits the Redis client: an admin
    /// router's eviction, which shares that client, then refuses before it deletes anything.
    #[cfg(feature = "redis")]
    #[cfg_attr(not(feature = "admin"), allow(dead_code))]
    cache_closed: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// What [`Idempotency::shutdown`] stopped (serializable, for a structured log line).
#[derive(Debug, Clone, Default, serde::Serialize)]
#[non_exhaustive]
pub struct ShutdownReport {
    /// Whether a cleanup job was running.
    pub cleanup: bool,
    /// The relay's report, when one was running.
    #[cfg(feature = "outbox")]
    #[cfg_attr(docsrs, doc(cfg(feature = "outbox")))]
    pub relay: Option<idempotency_outbox::RelayShutdownReport>,
}

impl<D: Database> Idempotency<D> {
    /// Assembles the service on `pool` from `settings`, with no outbox publisher and no
    /// Prometheus handle: [`Builder`] gives those.
    pub async fn from_config(settings: &Settings, pool: D) -> Result<Self, Error> {
        Builder::new(settings).build(pool).await
    }

    /// The idempotency service: give a clone to each handler.
    pub fn service(&self) -> &Service<D::Store> {
        &self.service
    }

    /// The store.
    pub fn store(&self) -> &D::Store {
        self.service.store()
    }

    /// The settings the service was assembled from.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The pool the service was assembled on.
    #[cfg(all(
        feature = "admin",
        any(feature = "postgres", feature = "sqlite", feature = "mysql")
    ))]
    pub(crate) fn pool(&self) -> &D {
        &self.pool
    }

    /// The Redis key prefix of this deployment, when the L2 cache is configured.
    #[cfg(all(
        feature = "admin",
        feature = "redis",
        any(feature = "postgres", feature = "sqlite", feature = "mysql")
    ))]
    pub(crate) fn cache_prefix(&self) -> Option<&str> {
        self.cache_prefix.as_deref()
    }

    /// Whether [`shutdown`](Self::shutdown) quit the Redis client (shared with the admin
    /// router's operations).
    #[cfg(all(
        feature = "admin",
        feature = "redis",
        any(feature = "postgres", feature = "sqlite", feature = "mysql")
    ))]
    pub(crate) fn cache_closed(&self) -> std::sync::Arc<std::sync::atomic::AtomicBool> {
        std::sync::Arc::clone(&self.cache_closed)
    }

    /// The outbox: enqueue events with it in the transaction of the business change
    /// ([`EnqueueInTx::enqueue`](crate::EnqueueInTx::enqueue)). An error naming `outbox` when
    /// the configuration has no `outbox` section.
    #[cfg(feature = "outbox")]
    #[cfg_attr(docsrs, doc(cfg(feature = "outbox")))]
    pub fn outbox(&self) -> Result<&D::Outbox, Error> {
        self.outbox.as_ref().ok_or_else(|| {
            Error::property(
                "outbox",
                "is not configured: add an outbox section to have the outbox table set up",
            )
        })
    }

    /// The relay's health, when it runs.
    #[cfg(feature = "outbox")]
    #[cfg_attr(docsrs, doc(cfg(feature = "outbox")))]
    pub fn relay(&self) -> Option<idempotency_outbox::RelayMonitor> {
        self.relay
            .as_ref()
            .map(idempotency_outbox::RelayHandle::monitor)
    }

    /// Whether the cleanup job runs (`persistence.cleanup.enabled`).
    pub fn cleanup_running(&self) -> bool {
        self.cleanup
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .is_some_and(|job| !job.is_finished())
    }

    /// The probes of this service, detached from it (cheap to clone, `'static`): the
    /// database, the L2 cache and its breaker, the relay's workers, the outbox's backlog
    /// against `outbox.health.max-pending-age`, the broker, the cleanup job. See
    /// [`health`](crate::health).
    pub fn health_check(&self) -> crate::health::HealthCheck<D> {
        crate::health::HealthCheck {
            pool: self.pool.clone(),
            // An associated call: without `redis` the tier is `NoCache`, which is `Copy`.
            cache: DistributedTier::clone(self.service.distributed_cache()),
            #[cfg(feature = "outbox")]
            outbox: self.outbox.clone(),
            #[cfg(feature = "outbox")]
            relay: self.relay(),
            #[cfg(feature = "outbox")]
            max_pending_age: self
                .settings
                .outbox
                .as_ref()
                .and_then(|outbox| outbox.health.max_pending_age),
            cleanup: std::sync::Arc::clone(&self.cleanup),
            cleanup_enabled: self.settings.idempotency.persistence.cleanup.enabled,
            timeout: crate::health::DEFAULT_TIMEOUT,
        }
    }

    /// Checks every dependency now (each probe bounded by
    /// [`DEFAULT_TIMEOUT`](crate::health::DEFAULT_TIMEOUT)): the report `/health/ready`
    /// answers. [`Health::is_ready`](crate::health::Health::is_ready) is false when the
    /// database does not answer or the outbox's backlog is older than
    /// `outbox.health.max-pending-age`.
    ///
    /// ```no_run
    /// # #[cfg(feature = "sqlite")]
    /// # async fn demo(idempotency: idempotency::Idempotency<sqlx::SqlitePool>) {
    /// let health = idempotency.health().await;
    /// assert_eq!(health.database.status, idempotency::health::Status::Up);
    /// println!("{}", serde_json::to_string(&health).unwrap());
    /// # }
    /// ```
    pub async fn health(&self) -> crate::health::Health {
        self.health_check().check().await
    }

    /// An axum router answering `GET /health/live` (200 while the process answers; no
    /// dependency is asked), `GET /health/ready` (the [`health`](Self::health) report as
    /// JSON, 200 when ready, 503 when not) and `GET /health` (the same as `/health/ready`).
    /// Merge it into the application's router, on a listener the orchestrator reaches (axum
    /// panics at the merge if the router already has one of these paths: `nest` it under
    /// another prefix then); the router owns a [`health_check`](Self::health_check) and
    /// outlives `self`.
    ///
    /// ```no_run
    /// # #[cfg(feature = "sqlite")]
    /// # async fn demo(idempotency: idempotency::Idempotency<sqlx::SqlitePool>) {
    /// let app: axum::Router = axum::Router::new()
    ///     // .route("/orders", post(create_order))
    ///     .merge(idempotency.health_router());
    /// # }
    /// ```
    #[cfg(feature = "axum")]
    #[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
    pub fn health_router<T: Clone + Send + Sync + 'static>(&self) -> axum::Router<T> {
        self.health_check().router()
    }

    /// The Prometheus exposition text: the L1 statistics (with `local-cache.statistics`) are
    /// published first. `None` without a Prometheus handle ([`Builder::prometheus`]).
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn render_metrics(&self) -> Option<String> {
        let handle = self.prometheus.as_ref()?;
        crate::metrics::publish_local_cache_stats(&self.service);
        Some(handle.render())
    }

    /// An axum router answering `GET /metrics` with [`render_metrics`](Self::render_metrics)
    /// (404 without a Prometheus handle). Merge it into the application's router.
    #[cfg(all(feature = "metrics", feature = "axum"))]
    #[cfg_attr(docsrs, doc(cfg(all(feature = "metrics", feature = "axum"))))]
    pub fn metrics_router<T: Clone + Send + Sync + 'static>(&self) -> axum::Router<T> {
        crate::metrics::router(self.service.clone(), self.prometheus.clone())
    }

    /// The tower middleware over the assembled service ([`idempotency_axum::IdempotencyLayer`]);
    /// it fingerprints with the service's strategy (`fingerprint.*`), as any layer over the
    /// service does. Choose its scope before adding it to a router, from the authenticated
    /// principal: `idempotency.layer().scope::<PrincipalScope<Scope>>()` (a layer without a
    /// scope does not compile; see SECURITY.md).
    #[cfg(feature = "axum")]
    #[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
    pub fn layer(
        &self,
    ) -> idempotency_axum::IdempotencyLayer<
        D::Store,
        LocalTier,
        DistributedTier,
        Meters,
        idempotency_core::JsonSerializer,
    > {
        idempotency_axum::IdempotencyLayer::new(self.service.clone())
    }

    /// Stops the background tasks: the relay finishes its in-flight batches (within
    /// `outbox.relay.shutdown-timeout`), a purge of the cleanup job under way stops, and the
    /// Redis client disconnects.
    ///
    /// What is not waited for: a cleanup batch whose delete was already sent is one
    /// autocommit statement that the database finishes, and may commit, after `shutdown`
    /// returned (it deletes only expired records; earlier batches stay deleted). With
    /// `distributed-cache.write-behind.enabled`, entries still queued for Redis are not
    /// written: they are lost to the cache, never to the database, which holds every record.
    pub async fn shutdown(self) -> ShutdownReport {
        let mut report = ShutdownReport::default();
        #[cfg(feature = "outbox")]
        if let Some(relay) = self.relay {
            report.relay = Some(relay.shutdown().await);
        }
        let cleanup = self
            .cleanup
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(cleanup) = cleanup {
            report.cleanup = true;
            cleanup.shutdown().await;
        }
        #[cfg(feature = "redis")]
        self.cache_closed
            .store(true, std::sync::atomic::Ordering::SeqCst);
        disconnect(self.service.distributed_cache()).await;
        report
    }
}

impl<'a> Builder<'a> {
    /// A builder over `settings`.
    pub fn new(settings: &'a Settings) -> Self {
        Self {
            settings,
            publisher: None,
            #[cfg(feature = "metrics")]
            prometheus: None,
        }
    }
}

impl<'a, P> Builder<'a, P> {
    /// The broker the outbox relay publishes to. Needs an `outbox` section; the relay runs
    /// when `outbox.relay.enabled`.
    #[cfg(feature = "outbox")]
    #[cfg_attr(docsrs, doc(cfg(feature = "outbox")))]
    pub fn publisher<P2: idempotency_outbox::Publisher>(self, publisher: P2) -> Builder<'a, P2> {
        Builder {
            settings: self.settings,
            publisher: Some(publisher),
            #[cfg(feature = "metrics")]
            prometheus: self.prometheus,
        }
    }

    /// The installed Prometheus recorder's handle ([`crate::metrics::install`]), for
    /// [`Idempotency::render_metrics`] and the `/metrics` route.
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn prometheus(mut self, handle: idempotency_metrics::prometheus::PrometheusHandle) -> Self {
        self.prometheus = Some(handle);
        self
    }
}

/// What `Builder::publisher` may hold: any outbox `Publisher` (feature `outbox`), or
/// [`NoPublisher`].
pub trait MaybePublisher: Send + Sync + 'static {
    /// Starts a relay of `outbox` to this publisher, after checking that the broker's
    /// deduplication window covers the relay's republish window
    /// ([`Relay::check_duplicate_window`](idempotency_outbox::Relay::check_duplicate_window)).
    #[cfg(feature = "outbox")]
    #[cfg_attr(docsrs, doc(cfg(feature = "outbox")))]
    fn spawn_relay<O>(
        self,
        outbox: O,
        config: &OutboxConfig,
    ) -> impl Future<Output = Result<idempotency_outbox::RelayHandle, idempotency_outbox::Error>> + Send
    where
        O: idempotency_outbox::RelayStore + idempotency_outbox::Housekeeping;
}

#[cfg(feature = "outbox")]
impl<P: idempotency_outbox::Publisher> MaybePublisher for P {
    async fn spawn_relay<O>(
        self,
        outbox: O,
        config: &OutboxConfig,
    ) -> Result<idempotency_outbox::RelayHandle, idempotency_outbox::Error>
    where
        O: idempotency_outbox::RelayStore + idempotency_outbox::Housekeeping,
    {
        let relay = idempotency_outbox::Relay::new(outbox, self, config)?;
        relay.check_duplicate_window().await?;
        Ok(relay.spawn())
    }
}

#[cfg(not(feature = "outbox"))]
impl MaybePublisher for NoPublisher {}

/// Refuses, before any I/O, every property that could not take effect; returns the cleanup
/// schedule it parsed on the way.
fn check<D: Database>(settings: &Settings, given: bool) -> Result<CleanupSchedule, Error> {
    let (notifications, partitions) = (D::NOTIFICATIONS, D::PARTITIONED_OUTBOX);
    #[cfg(feature = "outbox")]
    let configured = settings
        .outbox
        .as_ref()
        .is_some_and(|outbox| outbox.publisher.is_some());
    #[cfg(not(feature = "outbox"))]
    let configured = false;
    if given && configured {
        return Err(Error::property(
            "outbox.publisher",
            "is set, and a publisher was given to Builder::publisher too; remove one",
        ));
    }
    let publisher = given || configured;
    let properties = &settings.idempotency;
    if !properties.persistence.enabled {
        return Err(Error::property(
            "idempotency.persistence.enabled",
            "is false, but the facade always wires the database store; to use a store of \
             your own, build the service with IdempotencyService::builder",
        ));
    }
    let behind_transaction_pooler = properties.persistence.pooler == Pooler::Transaction;
    if behind_transaction_pooler && !D::TRANSACTION_POOLER {
        return Err(Error::property(
            "idempotency.persistence.pooler",
            "is transaction, but only the PostgreSQL store works behind a pooler in \
             transaction mode; set it to none",
        ));
    }
    #[cfg(feature = "moka")]
    if properties.local_cache.statistics && !properties.local_cache.enabled {
        return Err(Error::property(
            "idempotency.local-cache.statistics",
            "is true, but local-cache.enabled is false: there is no cache to count",
        ));
    }
    #[cfg(all(feature = "moka", not(feature = "metrics")))]
    if properties.local_cache.statistics {
        return Err(Error::property(
            "idempotency.local-cache.statistics",
            "is true, but the `metrics` feature is off: nothing would export the counts",
        ));
    }
    #[cfg(feature = "redis")]
    if properties.distributed_cache.enabled
        && properties
            .distributed_cache
            .url
            .as_deref()
            .is_none_or(|url| url.trim().is_empty())
    {
        return Err(Error::property(
            "idempotency.distributed-cache.url",
            "is not set (or empty), but distributed-cache.enabled is true: give the Redis URL \
             (redis://host:6379), or set enabled to false",
        ));
    }
    check_caches(properties)?;
    check_in_flight::<D>(&properties.in_flight)?;
    // The entries' HMAC secret (SECURITY.md): without it, whoever can write to the Redis can
    // make every instance replay a response of their choosing.
    #[cfg(feature = "redis")]
    if properties.distributed_cache.enabled && properties.distributed_cache.secret.is_none() {
        return Err(Error::property(
            "idempotency.distributed-cache.secret",
            "is not set, but distributed-cache.enabled is true: give the secret that \
             authenticates the cache's entries (at least 32 bytes, the same in every instance, \
             e.g. IDEMPOTENCY__DISTRIBUTED_CACHE__SECRET), or set enabled to false",
        ));
    }
    let cleanup = &properties.persistence.cleanup;
    let schedule = CleanupSchedule::parse(&cleanup.cron)?.in_zone(&cleanup.zone)?;
    if schedule.next_run().is_none() {
        return Err(Error::property(
            "idempotency.persistence.cleanup.cron",
            format!("{:?} never fires", cleanup.cron),
        ));
    }
    if cleanup.batch_size == 0 {
        return Err(Error::property(
            "idempotency.persistence.cleanup.batch-size",
            "must be at least 1",
        ));
    }
    if properties.acquire.max_attempts == 0 {
        return Err(Error::property(
            "idempotency.acquire.max-attempts",
            "must be at least 1",
        ));
    }
    if let Some(reason) = ttl_refusal(properties.persistence.ttl) {
        return Err(Error::property(
            "idempotency.persistence.ttl",
            format!("{reason}; write null to keep records forever"),
        ));
    }
    for (name, operation) in &properties.operations {
        if let Err(error) = idempotency_core::Operation::new(name.as_str()) {
            return Err(Error::property(
                "idempotency.operations.<NAME>",
                format!("{name:?} can never name an operation: {error}"),
            ));
        }
        if let Some(reason) = operation.ttl.and_then(ttl_refusal) {
            return Err(Error::property(
                "idempotency.operations.<NAME>.ttl",
                format!("{name}: {reason}; write null to keep its records forever"),
            ));
        }
    }
    #[cfg(feature = "outbox")]
    match &settings.outbox {
        Some(outbox) => {
            if outbox.notify_channel.is_some() && !notifications {
                return Err(Error::property(
                    "outbox.notify-channel",
                    "is set, but this database has no notifications; set it to null (the relay \
                     polls every outbox.relay.poll-interval)",
                ));
            }
            if behind_transaction_pooler
                && outbox.relay.enabled
                && outbox.notify_channel.is_some()
                && outbox.relay.wake_up == idempotency_outbox::config::WakeUp::Listen
            {
                return Err(Error::property(
                    "outbox.relay.wake-up",
                    "is listen, but idempotency.persistence.pooler is transaction: a pooler in \
                     transaction mode gives the LISTEN session to other clients after the \
                     statement, and its notifications with it; set it to poll (the relay \
                     claims every outbox.relay.poll-interval), or build the outbox yourself \
                     with PgOutbox::with_listen_pool on a direct connection",
                ));
            }
            if outbox.notify_channel.is_none()
                && outbox.notify_interval != OutboxConfig::default().notify_interval
            {
                return Err(Error::property(
                    "outbox.notify-interval",
                    "is set, but outbox.notify-channel is null: no enqueue notifies; remove it",
                ));
            }
            if outbox.partitioning.enabled && !partitions {
                return Err(Error::property(
                    "outbox.partitioning.enabled",
                    "is true, but only PostgreSQL partitions the outbox table; set it to false \
                     (retention deletes in batches)",
                ));
            }
            outbox
                .partitioning
                .validate()
                .map_err(|e| Error::Outbox(Box::new(e)))?;
            outbox
                .health
                .validate()
                .map_err(|e| Error::Outbox(Box::new(e)))?;
            if !outbox.relay.enabled && publisher {
                return Err(Error::property(
                    "outbox.relay.enabled",
                    "is false, but a publisher was given; give none, or enable the relay",
                ));
            }
            if outbox.relay.enabled {
                let invalid = |e: idempotency_outbox::Error| Error::Outbox(Box::new(e));
                outbox.relay.validate().map_err(invalid)?;
                outbox.retention.validate().map_err(invalid)?;
            }
            if outbox.relay.enabled && !publisher {
                return Err(Error::property(
                    "outbox.relay.enabled",
                    "is true, but there is no publisher: set outbox.publisher (nats, rabbitmq, \
                     kafka, logging) or give one to Builder::publisher; or set it to false when another \
                     process relays",
                ));
            }
            check_wake_up(outbox, notifications)?;
        }
        None if publisher => {
            return Err(Error::property(
                "outbox",
                "a publisher was given, but the configuration has no outbox section",
            ));
        }
        None => {}
    }
    #[cfg(not(feature = "outbox"))]
    let _ = (
        notifications,
        partitions,
        publisher,
        behind_transaction_pooler,
    );
    Ok(schedule)
}

/// Refuses the relay's wake-up settings that cannot take effect: `wake-up: listen` where the
/// database has no notifications (SQLite, MySQL) or no enqueue notifies (`notify-channel:
/// null`), and `notify-debounce` where nothing is listened to.
#[cfg(feature = "outbox")]
fn check_wake_up(outbox: &OutboxConfig, notifications: bool) -> Result<(), Error> {
    use idempotency_outbox::config::WakeUp;
    let relay = &outbox.relay;
    if !relay.enabled {
        return Ok(());
    }
    let listens = relay.wake_up == WakeUp::Listen;
    if listens && !notifications {
        return Err(Error::property(
            "outbox.relay.wake-up",
            "is listen (the default), but this database has no notifications; set it to poll \
             (the relay looks for rows every outbox.relay.poll-interval)",
        ));
    }
    if listens && outbox.notify_channel.is_none() {
        return Err(Error::property(
            "outbox.relay.wake-up",
            "is listen (the default), but outbox.notify-channel is null: nothing would be \
             heard; set it to poll, or name a channel",
        ));
    }
    if !listens && relay.notify_debounce != OutboxConfig::default().relay.notify_debounce {
        return Err(Error::property(
            "outbox.relay.notify-debounce",
            "is set, but the relay does not listen (wake-up: poll); remove it",
        ));
    }
    Ok(())
}

/// Why a record lifetime cannot take effect: zero (every record born expired) or beyond what
/// the stores can write.
fn ttl_refusal(ttl: Option<Duration>) -> Option<&'static str> {
    match ttl {
        Some(Duration::ZERO) => Some("is 0, so every record would be born expired"),
        Some(ttl) if ttl > idempotency_core::MAX_TTL => {
            Some("is longer than the storable 1000 years")
        }
        _ => None,
    }
}

/// Refuses cache settings that would make the cache do nothing (zero lifetimes or sizes, a zero
/// timeout, a breaker that could never stay closed) or that cannot be allocated (a write-behind
/// queue or batch over its bound).
fn check_caches(properties: &crate::IdempotencyConfig) -> Result<(), Error> {
    let zero = |property: &'static str, what: &str| {
        Error::property(
            property,
            format!("is 0, so {what}; set the cache's enabled to false to go without it"),
        )
    };
    #[cfg(feature = "moka")]
    {
        let local = &properties.local_cache;
        if local.ttl.is_zero() {
            return Err(zero(
                "idempotency.local-cache.ttl",
                "every entry would expire as it is written",
            ));
        }
        if local.max_size == 0 {
            return Err(zero(
                "idempotency.local-cache.max-size",
                "no entry would be kept",
            ));
        }
        if local.max_bytes == 0 {
            return Err(zero(
                "idempotency.local-cache.max-bytes",
                "no entry would be kept",
            ));
        }
    }
    #[cfg(feature = "redis")]
    {
        let redis = &properties.distributed_cache;
        if redis.ttl.is_zero() {
            return Err(zero(
                "idempotency.distributed-cache.ttl",
                "every entry would expire as it is written",
            ));
        }
        if redis.timeout.is_zero() {
            return Err(zero(
                "idempotency.distributed-cache.timeout",
                "every call would time out",
            ));
        }
        if redis.circuit_breaker.failure_threshold == 0 {
            return Err(Error::property(
                "idempotency.distributed-cache.circuit-breaker.failure-threshold",
                "must be at least 1 (the number of consecutive failures that open the breaker)",
            ));
        }
        let write_behind = &redis.write_behind;
        let sizes = if write_behind.enabled {
            vec![
                (
                    "idempotency.distributed-cache.write-behind.capacity",
                    write_behind.capacity.get(),
                    idempotency_cache_redis::MAX_WRITE_BEHIND_CAPACITY,
                ),
                (
                    "idempotency.distributed-cache.write-behind.max-batch",
                    write_behind.max_batch.get(),
                    idempotency_cache_redis::MAX_WRITE_BEHIND_BATCH,
                ),
            ]
        } else {
            Vec::new()
        };
        for (property, value, max) in sizes {
            if value > max {
                return Err(Error::property(
                    property,
                    format!("is {value}, more than the {max} it may be (allocated up front)"),
                ));
            }
        }
    }
    #[cfg(not(any(feature = "moka", feature = "redis")))]
    let _ = (properties, zero);
    Ok(())
}

/// Refuses an `in-flight.timeout` that nothing reads: under `reject`, and on a database with
/// no per-key wait (SQLite), where `policy` cannot take effect either.
fn check_in_flight<D: Database>(in_flight: &InFlightConfig) -> Result<(), Error> {
    let default = InFlightConfig::default();
    if in_flight.policy == InFlightPolicyKind::Reject && in_flight.timeout != default.timeout {
        return Err(Error::property(
            "idempotency.in-flight.timeout",
            "is set, but in-flight.policy is reject, which answers at once without waiting; \
             remove it",
        ));
    }
    let no_wait = "this database has no per-key wait: a duplicate of a key in flight waits for \
                   the one write lock every writer shares, up to the pool's busy timeout \
                   (SqliteConnectOptions::busy_timeout)";
    if !D::IN_FLIGHT_POLICY && in_flight.policy != default.policy {
        return Err(Error::property(
            "idempotency.in-flight.policy",
            format!("is reject, but {no_wait}; remove it"),
        ));
    }
    if !D::IN_FLIGHT_POLICY && in_flight.timeout != default.timeout {
        return Err(Error::property(
            "idempotency.in-flight.timeout",
            format!("is set, but {no_wait}; set the busy timeout instead, and remove it"),
        ));
    }
    Ok(())
}

/// The Redis key prefix of a deployment: `distributed-cache.key-prefix`, then a digest of
/// where its records table is (`Database::table_location`) and `persistence.table-name`, then
/// `:`. Two deployments sharing one Redis with the same `key-prefix` (the default) get their
/// own keys; every instance of one deployment gets the same.
#[cfg(feature = "redis")]
pub(crate) fn deployment_key_prefix(key_prefix: &str, location: &str, table_name: &str) -> String {
    let digest = idempotency_core::fingerprint::short_hash(&format!("{location}\n{table_name}"));
    format!("{key_prefix}{digest}:")
}

/// The Redis key prefix of the deployment on `pool` ([`deployment_key_prefix`], the
/// database asked where the table is) when the L2 cache is enabled and has a URL; `None`
/// otherwise, without asking.
#[cfg(feature = "redis")]
pub(crate) async fn cache_key_prefix<D: Database>(
    pool: &D,
    config: &idempotency_cache_redis::DistributedCacheConfig,
    table_name: &str,
) -> Result<Option<String>, Error> {
    if !config.enabled || config.url.is_none() {
        return Ok(None);
    }
    let location = pool.table_location(table_name).await?;
    Ok(Some(deployment_key_prefix(
        &config.key_prefix,
        &location,
        table_name,
    )))
}

/// Connects the L2 cache when enabled. A cluster URL is probed before it is accepted, so the
/// connect runs off the async threads.
#[cfg(feature = "redis")]
pub(crate) async fn redis_cache(
    config: &idempotency_cache_redis::DistributedCacheConfig,
    key_prefix: String,
) -> Result<DistributedTier, Error> {
    let (Some(url), true) = (config.url.clone(), config.enabled) else {
        return Ok(None);
    };
    tracing::info!(
        key_prefix,
        "the distributed cache's keys of this deployment"
    );
    let section = idempotency_cache_redis::DistributedCacheConfig {
        key_prefix,
        ..config.clone()
    };
    let connect = {
        let url = url.clone();
        move || idempotency_cache_redis::RedisCache::connect(&url, &section)
    };
    let connected = match tokio::runtime::Handle::try_current() {
        Ok(_) => tokio::task::spawn_blocking(connect)
            .await
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic.into_panic())),
        Err(_) => connect(),
    };
    connected.map(Some).map_err(|source| Error::Redis {
        url: idempotency_core::redact_url(&url),
        source,
    })
}

/// An outbox error as the facade reports it: a refused property keeps its name.
#[cfg(feature = "outbox")]
fn outbox_error(error: idempotency_outbox::Error) -> Error {
    match error {
        idempotency_outbox::Error::Property { property, reason } => {
            Error::Property { property, reason }
        }
        other => Error::Outbox(Box::new(other)),
    }
}

/// Tells the Redis client, if any, to quit: its connection task stops.
async fn disconnect(cache: &DistributedTier) {
    #[cfg(feature = "redis")]
    if let Some(cache) = cache {
        use idempotency_cache_redis::fred::prelude::ClientLike;
        if let Err(error) = cache.client().quit().await {
            tracing::debug!(error = %error, "the Redis client did not quit cleanly");
        }
    }
    #[cfg(not(feature = "redis"))]
    let _ = cache;
}

impl<P> Builder<'_, P>
where
    P: MaybePublisher,
{
    /// Assembles the service on `pool`: every property takes effect, or the build fails naming
    /// the one that cannot.
    ///
    /// In order: the properties are checked; the store is set up (`persistence.schema.mode`);
    /// the L1 and L2 caches per their `enabled` flags; the service with the configured
    /// settings, fingerprint and meters; the outbox (`outbox.schema.mode`) and its relay
    /// (`outbox.relay.enabled`); the cleanup job (`persistence.cleanup.enabled`). Nothing
    /// runs in the background when it fails.
    pub async fn build<D: Database>(self, pool: D) -> Result<Idempotency<D>, Error> {
        let settings = self.settings.clone();
        let properties = &settings.idempotency;
        let schedule = check::<D>(&settings, self.publisher.is_some())?;
        #[cfg(feature = "outbox")]
        let relay_config = settings
            .outbox
            .as_ref()
            .filter(|outbox| outbox.relay.enabled)
            .cloned();

        // The broker first: a publisher that cannot work stops start-up before any setup.
        #[cfg(feature = "outbox")]
        let configured = match &relay_config {
            Some(config) if config.publisher.is_some() => {
                idempotency_outbox::publisher::ConfiguredPublisher::from_config(config)
                    .await
                    .map_err(outbox_error)?
            }
            _ => None,
        };
        let store = pool.clone().store(&properties.persistence).await?;
        #[cfg(feature = "outbox")]
        let outbox = match &settings.outbox {
            Some(config) => Some(
                pool.clone()
                    .outbox(config, properties.persistence.pooler)
                    .await?,
            ),
            None => None,
        };
        #[cfg(feature = "moka")]
        let local = properties
            .local_cache
            .enabled
            .then(|| idempotency_cache_moka::MokaCache::new(&properties.local_cache));
        #[cfg(not(feature = "moka"))]
        let local = idempotency_core::NoCache;
        // Redis last of what can fail: its client runs a connection task until told to quit.
        #[cfg(feature = "redis")]
        let cache_prefix = cache_key_prefix(
            &pool,
            &properties.distributed_cache,
            &properties.persistence.table_name,
        )
        .await?;
        #[cfg(feature = "redis")]
        let distributed = match &cache_prefix {
            Some(prefix) => redis_cache(&properties.distributed_cache, prefix.clone()).await?,
            None => None,
        };
        #[cfg(not(feature = "redis"))]
        let distributed = idempotency_core::NoCache;

        let service = IdempotencyService::builder(store.clone())
            .config(ServiceOptions::from(&properties.core()))
            .fingerprint(properties.fingerprint.strategy())
            .local_cache(local)
            .distributed_cache(distributed)
            .metrics(Meters::default())
            .build();

        #[cfg(feature = "outbox")]
        let relay = {
            let spawned = match (&outbox, relay_config, self.publisher, configured) {
                (Some(outbox), Some(config), Some(publisher), _) => {
                    Some(publisher.spawn_relay(outbox.clone(), &config).await)
                }
                (Some(outbox), Some(config), None, Some(publisher)) => {
                    Some(publisher.spawn_relay(outbox.clone(), &config).await)
                }
                _ => None,
            };
            match spawned.transpose() {
                Ok(relay) => relay,
                Err(error) => {
                    disconnect(service.distributed_cache()).await;
                    return Err(outbox_error(error));
                }
            }
        };
        let cleanup = properties.persistence.cleanup.enabled.then(|| {
            CleanupJob::new(
                store,
                schedule,
                properties.persistence.cleanup.batch_size,
                Meters::default(),
            )
            .spawn()
        });
        Ok(Idempotency {
            service,
            settings,
            pool,
            cleanup: std::sync::Arc::new(std::sync::Mutex::new(cleanup)),
            #[cfg(feature = "outbox")]
            outbox,
            #[cfg(feature = "outbox")]
            relay,
            #[cfg(feature = "metrics")]
            prometheus: self.prometheus,
            #[cfg(feature = "redis")]
            cache_prefix,
            #[cfg(feature = "redis")]
            cache_closed: std::sync::Arc::default(),
        })
    }
}
