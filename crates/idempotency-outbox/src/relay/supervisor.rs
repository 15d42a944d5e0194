//! Keeping workers alive: a worker whose task panicked (outside a publish, which the worker
//! catches itself) is counted, logged and restarted, and health checks can see it.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering as AtomicOrdering};
use std::time::Duration;

use futures_util::FutureExt;
use tokio::sync::watch;

use super::{Shared, worker};
use crate::metrics;
use crate::publisher::{BrokerHealth, Publisher};
use crate::store::{Housekeeping, RelayStore};

/// Pause before a panicked worker is restarted, so a panic on every batch does not spin.
const RESTART_DELAY: Duration = Duration::from_secs(1);

/// The relay's workers, as a health check sees them (serialized with the same field names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct RelayWorkers {
    /// Workers started (`relay.workers`).
    pub workers: usize,
    /// Workers running now: fewer while a panicked worker waits for its restart, or after
    /// the relay stopped.
    pub running: usize,
    /// Worker panics since the relay started; each worker was restarted.
    pub worker_panics: u64,
}

impl RelayWorkers {
    /// Every worker is running.
    pub fn all_running(&self) -> bool {
        self.running == self.workers
    }
}

/// A cheap, cloneable view of a running relay's health, for health endpoints: its workers
/// ([`health`](Self::health)) and its publisher's broker ([`broker_health`](Self::broker_health)).
#[derive(Clone)]
pub struct RelayMonitor {
    workers: usize,
    state: Arc<Supervision>,
    broker: Arc<dyn BrokerCheck>,
}

impl std::fmt::Debug for RelayMonitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayMonitor")
            .field("workers", &self.workers)
            .field("state", &self.state)
            .field("destination", &self.broker.destination())
            .finish()
    }
}

/// The relay's publisher, its type erased: what [`RelayMonitor`] asks about the broker.
pub(super) trait BrokerCheck: Send + Sync + 'static {
    fn destination(&self) -> &str;
    fn check(&self) -> Pin<Box<dyn Future<Output = BrokerHealth> + Send + '_>>;
}

impl<S: Send + Sync + 'static, P: Publisher> BrokerCheck for Shared<S, P> {
    fn destination(&self) -> &str {
        self.publisher.destination()
    }

    fn check(&self) -> Pin<Box<dyn Future<Output = BrokerHealth> + Send + '_>> {
        Box::pin(self.publisher.health())
    }
}

impl RelayMonitor {
    pub(super) fn new(
        workers: usize,
        state: Arc<Supervision>,
        broker: Arc<dyn BrokerCheck>,
    ) -> Self {
        Self {
            workers,
            state,
            broker,
        }
    }

    /// The relay's publisher's label (`nats`, `rabbitmq`, `log`...).
    pub fn destination(&self) -> &str {
        self.broker.destination()
    }

    /// Whether the publisher's broker can be reached now ([`Publisher::health`]). Unbounded
    /// as the publisher makes it: give it a timeout.
    pub async fn broker_health(&self) -> BrokerHealth {
        self.broker.check().await
    }

    /// The workers now.
    pub fn health(&self) -> RelayWorkers {
        RelayWorkers {
            workers: self.workers,
            running: self.state.running.load(AtomicOrdering::Relaxed),
            worker_panics: self.state.panics(),
        }
    }
}

/// Counts shared by the supervisors of one spawned relay.
#[derive(Debug, Default)]
pub(super) struct Supervision {
    running: AtomicUsize,
    panics: AtomicU64,
}

impl Supervision {
    pub(super) fn panics(&self) -> u64 {
        self.panics.load(AtomicOrdering::Relaxed)
    }
}

/// One worker counted as running, from its spawn until it ends, panics or is aborted.
#[derive(Debug)]
pub(super) struct Running {
    state: Arc<Supervision>,
    counted: bool,
}

impl Running {
    /// Counts a worker about to be spawned.
    pub(super) fn start(state: &Arc<Supervision>) -> Self {
        state.running.fetch_add(1, AtomicOrdering::Relaxed);
        Self {
            state: Arc::clone(state),
            counted: true,
        }
    }

    fn set(&mut self, running: bool) {
        if running != self.counted {
            if running {
                self.state.running.fetch_add(1, AtomicOrdering::Relaxed);
            } else {
                self.state.running.fetch_sub(1, AtomicOrdering::Relaxed);
            }
            self.counted = running;
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.set(false);
    }
}

/// Runs worker `n` until the relay stops, restarting it after a panic.
pub(super) async fn supervise<S, P>(
    shared: Arc<Shared<S, P>>,
    mut running: Running,
    n: usize,
    mut stop: watch::Receiver<bool>,
) where
    S: RelayStore + Housekeeping,
    P: Publisher,
{
    loop {
        running.set(true);
        let run = AssertUnwindSafe(worker::work(Arc::clone(&shared), n, stop.clone()));
        let outcome = run.catch_unwind().await;
        running.set(false);
        let Err(panic) = outcome else {
            return;
        };
        running.state.panics.fetch_add(1, AtomicOrdering::Relaxed);
        metrics::worker_panicked();
        tracing::error!(
            worker = n,
            panic = %worker::panic_text(panic.as_ref()),
            "outbox relay worker panicked; restarting it (its claimed rows return after the lease)"
        );
        tokio::select! {
            () = tokio::time::sleep(RESTART_DELAY) => {}
            _ = stop.wait_for(|stopped| *stopped) => return,
        }
    }
}
