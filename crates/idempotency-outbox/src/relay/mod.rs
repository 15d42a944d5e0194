//! The relay: worker tasks that move committed outbox rows to a broker.
//!
//! Each worker loops: claim a batch under a lease (`FOR UPDATE SKIP LOCKED`, one short
//! statement), publish its messages concurrently (each bounded by `publish-timeout`), mark the
//! confirmed ones published with one statement and record the failures with backoff; after a
//! full batch, the next batch is claimed while that one publishes and is marked, so a worker
//! has up to two batches in flight (a batch's rows stay leased until its mark commits, so
//! aggregate order holds). Idle
//! workers wait for a notification (`LISTEN`, debounced) or the poll interval. Any number of
//! workers in any number of processes share the table; nothing needs a leader.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use crate::config::{Ordering, OutboxConfig, RelayConfig, RetentionConfig};
use crate::error::Error;
use crate::publisher::Publisher;
use crate::store::{Housekeeping, RelayStore};

mod backoff;
mod held;
mod housekeeping;
mod supervisor;
mod throttle;
mod wake;
mod worker;

pub use housekeeping::PurgeReport;
pub use supervisor::{RelayMonitor, RelayWorkers};
pub use worker::BatchReport;

/// Counts since the relay started, across its workers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct RelayTotals {
    /// Messages the broker confirmed.
    pub published: u64,
    /// Failed publish attempts.
    pub failed: u64,
    /// Messages dead-lettered.
    pub dead_lettered: u64,
    /// Confirmed copies the broker reported as duplicates.
    pub duplicates: u64,
}

#[derive(Debug, Default)]
struct Totals {
    published: AtomicU64,
    failed: AtomicU64,
    dead_lettered: AtomicU64,
    duplicates: AtomicU64,
}

impl Totals {
    fn add(&self, report: &BatchReport) {
        self.published
            .fetch_add(report.published, AtomicOrdering::Relaxed);
        self.failed
            .fetch_add(report.failed, AtomicOrdering::Relaxed);
        self.dead_lettered
            .fetch_add(report.dead_lettered, AtomicOrdering::Relaxed);
        self.duplicates
            .fetch_add(report.duplicates, AtomicOrdering::Relaxed);
    }

    fn snapshot(&self) -> RelayTotals {
        RelayTotals {
            published: self.published.load(AtomicOrdering::Relaxed),
            failed: self.failed.load(AtomicOrdering::Relaxed),
            dead_lettered: self.dead_lettered.load(AtomicOrdering::Relaxed),
            duplicates: self.duplicates.load(AtomicOrdering::Relaxed),
        }
    }
}

#[derive(Debug)]
struct Shared<S, P> {
    store: S,
    publisher: P,
    config: RelayConfig,
    ordering: Ordering,
    retention: RetentionConfig,
    wake: Notify,
    totals: Totals,
    outage: backoff::Outage,
    /// The warning that the destination is full.
    full_warned: throttle::Throttle,
    /// The events a full destination holds back, since when.
    held: held::Held,
}

/// A relay over store `S` and publisher `P`. Cheap to clone.
///
/// [`spawn`](Self::spawn) starts the workers, the notification listener and the housekeeping
/// task (gauges, retention); [`run_batch`](Self::run_batch) runs one claim-publish-mark cycle
/// for callers that drive the relay themselves.
#[derive(Debug)]
pub struct Relay<S, P> {
    shared: Arc<Shared<S, P>>,
}

impl<S, P> Clone for Relay<S, P> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S, P> Relay<S, P>
where
    S: RelayStore + Housekeeping,
    P: Publisher,
{
    /// A relay configured by the `outbox` section (`relay`, `ordering`, `retention`).
    pub fn new(store: S, publisher: P, config: &OutboxConfig) -> Result<Self, Error> {
        config.relay.validate()?;
        config.retention.validate()?;
        Ok(Self {
            shared: Arc::new(Shared {
                store,
                publisher,
                config: config.relay.clone(),
                ordering: config.ordering,
                retention: config.retention.clone(),
                wake: Notify::new(),
                totals: Totals::default(),
                outage: backoff::Outage::default(),
                full_warned: throttle::Throttle::default(),
                held: held::Held::default(),
            }),
        })
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.shared.store
    }

    /// The publisher.
    pub fn publisher(&self) -> &P {
        &self.shared.publisher
    }

    /// Counts since the relay was created.
    pub fn totals(&self) -> RelayTotals {
        self.shared.totals.snapshot()
    }

    /// Claims, publishes and marks one batch, as a worker does. Returns what happened.
    ///
    /// Keep the relay between batches (it is cheap to clone): it remembers since when a full
    /// destination has refused each event, which `relay.full-patience` counts from; a relay
    /// made for each batch would never reach the patience.
    pub async fn run_batch(&self) -> Result<BatchReport, Error> {
        worker::run_batch(&self.shared).await
    }

    /// Refreshes the gauges once.
    pub async fn refresh_gauges(&self) -> Result<(), Error> {
        housekeeping::refresh_gauges(&self.shared).await
    }

    /// Runs retention once: prepares storage (partitions ahead), drops whole partitions
    /// retention would empty, then deletes published rows, then dead letters, in bounded
    /// batches.
    pub async fn purge(&self) -> Result<PurgeReport, Error> {
        housekeeping::purge(&self.shared).await
    }

    /// Fails when the publisher's broker deduplicates message ids for less time than this
    /// relay may take to publish a message again
    /// ([`RelayConfig::republish_window`](crate::config::RelayConfig::republish_window)): a
    /// copy published again after a lost ack would then be delivered twice. The error names
    /// the keys to change. Passes when the broker does not deduplicate
    /// ([`Publisher::duplicate_window`] is `None`). Call it before [`spawn`](Self::spawn),
    /// which does not; the `idempotency` facade does.
    ///
    /// What a long enough window covers: a copy republished after a lost ack, or after a relay
    /// gone before marking, whose next attempt reaches the broker within the republish
    /// window. A broker outage is retried without end (it dead-letters nothing), so a copy the
    /// broker stored just before an outage longer than the window, then republished after it,
    /// is stored twice: the consumer's inbox drops it.
    ///
    /// ```
    /// use idempotency_outbox::{Housekeeping, Relay, RelayStore};
    /// use idempotency_outbox::{config::OutboxConfig, publisher::LoggingPublisher};
    ///
    /// async fn start<S: RelayStore + Housekeeping>(store: S) -> Result<(), idempotency_outbox::Error> {
    /// let relay = Relay::new(store, LoggingPublisher::new(), &OutboxConfig::default())?;
    /// relay.check_duplicate_window().await?; // a log does not deduplicate: nothing to compare
    /// let _workers = relay.spawn();
    /// # Ok(()) }
    /// ```
    pub async fn check_duplicate_window(&self) -> Result<(), Error> {
        match self.shared.publisher.duplicate_window().await {
            Ok(Some(window)) => self.shared.config.check_duplicate_window(window),
            Ok(None) => Ok(()),
            Err(error) => Err(Error::Publisher(error)),
        }
    }

    /// Starts `workers` worker tasks, the listener (with `wake-up: listen`) and the
    /// housekeeping task on the current tokio runtime. A worker that panics is restarted
    /// after a second and counted in [`RelayHandle::health`].
    ///
    /// `spawn` asks the broker nothing (it cannot fail and does not wait): it does not compare
    /// the broker's duplicate window with the relay's republish window. The `idempotency`
    /// facade does at start-up; a caller that builds the relay without it calls
    /// [`check_duplicate_window`](Self::check_duplicate_window) first, or a JetStream stream
    /// that forgets message ids too early stores a copy republished after a lost ack twice.
    ///
    /// ```no_run
    /// # #[cfg(feature = "nats")]
    /// # async fn start<S>(store: S) -> Result<(), Box<dyn std::error::Error>>
    /// # where S: idempotency_outbox::RelayStore + idempotency_outbox::Housekeeping {
    /// use idempotency_outbox::{Relay, config::OutboxConfig, publisher::nats::NatsPublisher};
    ///
    /// let config = OutboxConfig::default();
    /// let client = async_nats::connect("nats://127.0.0.1:4222").await?;
    /// let publisher = NatsPublisher::new(client).with_subject("billing.{aggregate_type}.{event_type}")?;
    /// publisher.ensure_stream("BILLING", config.relay.republish_window()).await?;
    /// let relay = Relay::new(store, publisher, &config)?;
    /// relay.check_duplicate_window().await?; // a window shorter than the republish window: refused
    /// let workers = relay.spawn();
    /// // ... on shutdown:
    /// workers.shutdown().await;
    /// # Ok(()) }
    /// ```
    pub fn spawn(&self) -> RelayHandle {
        let (stop, stopped) = watch::channel(false);
        let supervision = Arc::new(supervisor::Supervision::default());
        let workers = (0..self.shared.config.workers)
            .map(|n| {
                let shared = Arc::clone(&self.shared);
                let running = supervisor::Running::start(&supervision);
                tokio::spawn(supervisor::supervise(shared, running, n, stopped.clone()))
            })
            .collect();
        let monitor = RelayMonitor::new(
            self.shared.config.workers,
            supervision,
            Arc::clone(&self.shared) as Arc<dyn supervisor::BrokerCheck>,
        );
        let mut background = vec![tokio::spawn(housekeeping::run(
            Arc::clone(&self.shared),
            stopped.clone(),
        ))];
        if self.shared.config.wake_up == crate::config::WakeUp::Listen {
            background.push(tokio::spawn(wake::listen(
                Arc::clone(&self.shared),
                stopped,
            )));
        }
        RelayHandle {
            stop,
            monitor,
            workers,
            background,
            shutdown_timeout: self.shared.config.shutdown_timeout,
            totals: Box::new({
                let shared = Arc::clone(&self.shared);
                move || shared.totals.snapshot()
            }),
        }
    }
}

/// How the relay's shutdown ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct RelayShutdownReport {
    /// Every worker finished its batches in flight within the deadline, and no worker panicked
    /// during the relay's life.
    pub graceful: bool,
    /// Workers aborted at the deadline; their claimed rows return after the lease.
    pub aborted: usize,
    /// Worker panics during the relay's life (each worker was restarted).
    pub worker_panics: u64,
    /// Counts over the relay's life.
    pub totals: RelayTotals,
}

/// The running relay. [`shutdown`](Self::shutdown) stops it gracefully; dropping the handle
/// stops it the same way without waiting.
pub struct RelayHandle {
    stop: watch::Sender<bool>,
    monitor: RelayMonitor,
    workers: Vec<JoinHandle<()>>,
    background: Vec<JoinHandle<()>>,
    shutdown_timeout: Duration,
    totals: Box<dyn Fn() -> RelayTotals + Send + Sync>,
}

impl std::fmt::Debug for RelayHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayHandle")
            .field("health", &self.monitor.health())
            .field("totals", &(self.totals)())
            .finish_non_exhaustive()
    }
}

impl RelayHandle {
    /// Counts since the relay started.
    pub fn totals(&self) -> RelayTotals {
        (self.totals)()
    }

    /// The workers now: how many run, how many panics there were.
    pub fn health(&self) -> RelayWorkers {
        self.monitor.health()
    }

    /// A cloneable view of [`health`](Self::health), for a health endpoint.
    pub fn monitor(&self) -> RelayMonitor {
        self.monitor.clone()
    }

    /// Graceful shutdown with `relay.shutdown-timeout` as the deadline.
    pub async fn shutdown(self) -> RelayShutdownReport {
        let timeout = self.shutdown_timeout;
        self.shutdown_within(timeout).await
    }

    /// Stops claiming, lets in-flight batches finish (publish and mark) until `deadline`,
    /// then aborts what is left (those rows become claimable when their lease ends).
    pub async fn shutdown_within(self, deadline: Duration) -> RelayShutdownReport {
        let _ = self.stop.send(true);
        for task in &self.background {
            task.abort();
        }
        // A deadline too far for the clock has no end: every worker is waited for.
        let until = tokio::time::Instant::now().checked_add(deadline);
        let mut aborted = 0;
        for mut worker in self.workers {
            let finished = match until {
                Some(until) => tokio::time::timeout_at(until, &mut worker).await.is_ok(),
                None => {
                    // A worker's panic is counted by the monitor, below.
                    let _ = (&mut worker).await;
                    true
                }
            };
            if !finished {
                worker.abort();
                aborted += 1;
            }
        }
        let worker_panics = self.monitor.health().worker_panics;
        RelayShutdownReport {
            graceful: aborted == 0 && worker_panics == 0,
            aborted,
            worker_panics,
            totals: (self.totals)(),
        }
    }

    /// Aborts every task at once, as a crash would (tests, emergency stop). Claimed rows
    /// become claimable again when their lease ends.
    pub fn abort(self) {
        for task in self.workers.iter().chain(&self.background) {
            task.abort();
        }
    }
}
