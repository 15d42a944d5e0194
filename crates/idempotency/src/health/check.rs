//! [`HealthCheck`]: the probes behind [`Health`], cloneable into a route.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idempotency_core::cleanup::CleanupHandle;
use idempotency_core::error_chain;

use super::{BrokerHealth, CacheHealth, Health, OutboxHealth, Probe, RelayHealth, Status};
use crate::assemble::DistributedTier;
use crate::backend::Database;

/// The cleanup job's handle, shared by [`Idempotency`](crate::Idempotency) (which stops it)
/// and its health checks (which ask whether it runs).
pub(crate) type CleanupSlot = Arc<Mutex<Option<CleanupHandle>>>;

/// The probes of one assembled service, detached from it: cheap to clone, `'static`, so a
/// route can own one ([`Idempotency::health_check`](crate::Idempotency::health_check)).
///
/// ```no_run
/// # #[cfg(feature = "sqlite")]
/// # async fn demo(idempotency: idempotency::Idempotency<sqlx::SqlitePool>) {
/// use std::time::Duration;
///
/// let check = idempotency.health_check().with_timeout(Duration::from_millis(500));
/// let health = check.check().await;
/// if !health.is_ready() {
///     tracing::warn!(?health, "not ready");
/// }
/// # }
/// ```
pub struct HealthCheck<D: Database> {
    pub(crate) pool: D,
    pub(crate) cache: DistributedTier,
    #[cfg(feature = "outbox")]
    pub(crate) outbox: Option<D::Outbox>,
    #[cfg(feature = "outbox")]
    pub(crate) relay: Option<idempotency_outbox::RelayMonitor>,
    #[cfg(feature = "outbox")]
    pub(crate) max_pending_age: Option<Duration>,
    pub(crate) cleanup: CleanupSlot,
    pub(crate) cleanup_enabled: bool,
    pub(crate) timeout: Duration,
}

impl<D: Database> Clone for HealthCheck<D> {
    fn clone(&self) -> Self {
        Self {
            pool: self.pool.clone(),
            // An associated call: without `redis` the tier is `NoCache`, which is `Copy`.
            cache: DistributedTier::clone(&self.cache),
            #[cfg(feature = "outbox")]
            outbox: self.outbox.clone(),
            #[cfg(feature = "outbox")]
            relay: self.relay.clone(),
            #[cfg(feature = "outbox")]
            max_pending_age: self.max_pending_age,
            cleanup: Arc::clone(&self.cleanup),
            cleanup_enabled: self.cleanup_enabled,
            timeout: self.timeout,
        }
    }
}

impl<D: Database> std::fmt::Debug for HealthCheck<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HealthCheck")
            .field("database", &self.pool.deployment())
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

const TIMED_OUT: &str = "timed out";

impl<D: Database> HealthCheck<D> {
    /// Bounds each probe by `timeout` instead of [`DEFAULT_TIMEOUT`](super::DEFAULT_TIMEOUT). Set it below the
    /// orchestrator's probe timeout (Kubernetes: `timeoutSeconds`, 1 s by default).
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The probe timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The `/health/live`, `/health/ready` and `/health` routes over this check, as
    /// [`Idempotency::health_router`](crate::Idempotency::health_router) makes them (feature
    /// `axum`).
    #[cfg(feature = "axum")]
    #[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
    pub fn router<T: Clone + Send + Sync + 'static>(self) -> axum::Router<T> {
        super::router(self)
    }

    /// Runs every probe (concurrently, each bounded by the timeout) and reports.
    pub async fn check(&self) -> Health {
        let (database, cache, outbox, broker) =
            tokio::join!(self.database(), self.cache(), self.outbox(), self.broker());
        let mut health = Health {
            status: Status::Down,
            database,
            cache,
            relay: self.relay(),
            outbox,
            broker,
            cleanup: self.cleanup(),
        };
        if health.is_ready() {
            health.status = Status::Up;
        }
        health
    }

    async fn bounded<T>(&self, probe: impl Future<Output = T>) -> Option<T> {
        tokio::time::timeout(self.timeout, probe).await.ok()
    }

    async fn database(&self) -> Probe {
        match self.bounded(self.pool.ping()).await {
            Some(Ok(())) => Probe::new(Status::Up),
            Some(Err(error)) => Probe::down(error_chain(error.as_ref())),
            None => Probe::down(TIMED_OUT),
        }
    }

    async fn cache(&self) -> CacheHealth {
        #[cfg(feature = "redis")]
        if let Some(cache) = &self.cache {
            use idempotency_cache_redis::BreakerState;
            let up = self.bounded(cache.is_healthy()).await.unwrap_or(false);
            let shown = |state| match state {
                BreakerState::Closed { failures } => (super::Breaker::Closed, Some(failures)),
                BreakerState::Open => (super::Breaker::Open, None),
                BreakerState::HalfOpen => (super::Breaker::HalfOpen, None),
            };
            let (breaker, failures) = shown(cache.breaker_state());
            let (write_breaker, _) = shown(cache.write_breaker_state());
            return CacheHealth {
                status: if up { Status::Up } else { Status::Down },
                breaker: Some(breaker),
                consecutive_failures: failures,
                write_breaker: Some(write_breaker),
            };
        }
        #[cfg(not(feature = "redis"))]
        let _ = &self.cache;
        CacheHealth {
            status: Status::Disabled,
            breaker: None,
            consecutive_failures: None,
            write_breaker: None,
        }
    }

    fn relay(&self) -> RelayHealth {
        #[cfg(feature = "outbox")]
        if let Some(relay) = &self.relay {
            let health = relay.health();
            return RelayHealth {
                status: if health.all_running() {
                    Status::Up
                } else {
                    Status::Down
                },
                configured: Some(health.workers),
                running: Some(health.running),
                panics: Some(health.worker_panics),
            };
        }
        RelayHealth {
            status: Status::Disabled,
            configured: None,
            running: None,
            panics: None,
        }
    }

    async fn outbox(&self) -> OutboxHealth {
        #[cfg(feature = "outbox")]
        if let Some(outbox) = &self.outbox {
            return self.backlog(outbox).await;
        }
        OutboxHealth {
            status: Status::Disabled,
            pending: None,
            oldest_pending_age_seconds: None,
            max_pending_age_seconds: None,
            dead_lettered: None,
            error: None,
        }
    }

    #[cfg(feature = "outbox")]
    async fn backlog(&self, outbox: &D::Outbox) -> OutboxHealth {
        use idempotency_outbox::Housekeeping;
        let mut health = OutboxHealth {
            status: Status::Down,
            pending: None,
            oldest_pending_age_seconds: None,
            max_pending_age_seconds: self.max_pending_age.map(|age| age.as_secs_f64()),
            dead_lettered: None,
            error: None,
        };
        match self.bounded(outbox.stats()).await {
            Some(Ok(stats)) => {
                let late = self
                    .max_pending_age
                    .is_some_and(|max| stats.oldest_pending_age > max.as_secs_f64());
                if !late {
                    health.status = Status::Up;
                }
                health.pending = Some(stats.pending);
                health.oldest_pending_age_seconds = Some(stats.oldest_pending_age);
                health.dead_lettered = Some(stats.dead_lettered);
            }
            Some(Err(error)) => health.error = Some(error_chain(&error)),
            None => health.error = Some(TIMED_OUT.to_owned()),
        }
        health
    }

    async fn broker(&self) -> BrokerHealth {
        #[cfg(feature = "outbox")]
        if let Some(relay) = &self.relay {
            use idempotency_outbox::BrokerHealth as Broker;
            let (status, error) = match self.bounded(relay.broker_health()).await {
                Some(Broker::Up) => (Status::Up, None),
                Some(Broker::Down(reason)) => (Status::Down, Some(reason)),
                Some(_) => (Status::Unknown, None),
                None => (Status::Down, Some(TIMED_OUT.to_owned())),
            };
            return BrokerHealth {
                status,
                destination: Some(relay.destination().to_owned()),
                error,
            };
        }
        BrokerHealth {
            status: Status::Disabled,
            destination: None,
            error: None,
        }
    }

    fn cleanup(&self) -> Probe {
        let running = self
            .cleanup
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .is_some_and(|job| !job.is_finished());
        match (self.cleanup_enabled, running) {
            (_, true) => Probe::new(Status::Up),
            (true, false) => Probe::down("the cleanup job is not running"),
            (false, false) => Probe::new(Status::Disabled),
        }
    }
}
